"""Finds and loads tf_rnnt's compiled op library, once, on first use."""

import glob
import os
import threading

_LOCK = threading.Lock()
_LIBRARY = None

_FIX = ("Build it for this TensorFlow with `pip install .` (or, in a source checkout, "
        "`python custom_ops/build.py`), or point TF_RNNT_LIBRARY at a built _tf_rnnt_ops*.so.")


class OpLibraryError(ImportError):
    """tf_rnnt's op library is missing or was built for another TensorFlow."""


def _candidates():
    override = os.environ.get("TF_RNNT_LIBRARY")
    if override:
        return [override]
    here = os.path.dirname(os.path.abspath(__file__))
    # Any Python ABI tag: the library depends on TensorFlow, not on the Python version.
    return sorted(glob.glob(os.path.join(here, "_tf_rnnt_ops*.so")))


def _built_for(path):
    info = os.path.join(os.path.dirname(path), "_build_info.txt")
    try:
        with open(info) as f:
            return dict(line.strip().split("=", 1) for line in f if "=" in line).get("tensorflow")
    except OSError:
        return None


def library_path():
    """Path of the op library that would be loaded, or None."""
    candidates = _candidates()
    return candidates[0] if candidates else None


def load():
    """Returns the loaded op module; raises OpLibraryError with the fix when it cannot."""
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
        built_for = _built_for(path)
        if built_for is not None and built_for != tf.__version__:
            raise OpLibraryError(
                f"tf_rnnt's op library {path} was built for TensorFlow {built_for}, but "
                f"TensorFlow {tf.__version__} is installed. {_FIX}")
        try:
            _LIBRARY = tf.load_op_library(path)
        except (tf.errors.NotFoundError, OSError) as e:
            raise OpLibraryError(
                f"tf_rnnt's op library {path} does not load with TensorFlow {tf.__version__} "
                f"({e}). {_FIX}") from e
        return _LIBRARY
