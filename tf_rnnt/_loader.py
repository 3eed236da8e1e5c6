"""Finds and loads tf_rnnt's compiled op library, once, on first use."""

import glob
import json
import os
import threading
import warnings

_LOCK = threading.Lock()
_LIBRARY = None

_FIX = (
    "Install the tf_rnnt wheel built for this TensorFlow, or build it for this TensorFlow with "
    "`pip install --no-build-isolation .` (in a source checkout also "
    "`python custom_ops/build.py`), "
    "or point TF_RNNT_LIBRARY at a built _tf_rnnt_ops*.so."
)
_GPU_FIX = ("For GPU kernels install a tf_rnnt wheel built with CUDA, or rebuild from source with "
            "nvcc on PATH (or CUDA_HOME set): `pip install --no-build-isolation .`.")
# Ops whose GPU kernels a CUDA build registers.
OPS = ("TfRnntLatticeLoss", "TfRnntLogitsToLattice", "TfRnntLogitsToLatticeGrad",
       "TfRnntJointLattice", "TfRnntJointLatticeGrad", "TfRnntTdtLatticeLoss", "TfRnntCheck")


class OpLibraryError(ImportError):
    """tf_rnnt's op library is missing or was built for another TensorFlow."""


def _candidates():
    override = os.environ.get("TF_RNNT_LIBRARY")
    if override:
        return [override]
    here = os.path.dirname(os.path.abspath(__file__))
    # Any Python ABI tag: the library depends on TensorFlow, not on the Python version.
    return sorted(glob.glob(os.path.join(here, "_tf_rnnt_ops*.so")))


def _read_build_info(path):
    try:
        with open(os.path.join(os.path.dirname(path), "_build_info.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _minor(version):
    return version.split(".")[:2]


def library_path():
    """Path of the op library that would be loaded, or None."""
    candidates = _candidates()
    return candidates[0] if candidates else None


def build_info():
    """What the op library was built with and for, read from its `_build_info.json`.

    Does not load the library.

    Returns:
      A dict: `tensorflow` (the TensorFlow version it was compiled against), `cuda` (bool:
      CUDA kernels built in), `cuda_archs` (e.g. `["sm_80", "sm_90"]`), `cuda_ptx` (the
      embedded PTX, e.g. `"compute_90"`, or None), `cuda_version`, `cudart` (`"static"`),
      `nvcc`, `cxx`, `cxx_version` (compilers and their versions), `cpu_flags`, `platform`,
      and `library` (the library's path).

    Raises:
      OpLibraryError: no op library, or no build record next to it.
    """
    path = library_path()
    if path is None or not os.path.exists(path):
        raise OpLibraryError(f"tf_rnnt's op library (_tf_rnnt_ops.so) was not found. {_FIX}")
    info = _read_build_info(path)
    if info is None:
        raise OpLibraryError(f"tf_rnnt's op library {path} has no readable _build_info.json next "
                             f"to it. {_FIX}")
    return dict(info, library=path)


def gpu_kernel_ops():
    """Names of the tf_rnnt ops that have a GPU kernel registered in TensorFlow's registry."""
    from tensorflow.python.framework import kernels

    return [
        op
        for op in OPS
        if any(k.device_type == "GPU" for k in kernels.get_registered_kernels_for_op(op).kernel)
    ]


def _warn_if_gpu_unused(tf, path):
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return
    try:
        has_gpu_kernels = bool(gpu_kernel_ops())
    except (ImportError, AttributeError):  # registry API moved: fall back to the build record
        has_gpu_kernels = bool((_read_build_info(path) or {}).get("cuda", True))
    if not has_gpu_kernels:
        warnings.warn(
            f"TensorFlow sees {len(gpus)} GPU(s), but tf_rnnt's op library {path} has CPU kernels "
            f"only, so tf_rnnt's ops run on the CPU. {_GPU_FIX}", RuntimeWarning)


def load():
    """Returns the loaded op module; raises OpLibraryError with the fix when it cannot.

    The first successful load warns (once) when TensorFlow sees a GPU but the library has no
    GPU kernels.
    """
    global _LIBRARY
    if _LIBRARY is not None:
        return _LIBRARY
    with _LOCK:
        if _LIBRARY is not None:
            return _LIBRARY
        import tensorflow as tf

        path = library_path()
        if path is None or not os.path.exists(path):
            raise OpLibraryError(f"tf_rnnt's op library (_tf_rnnt_ops.so) was not found. {_FIX}")
        built_for = (_read_build_info(path) or {}).get("tensorflow")
        # Patch releases of one TensorFlow minor version keep the C++ ABI the library uses.
        if built_for is not None and _minor(built_for) != _minor(tf.__version__):
            from tf_rnnt import __version__

            major, minor = _minor(tf.__version__)
            raise OpLibraryError(
                f"tf_rnnt's op library {path} was built for TensorFlow {built_for}, but "
                f"TensorFlow {tf.__version__} is installed. {_FIX} (tf_rnnt's wheel for TensorFlow "
                f"{major}.{minor} is version {__version__}.{major}{int(minor):02d}.)")
        try:
            library = tf.load_op_library(path)
        except (tf.errors.NotFoundError, OSError) as e:
            raise OpLibraryError(
                f"tf_rnnt's op library {path} does not load with TensorFlow {tf.__version__} "
                f"({e}). {_FIX}") from e
        _warn_if_gpu_unused(tf, path)
        _LIBRARY = library
        return _LIBRARY
