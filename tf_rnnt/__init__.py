"""tf_rnnt: memory-efficient RNN-Transducer training for TensorFlow and Keras.

Public API:
  lattice_loss, logits_to_lattice, rnnt_loss: the compiled RNN-T loss ops.
  joint_lattice, flash_rnnt_loss: the fused, tiled joint ("Flash RNN-T").
  samplewise_rnnt_loss: sample-wise RNN-T in pure TensorFlow.
  tdt_loss, tdt_lattice_loss, flash_tdt_loss: the compiled TDT (Token-and-Duration Transducer)
    loss, on full logits, on a lattice, and fused and tiled from the joint's inputs.
  reference: the pure-TensorFlow oracle (full logits, autodiff).
  keras: FlashRNNTLoss, RNNTLoss and the RNNTJoint layer.
  decoding, export: transducer decoding (greedy, beam) and streaming export (SavedModel, TFLite).
  build_info, library_available, xla_kernels_available: what the op library was built with;
    whether it loads; whether it has XLA kernels for the visible devices.
"""

import importlib
import sys
import warnings

__version__ = "0.1.0"

_LAZY = {
    "lattice_loss": "tf_rnnt.ops",
    "logits_to_lattice": "tf_rnnt.ops",
    "rnnt_loss": "tf_rnnt.ops",
    "joint_lattice": "tf_rnnt.ops",
    "flash_rnnt_loss": "tf_rnnt.ops",
    "samplewise_rnnt_loss": "tf_rnnt.samplewise",
    "tdt_loss": "tf_rnnt.tdt",
    "flash_tdt_loss": "tf_rnnt.tdt",
    "tdt_lattice_loss": "tf_rnnt.tdt",
    "SecondOrderGradientError": "tf_rnnt._contract",
    "build_info": "tf_rnnt._loader",
    "library_available": "tf_rnnt.ops",
    "xla_kernels_available": "tf_rnnt.ops",
}
_SUBMODULES = ("reference", "keras", "ops", "samplewise", "tdt", "decoding", "export")

__all__ = sorted(_LAZY) + list(_SUBMODULES)


def _register_ops():
    # The ops are registered at import, so that a SavedModel or graph that uses them loads
    # after `import tf_rnnt` (and the first load never happens inside a traced function).
    # Without a usable library, the first call of an op raises the error with the fix.
    from tf_rnnt import _loader

    try:
        _loader.load()
    except _loader.OpLibraryError:
        pass


def _register_keras_classes():
    # TensorFlow imports Keras, so Keras is loaded here whenever the op library is. Importing
    # tf_rnnt.keras then fills Keras' serialization registry (register_keras_serializable), so a
    # `.keras` file that names `tf_rnnt>RNNTJoint` loads after `import tf_rnnt`.
    if "keras" not in sys.modules:
        return
    try:
        importlib.import_module("tf_rnnt.keras")
    except Exception as error:  # a broken tf_rnnt.keras must not break `import tf_rnnt`
        warnings.warn(f"tf_rnnt: could not register its Keras classes: {error!r}")


_register_ops()
_register_keras_classes()


def __getattr__(name):
    # Lazy: importing tf_rnnt must not import Keras (or build anything) until it is used.
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"tf_rnnt.{name}")
    raise AttributeError(f"module 'tf_rnnt' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
