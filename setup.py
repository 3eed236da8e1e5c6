"""tf_rnnt: memory-efficient RNN-Transducer training for TensorFlow and Keras.

`pip install --no-build-isolation .` builds the op library against the TensorFlow already
installed (CPU kernels, plus CUDA kernels when nvcc is found; see custom_ops/build.py).
Without --no-build-isolation pip builds against the newest TensorFlow in an isolated
environment, which only loads if that is also the TensorFlow you run.
"""

import os
import subprocess
import sys

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithOps(build_py):
    """Copies the Python sources, then compiles _tf_rnnt_ops.so next to them."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            out = os.path.join(HERE, "tf_rnnt", "_tf_rnnt_ops.so")
        else:
            out = os.path.join(os.path.abspath(self.build_lib), "tf_rnnt", "_tf_rnnt_ops.so")
        subprocess.check_call([sys.executable, os.path.join(HERE, "custom_ops", "build.py"),
                               "--out", out])


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # platform wheel: it carries a compiled library


setup(
    name="tf_rnnt",
    version="0.1.0",
    description="Memory-efficient RNN-Transducer loss and joint for TensorFlow/Keras "
                "(Flash RNN-T custom op, sample-wise RNN-T)",
    long_description=open(os.path.join(HERE, "README.md")).read() if os.path.exists(
        os.path.join(HERE, "README.md")) else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tf_rnnt", "tf_rnnt.*"]),
    python_requires=">=3.9",
    install_requires=["tensorflow>=2.17,<2.22", "keras>=3", "numpy"],
    extras_require={"test": ["pytest", "hypothesis"], "audio": ["tensorflow-io"]},
    cmdclass={"build_py": BuildPyWithOps},
    distclass=BinaryDistribution,
    zip_safe=False,
)
