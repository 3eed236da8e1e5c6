"""Packaging: top-level names, the build record, GPU kernel registration (the joint ops' int32
inputs in host memory), the TensorFlow pin, the isolated-build message and the
GPU-but-CPU-only-library warning.

The wheel job (tests/run_wheel.sh) sets TF_RNNT_EXPECT_WHEEL=1 and runs this file against the
installed binary wheel; there the wheel-specific tests run, elsewhere they are skipped.
"""

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf
from rnnt_testing import REPO_ROOT

import tf_rnnt
from tf_rnnt import _loader

IN_WHEEL_JOB = os.environ.get("TF_RNNT_EXPECT_WHEEL") == "1"
wheel_only = pytest.mark.skipif(not IN_WHEEL_JOB,
                                reason="checks the installed binary wheel (tests/run_wheel.sh)")
needs_source = pytest.mark.skipif(not os.path.exists(os.path.join(REPO_ROOT, "custom_ops")),
                                  reason="needs the source tree's custom_ops/")
WHEEL_ARCHS = ["sm_80", "sm_86", "sm_89", "sm_90"]


def _minor(version):
    return tuple(int(p) for p in version.split(".")[:2])


def _run_python(code, **env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, **env))


def test_top_level_names():
    assert {"build_info", "library_available"} <= set(tf_rnnt.__all__)
    assert tf_rnnt.library_available() is True
    info = tf_rnnt.build_info()
    assert {"tensorflow", "cuda", "cuda_archs", "cuda_ptx", "cuda_version", "nvcc", "cxx",
            "cxx_version", "cpu_flags", "platform", "library"} <= set(info)
    assert os.path.samefile(info["library"], _loader.library_path())
    assert _minor(info["tensorflow"]) == _minor(tf.__version__)
    assert "-mavx2" not in info["cpu_flags"] or os.environ.get("TF_RNNT_CPU_FLAGS")


def test_build_record_matches_kernel_registry():
    # TensorFlow's kernel registry is the independent witness of what the library registered.
    tf_rnnt.library_available()
    info = tf_rnnt.build_info()
    gpu_ops = _loader.gpu_kernel_ops()
    if info["cuda"]:
        assert gpu_ops == list(_loader.OPS)
        assert info["cuda_archs"] and info["cuda_ptx"].startswith("compute_")
        assert info["cuda_version"] and info["nvcc"]
    else:
        assert gpu_ops == []
        assert info["cuda_archs"] == [] and info["cuda_ptx"] is None


def test_joint_gpu_kernels_take_every_int32_input_in_host_memory():
    # The joint ops upload their labels and lengths themselves (upload_cuda): an int32 input in
    # device memory would make TensorFlow copy it first, and the op would wait for that copy.
    tf_rnnt.library_available()
    if not tf_rnnt.build_info()["cuda"]:
        pytest.skip("the op library has no GPU kernels (built without CUDA)")
    from tensorflow.python.framework import kernels, op_def_registry

    for op in ("TfRnntJointLattice", "TfRnntJointLatticeGrad"):
        int32_inputs = {arg.name for arg in op_def_registry.get(op).input_arg
                        if arg.type == tf.int32.as_datatype_enum}
        gpu_kernels = [k for k in kernels.get_registered_kernels_for_op(op).kernel
                       if k.device_type == "GPU"]
        assert len(gpu_kernels) == 3  # float32, float16, bfloat16
        for kernel in gpu_kernels:
            assert set(kernel.host_memory_arg) == int32_inputs, (op, list(kernel.host_memory_arg))


def _imported_distribution():
    """The installed tf_rnnt distribution that provides the imported package, or None."""
    try:
        dist = importlib.metadata.distribution("tf_rnnt")
    except importlib.metadata.PackageNotFoundError:
        return None
    package_dir = os.path.dirname(os.path.abspath(tf_rnnt.__file__))
    override = os.environ.get("TF_RNNT_LIBRARY")
    if override and not os.path.samefile(os.path.dirname(os.path.abspath(override)), package_dir):
        return None  # the metadata describes another build than the library in use
    installed = dist.locate_file("tf_rnnt/__init__.py")
    if os.path.exists(installed) and os.path.samefile(installed, tf_rnnt.__file__):
        return dist
    direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
    source = direct_url.get("url", "").replace("file://", "", 1)
    if direct_url.get("dir_info", {}).get("editable") and source and os.path.samefile(
            source, os.path.dirname(package_dir)):
        return dist
    return None


def test_tensorflow_pin_matches_build():
    dist = _imported_distribution()
    if dist is None:
        pytest.skip("the imported tf_rnnt is not an installed distribution (no metadata to check)")
    requires, version = dist.requires or [], dist.version
    major, minor = _minor(tf_rnnt.build_info()["tensorflow"])
    pin = f">={major}.{minor},<{major}.{minor + 1}"
    for dist, extra in (("tensorflow", "tensorflow"), ("tensorflow-cpu", "tensorflow-cpu")):
        matching = [r for r in requires if r.startswith(dist + "<") or r.startswith(dist + ">")]
        assert len(matching) == 1, requires
        spec, marker = matching[0].split(";")
        assert sorted(spec[len(dist):].split(",")) == sorted(pin.split(",")), matching
        assert f'extra == "{extra}"' in marker
    # The base requirements never pull a TensorFlow distribution (tensorflow-cpu users).
    assert not [r for r in requires if r.startswith("tensorflow") and "extra ==" not in r]
    if IN_WHEEL_JOB:
        assert version.split(".")[3] == f"{major}{minor:02d}", version


@needs_source
def test_isolated_build_stops_with_the_working_command():
    # What pip's build isolation does to the backend: TensorFlow cannot be imported.
    result = _run_python("""
        import sys
        class HideTensorFlow:
            def find_spec(self, name, path=None, target=None):
                if name == "tensorflow" or name.startswith("tensorflow."):
                    raise ModuleNotFoundError(name)
        sys.meta_path.insert(0, HideTensorFlow())
        sys.path.insert(0, "custom_ops")
        import build_backend
        build_backend.get_requires_for_build_wheel()
        print("no error")
    """, PYTHONPATH="")
    assert result.returncode == 1, result
    assert "no error" not in result.stdout
    assert "pip install --no-build-isolation ." in result.stderr
    assert "Traceback" not in result.stderr


@needs_source
def test_backend_passes_when_tensorflow_is_importable():
    result = _run_python("""
        import sys
        sys.path.insert(0, "custom_ops")
        import build_backend
        print(build_backend.get_requires_for_build_wheel())
    """)
    assert result.returncode == 0, result.stderr


@needs_source
def test_default_cpu_flags_are_portable(monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "tf_rnnt_build", os.path.join(REPO_ROOT, "custom_ops", "build.py"))
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    monkeypatch.delenv("TF_RNNT_CPU_FLAGS", raising=False)
    assert not any(f in build.cpu_flags() for f in ("-mavx2", "-mfma", "-march=native"))
    monkeypatch.setenv("TF_RNNT_CPU_FLAGS", "-march=native -O2")
    assert build.cpu_flags() == ["-march=native", "-O2"]


_FAKE_GPU = """
    import json, warnings
    import numpy as np
    import tensorflow as tf
    real_list = tf.config.list_physical_devices
    def fake_list(device_type=None):
        if device_type == "GPU":
            return [tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")]
        return real_list(device_type)
    tf.config.list_physical_devices = fake_list
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import tf_rnnt  # loads the library (and warns) at import
        from tf_rnnt import _loader
        for _ in range(2):
            lattice = tf.constant(np.full((1, 2, 2, 2), -0.7, np.float32))
            tf_rnnt.lattice_loss(lattice, tf.constant([2]), tf.constant([1]))
    ours = [str(w.message) for w in caught if "CPU kernels only" in str(w.message)]
    print(json.dumps({"warnings": ours, "gpu_ops": _loader.gpu_kernel_ops()}))
"""


def test_gpu_visible_but_cpu_only_library_warns_once():
    result = _run_python(_FAKE_GPU)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    if report["gpu_ops"]:  # a CUDA build: the (simulated) GPU is used, nothing to warn about
        assert report["warnings"] == []
    else:
        assert len(report["warnings"]) == 1, report
        assert "pip install --no-build-isolation ." in report["warnings"][0]
        assert "nvcc" in report["warnings"][0]


def test_no_gpu_no_warning():
    result = _run_python("""
        import warnings
        import numpy as np
        import tensorflow as tf
        tf.config.list_physical_devices = lambda device_type=None: []
        import tf_rnnt
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lattice = tf.constant(np.full((1, 2, 2, 2), -0.7, np.float32))
            tf_rnnt.lattice_loss(lattice, tf.constant([2]), tf.constant([1]))
        print(sum("CPU kernels only" in str(w.message) for w in caught))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "0"


@wheel_only
def test_wheel_is_installed_not_the_source_tree():
    package_dir = os.path.dirname(os.path.abspath(tf_rnnt.__file__))
    assert not os.path.exists(os.path.join(package_dir, "..", "custom_ops")), package_dir
    dist = _imported_distribution()
    assert dist is not None, package_dir
    direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
    assert "dir_info" not in direct_url, direct_url  # installed from a wheel, not a source tree
    tags = [line.split(":", 1)[1].strip() for line in dist.read_text("WHEEL").splitlines()
            if line.startswith("Tag:")]
    assert tags and all(t.startswith("py3-none-manylinux_") for t in tags), tags


@wheel_only
def test_wheel_has_gpu_kernels_for_every_op():
    info = tf_rnnt.build_info()
    assert info["cuda"] is True and info["cudart"] == "static"
    assert info["cuda_archs"] == WHEEL_ARCHS and info["cuda_ptx"] == "compute_90"
    assert tf_rnnt.library_available()
    assert _loader.gpu_kernel_ops() == list(_loader.OPS)


@pytest.mark.parametrize("recorded, loads", [("patch", True), ("minor", False)])
def test_version_check_is_per_minor(tmp_path, recorded, loads):
    # A copy of the library whose build record names another patch / minor release.
    info = tf_rnnt.build_info()
    major, minor = _minor(tf.__version__)
    other = f"{major}.{minor}.97" if recorded == "patch" else f"{major}.{minor - 1}.0"
    library = tmp_path / os.path.basename(info.pop("library"))
    library.write_bytes(open(_loader.library_path(), "rb").read())
    (tmp_path / "_build_info.json").write_text(json.dumps(dict(info, tensorflow=other)))
    result = _run_python("""
        from tf_rnnt import _loader
        try:
            _loader.load()
            print("loaded")
        except _loader.OpLibraryError as e:
            print("error:", e)
    """, TF_RNNT_LIBRARY=str(library))
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    if loads:
        assert last == "loaded"
    else:
        assert last.startswith("error:") and f"built for TensorFlow {other}" in last
        assert f".{major}{minor:02d}" in last  # names the wheel version for this TensorFlow
