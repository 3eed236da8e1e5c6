"""tf_rnnt: memory-efficient RNN-Transducer training for TensorFlow and Keras.

Public API:
  lattice_loss, logits_to_lattice, rnnt_loss: the compiled RNN-T loss ops.
  joint_lattice, flash_rnnt_loss: the fused, tiled joint ("Flash RNN-T").
  samplewise_rnnt_loss: sample-wise RNN-T in pure TensorFlow.
  reference: the pure-TensorFlow oracle (full logits, autodiff).
  keras: FlashRNNTLoss, RNNTLoss and the RNNTJoint layer.
  build_info, library_available: what the op library was built with; whether it loads.
"""

import importlib

__version__ = "0.1.0"

_LAZY = {
    "lattice_loss": "tf_rnnt.ops",
    "logits_to_lattice": "tf_rnnt.ops",
    "rnnt_loss": "tf_rnnt.ops",
    "joint_lattice": "tf_rnnt.ops",
    "flash_rnnt_loss": "tf_rnnt.ops",
    "samplewise_rnnt_loss": "tf_rnnt.samplewise",
    "build_info": "tf_rnnt._loader",
    "library_available": "tf_rnnt.ops",
}
_SUBMODULES = ("reference", "keras", "ops", "samplewise")

__all__ = sorted(_LAZY) + list(_SUBMODULES)


def __getattr__(name):
    # Lazy: importing tf_rnnt must not load the op library (or Keras) until it is used.
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"tf_rnnt.{name}")
    raise AttributeError(f"module 'tf_rnnt' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
