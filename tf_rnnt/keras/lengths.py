"""Sequence lengths in Keras models: through subsampling, as masks, and for the predictor.

Public through `tf_rnnt.keras`: `conv_output_lengths`, `LengthMask`, `PredictorInput`.
"""

import keras
import tensorflow as tf

from tf_rnnt import _contract as contract

_PADDINGS = ("valid", "same", "causal")


def conv_output_lengths(lengths, kernel_size, strides, padding="valid", dilation_rate=1):
    """Frame lengths after a convolution or pooling along time, as Keras computes them.

    The length of a sample is the number of output frames its unpadded input alone would give
    with the same layer: `ceil(L / s)` for "same" and "causal" padding,
    `max(0, floor((L - d * (k - 1) - 1) / s) + 1)` for "valid" (kernel `k`, stride `s`,
    dilation `d`). Built from `keras.ops`, so it works on `keras.Input` tensors in a
    functional model as well as on tensors and NumPy arrays.

    Args:
      lengths: `[B]` int frame lengths before the layer(s).
      kernel_size: int, or a list with one entry per stacked layer.
      strides: int or list, as `kernel_size`.
      padding: "valid" (the default, as in keras.layers.Conv1D and pooling), "same" or
        "causal", or a list.
      dilation_rate: int or list.

    Returns:
      `[B]` lengths after the layer(s), in the dtype of `lengths`.

    Example:

    ```python
    x = keras.layers.Conv1D(64, 3, strides=2, padding="causal")(features)
    x = keras.layers.Conv1D(64, 3, strides=2, padding="causal")(x)
    lengths = tf_rnnt.keras.conv_output_lengths(feature_lengths, [3, 3], [2, 2], "causal")
    ```
    """
    settings = [kernel_size, strides, padding, dilation_rate]
    num_layers = max(len(s) if isinstance(s, (list, tuple)) else 1 for s in settings)
    per_layer = []
    for s in settings:
        if not isinstance(s, (list, tuple)):
            s = [s] * num_layers
        if len(s) != num_layers:
            raise ValueError(f"conv_output_lengths: kernel_size, strides, padding and "
                             f"dilation_rate lists must have equal lengths, got {settings}.")
        per_layer.append(s)
    for k, s, p, d in zip(*per_layer):
        k = contract.check_positive_int(k, "kernel_size", "conv_output_lengths", allow_none=False)
        s = contract.check_positive_int(s, "strides", "conv_output_lengths", allow_none=False)
        d = contract.check_positive_int(d, "dilation_rate", "conv_output_lengths",
                                        allow_none=False)
        p = contract.check_choice(p, _PADDINGS, "padding", "conv_output_lengths")
        if p == "valid":
            lengths = keras.ops.maximum((lengths - d * (k - 1) - 1) // s + 1, 0)
        else:
            lengths = (lengths + s - 1) // s
    return lengths


@keras.saving.register_keras_serializable(package="tf_rnnt")
class LengthMask(keras.layers.Layer):
    """Attaches the Keras mask of explicit frame lengths to a sequence (and zeros its padding).

    Convolutions and other layers that change the number of frames drop the Keras mask; this
    layer puts it back from lengths computed with `conv_output_lengths`, so masking-aware
    layers after it (LSTM, Bidirectional, attention, `RNNTJoint`) see the valid frames.

    Call: `LengthMask()([x, lengths])` with `x` `[B, T, ...]` and `lengths` `[B]` int.
    Returns `x` (padded frames set to 0 unless `zero_padding=False`) with the mask
    `[B, T]`, true on frames `t < lengths[b]`.

    Args:
      zero_padding: set frames `t >= lengths[b]` to 0, so that a later convolution with
        "same" or "causal" padding reads zeros there, as it would for the unpadded sample.
      **kwargs: `keras.layers.Layer` arguments.

    Example:

    ```python
    x = keras.layers.Conv1D(64, 3, strides=2, padding="causal")(features)
    lengths = tf_rnnt.keras.conv_output_lengths(feature_lengths, 3, 2, "causal")
    x = tf_rnnt.keras.LengthMask()([x, lengths])
    x = keras.layers.Bidirectional(keras.layers.LSTM(64, return_sequences=True))(x)
    ```
    """

    def __init__(self, zero_padding=True, **kwargs):
        super().__init__(**kwargs)
        self.zero_padding = bool(zero_padding)
        self.supports_masking = True

    def _mask(self, inputs):
        # keras.ops, as Keras also calls this on symbolic inputs with unknown T.
        x, lengths = inputs
        frames = x[(slice(None), slice(None)) + (0,) * (len(x.shape) - 2)]  # [B, T]
        positions = keras.ops.cumsum(keras.ops.ones_like(frames, dtype="int32"), axis=1) - 1
        return positions < keras.ops.expand_dims(keras.ops.cast(lengths, "int32"), 1)

    def call(self, inputs, mask=None):
        x = inputs[0]
        if not self.zero_padding:
            return tf.identity(x)
        mask = tf.reshape(self._mask(inputs), tf.concat(
            [tf.shape(x)[:2], tf.ones([tf.rank(x) - 2], tf.int32)], 0))
        return tf.where(mask, x, tf.zeros_like(x))

    def compute_mask(self, inputs, mask=None):
        return self._mask(inputs)

    def compute_output_shape(self, input_shape):
        return input_shape[0]

    def get_config(self):
        return {**super().get_config(), "zero_padding": self.zero_padding}


@keras.saving.register_keras_serializable(package="tf_rnnt")
class PredictorInput(keras.layers.Layer):
    """The predictor's input ids: blank, then the labels, with the label padding made safe.

    Call: `PredictorInput()(labels)` with `labels` `[B, U]` int ids padded at the end with
    `pad_value`. Returns `[B, U+1]` int32 `[blank, y_1, ..., y_U]`, padding replaced by the
    blank (a valid id for an Embedding), with the Keras mask `[B, U+1]` true on the blank and
    the real labels. `RNNTJoint.predictor_input()` makes one with the joint's settings.

    Args:
      blank: blank id; a negative blank counts from the end and needs `vocab_size`.
      pad_value: label padding id.
      vocab_size: V, needed only for a negative blank.
      **kwargs: `keras.layers.Layer` arguments.

    Example:

    ```python
    labels = keras.Input((None,), dtype="int32")
    ids = tf_rnnt.keras.PredictorInput()(labels)                  # [B, U+1]
    predictor = keras.layers.Embedding(V, 64)(ids)
    predictor = keras.layers.LSTM(64, return_sequences=True)(predictor)
    ```
    """

    def __init__(self, blank=0, pad_value=-1, vocab_size=None, **kwargs):
        super().__init__(**kwargs)
        owner = "PredictorInput"
        self.vocab_size = contract.check_positive_int(vocab_size, "vocab_size", owner)
        self.blank = contract.check_blank(blank, owner, self.vocab_size)
        if self.blank < 0 and self.vocab_size is None:
            raise ValueError(f"{owner}: a negative blank ({blank}) needs vocab_size.")
        self.blank_id = self.blank % self.vocab_size if self.blank < 0 else self.blank
        self.pad_value = int(pad_value)

    def _is_label(self, labels):
        return keras.ops.not_equal(keras.ops.cast(labels, "int32"), self.pad_value)

    def call(self, labels):
        ids = tf.where(self._is_label(labels), tf.cast(labels, tf.int32), self.blank_id)
        return tf.concat([tf.fill([tf.shape(ids)[0], 1], self.blank_id), ids], axis=1)

    def compute_mask(self, labels, mask=None):
        # keras.ops, as Keras also calls this on symbolic inputs with unknown U.
        is_label = self._is_label(labels)
        return keras.ops.concatenate([keras.ops.ones_like(is_label[:, :1]), is_label], axis=1)

    def compute_output_spec(self, labels):
        steps = None if labels.shape[1] is None else labels.shape[1] + 1
        return keras.KerasTensor((labels.shape[0], steps), dtype="int32")

    def get_config(self):
        return {**super().get_config(), "blank": self.blank, "pad_value": self.pad_value,
                "vocab_size": self.vocab_size}
