"""Builds tf_rnnt (pyproject.toml names the build backend, custom_ops/build_backend.py).

tf_rnnt carries a compiled op library, tf_rnnt/_tf_rnnt_ops.so, which loads only into the
TensorFlow version it was compiled against. A wheel is therefore built against the TensorFlow
installed in the build environment:

    pip install --no-build-isolation .

builds CPU kernels, plus CUDA kernels when nvcc is found (custom_ops/build.py), and records what
went in to tf_rnnt/_build_info.json (tf_rnnt.build_info()). Under pip's default build isolation
TensorFlow is not importable and the build stops at once with that command. The `tensorflow`
and `tensorflow-cpu` extras pin the TensorFlow minor version the library was built for;
scripts/build_wheel.sh builds the binary wheels, one per TensorFlow minor version, whose
version carries that minor as a last release segment (0.1.0.221 for TensorFlow 2.21).
"""

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
SUPPORTED_TF = ">=2.17,<2.22"


def package_version():
    with open(os.path.join(HERE, "tf_rnnt", "__init__.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def tensorflow_minor():
    """(major, minor) of the TensorFlow importable here, or None (e.g. building an sdist)."""
    if importlib.util.find_spec("tensorflow") is None:
        return None
    dists = getattr(importlib.metadata, "packages_distributions", dict)().get("tensorflow") or [
        "tensorflow", "tensorflow-cpu"]
    for dist in dists:
        try:
            major, minor = importlib.metadata.version(dist).split(".")[:2]
            return int(major), int(minor)
        except (importlib.metadata.PackageNotFoundError, ValueError):
            continue
    return None


def tensorflow_extras(minor):
    pin = f">={minor[0]}.{minor[1]},<{minor[0]}.{minor[1] + 1}" if minor else SUPPORTED_TF
    return {"tensorflow": [f"tensorflow{pin}"], "tensorflow-cpu": [f"tensorflow-cpu{pin}"]}


class BuildPyWithOps(build_py):
    """Copies the Python sources, then compiles _tf_rnnt_ops.so and _build_info.json beside them."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            out = os.path.join(HERE, "tf_rnnt", "_tf_rnnt_ops.so")
        else:
            out = os.path.join(os.path.abspath(self.build_lib), "tf_rnnt", "_tf_rnnt_ops.so")
        subprocess.check_call([sys.executable, os.path.join(HERE, "custom_ops", "build.py"),
                               "--out", out])


class BdistWheelAnyPython(bdist_wheel):
    """Tags the wheel py3-none-<platform>: the library uses TensorFlow's C++ API, not Python's."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # platform wheel: it carries a compiled library


TF_MINOR = tensorflow_minor()
VERSION = package_version()
if (
    os.environ.get("TF_RNNT_VERSION_WITH_TF") == "1"
):  # binary wheels: 0.1.0 for TF 2.21 -> 0.1.0.221
    if TF_MINOR is None:
        raise SystemExit("TF_RNNT_VERSION_WITH_TF=1 needs TensorFlow importable")
    VERSION += f".{TF_MINOR[0]}{TF_MINOR[1]:02d}"

setup(
    name="tf_rnnt",
    version=VERSION,
    description="Memory-efficient RNN-Transducer loss and joint for TensorFlow/Keras "
                "(Flash RNN-T custom op, sample-wise RNN-T)",
    long_description=open(os.path.join(HERE, "README.md")).read() if os.path.exists(
        os.path.join(HERE, "README.md")) else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=find_packages(include=["tf_rnnt", "tf_rnnt.*"]),
    python_requires=">=3.9",
    install_requires=["keras>=3", "numpy"],
    extras_require={**tensorflow_extras(TF_MINOR), "test": ["pytest", "hypothesis"],
                    "audio": ["tensorflow-io"]},
    classifiers=["License :: OSI Approved :: Apache Software License",
                 "Operating System :: POSIX :: Linux", "Programming Language :: C++",
                 "Programming Language :: Python :: 3", "Environment :: GPU :: NVIDIA CUDA"],
    cmdclass={"build_py": BuildPyWithOps, "bdist_wheel": BdistWheelAnyPython},
    distclass=BinaryDistribution,
    zip_safe=False,
)
