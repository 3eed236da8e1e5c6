"""TensorFlowASR's pure-TensorFlow RNN-T loss as a benchmark baseline (never a package
dependency).

TensorFlowASR (`pip install --no-deps --target DIR TensorFlowASR==2.1.0`) cannot be imported as a
package under Keras 3: its `__init__` patches `keras.layers.Layer` and imports Keras 2's
`engine.compile_utils`. Its loss module, `tensorflow_asr/losses/rnnt_loss.py`, needs only
`tf`, `keras` and three small helpers (`BaseLoss`, `env_util.has_devices`,
`shape_util.get_dim`), so `load()` executes that one file by its path with stand-ins for those
helpers, and restores `sys.modules` afterwards: nothing of TensorFlowASR stays importable and
Keras is not patched.

`TFASRRNNTLoss` runs that module's `rnnt_loss` (the function `RnntLoss.call` runs: the pure-TF
loss with its hand-written gradient; it takes float32 logits and applies the log-softmax itself)
with the frame lengths from the logits' Keras mask and the label lengths from the `-1` padding,
as `keras_baselines.ReferenceRNNTLoss` does.

Where the package lives: `$TFASR_PATH`, else `<sys.prefix>/tfasr` (a `--target` install beside
the virtual environment), else anywhere on `sys.path`.
"""

import importlib.util
import os
import sys
import types

TFASR_VERSION = "2.1.0"  # the newest on the package index; its loss module loads under Keras 3
_LOSS_FILE = os.path.join("tensorflow_asr", "losses", "rnnt_loss.py")
_STUBBED = ("tensorflow_asr", "tensorflow_asr.losses", "tensorflow_asr.losses.base_loss",
            "tensorflow_asr.utils", "tensorflow_asr.utils.env_util",
            "tensorflow_asr.utils.shape_util")


def find_loss_file():
    """Path of TensorFlowASR's `losses/rnnt_loss.py`, or None when it is not installed."""
    roots = [os.environ.get("TFASR_PATH"), os.path.join(sys.prefix, "tfasr")]
    for root in roots:
        if root and os.path.isfile(os.path.join(root, _LOSS_FILE)):
            return os.path.join(root, _LOSS_FILE)
    spec = importlib.util.find_spec("tensorflow_asr")  # finds the package, does not import it
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            path = os.path.join(root, "losses", "rnnt_loss.py")
            if os.path.isfile(path):
                return path
    return None


def installed_version(loss_file):
    """The TensorFlowASR version beside `loss_file` (its dist-info), or "?"."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(loss_file)))
    for name in sorted(os.listdir(root)):
        if name.lower().startswith("tensorflowasr-") and name.endswith(".dist-info"):
            return name[len("TensorFlowASR-"):-len(".dist-info")]
    return "?"


def _stubs():
    import keras
    import tensorflow as tf

    # Keras 3 has no keras.losses.Reduction (RnntLoss's default argument reads it).
    keras_losses = types.ModuleType("keras.losses")
    keras_losses.__getattr__ = lambda name: getattr(keras.losses, name)
    keras_losses.Reduction = types.SimpleNamespace(AUTO="sum_over_batch_size",
                                                   SUM_OVER_BATCH_SIZE="sum_over_batch_size",
                                                   SUM="sum", NONE=None)
    keras_2 = types.ModuleType("keras")
    keras_2.__getattr__ = lambda name: getattr(keras, name)
    keras_2.losses = keras_losses
    package = types.ModuleType("tensorflow_asr")
    package.tf, package.keras = tf, keras_2
    package.__path__ = []
    losses = types.ModuleType("tensorflow_asr.losses")
    losses.__path__ = []
    base_loss = types.ModuleType("tensorflow_asr.losses.base_loss")

    class BaseLoss(keras.losses.Loss):
        """Stand-in for TensorFlowASR's BaseLoss (its Keras 2 reduction and length plumbing are
        not used: `TFASRRNNTLoss` calls `rnnt_loss` directly)."""

        def __init__(self, blank=0, reduction="sum_over_batch_size", name=None):
            super().__init__(reduction=reduction, name=name)
            self.blank = blank

    base_loss.BaseLoss = BaseLoss
    utils = types.ModuleType("tensorflow_asr.utils")
    utils.__path__ = []
    env_util = types.ModuleType("tensorflow_asr.utils.env_util")
    # As in TensorFlowASR's utils/env_util.py and utils/shape_util.py.
    env_util.has_devices = lambda devices: len(tf.config.list_logical_devices(devices)) > 0
    shape_util = types.ModuleType("tensorflow_asr.utils.shape_util")
    shape_util.get_dim = lambda t, i: tf.compat.dimension_value(t.shape[i]) or tf.shape(t)[i]
    utils.env_util, utils.shape_util = env_util, shape_util
    package.losses, package.utils = losses, utils
    losses.base_loss = base_loss
    return {"tensorflow_asr": package, "tensorflow_asr.losses": losses,
            "tensorflow_asr.losses.base_loss": base_loss, "tensorflow_asr.utils": utils,
            "tensorflow_asr.utils.env_util": env_util,
            "tensorflow_asr.utils.shape_util": shape_util}


_MODULE = None


def load():
    """TensorFlowASR's `rnnt_loss` module, executed from its file with stand-in helpers.

    Returns:
      The module (`rnnt_loss`, `rnnt_loss_tf`, `RnntLoss`, ...), with `tfasr_version` and
      `tfasr_file` set.

    Raises:
      ImportError: TensorFlowASR is not installed, or its loss module does not execute.
    """
    global _MODULE
    if _MODULE is not None:
        return _MODULE
    path = find_loss_file()
    if path is None:
        raise ImportError(
            f"TensorFlowASR is not installed (pip install --no-deps --target "
            f"{os.path.join(sys.prefix, 'tfasr')} TensorFlowASR=={TFASR_VERSION}, or set "
            f"TFASR_PATH)")
    saved = {name: sys.modules.get(name) for name in _STUBBED}
    sys.modules.update(_stubs())
    try:
        spec = importlib.util.spec_from_file_location("tfasr_rnnt_loss", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as e:  # any failure of the foreign module is an import failure here
        raise ImportError(f"TensorFlowASR's {path} does not load: {type(e).__name__}: {e}") from e
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    module.warp_rnnt_loss = None  # the pure-TF loss, also where warprnnt_tensorflow is installed
    module.tfasr_version = installed_version(path)
    module.tfasr_file = path
    _MODULE = module
    return module


def available():
    """(True, version) if TensorFlowASR's loss loads, else (False, why)."""
    try:
        module = load()
    except ImportError as e:
        return False, str(e)
    return True, module.tfasr_version


def tfasr_rnnt_loss(logits, labels, logit_lengths, label_lengths):
    """Per-sample costs of TensorFlowASR's pure-TF RNN-T loss (blank 0).

    Args:
      logits: `[B, T, U+1, V]` unnormalized logits (cast to float32 by the loss).
      labels: `[B, U]` int32 labels; positions past `label_lengths` are ignored.
      logit_lengths, label_lengths: `[B]` int32.

    Returns:
      `[B]` costs in the logits' dtype.
    """
    import tensorflow as tf

    module = load()
    labels = tf.cast(labels, tf.int32)
    label_lengths = tf.cast(label_lengths, tf.int32)
    # TensorFlowASR pads labels with the blank; without a GPU its scatter needs use_cpu=True
    # (as RnntLoss decides it).
    labels = tf.where(tf.sequence_mask(label_lengths, tf.shape(labels)[1]), labels, 0)
    use_cpu = not tf.config.list_logical_devices("GPU")
    return module.rnnt_loss(logits=logits, logits_length=tf.cast(logit_lengths, tf.int32),
                            labels=labels, labels_length=label_lengths, blank=0,
                            use_cpu=use_cpu)


def make_loss_class():
    """`TFASRRNNTLoss`, a Keras loss (defined on first use: this module imports no Keras)."""
    import keras
    import tensorflow as tf
    from keras_baselines import labels_and_lengths

    class TFASRRNNTLoss(keras.losses.Loss):
        """TensorFlowASR's RNN-T loss on full logits, frame lengths from their Keras mask, labels
        padded with -1. Per-sample costs with reduction=None, else their batch mean divided by
        the number of replicas (as `keras_baselines.ReferenceRNNTLoss`)."""

        def __init__(self, reduction="sum_over_batch_size"):
            super().__init__(name="tfasr_rnnt_loss", reduction=reduction)
            self.per_sample = reduction is None

        def __call__(self, y_true, y_pred, sample_weight=None):
            labels, logit_lengths, label_lengths = labels_and_lengths(y_true, y_pred)
            costs = tfasr_rnnt_loss(tf.cast(y_pred, tf.float32), labels, logit_lengths,
                                    label_lengths)
            if self.per_sample:
                return costs
            return tf.reduce_mean(costs) / tf.distribute.get_strategy().num_replicas_in_sync

    return TFASRRNNTLoss
