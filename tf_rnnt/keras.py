"""Keras 3 API: the `RNNTJoint` layer, the `FlashRNNTLoss` / `RNNTLoss` losses and the length
utilities `conv_output_lengths`, `LengthMask` and `PredictorInput`.

A transducer trained with Keras ends in an `RNNTJoint` layer and is compiled with the loss the
layer hands out, so blank and label padding are set once:

```python
joint = tf_rnnt.keras.RNNTJoint(vocab_size=V, units=320)
lattice = joint([encoder_out, predictor_out, labels, frame_lengths])   # [B, T, U+1, 2]
model = keras.Model([features, feature_lengths, labels], lattice)
model.compile(optimizer="adam", loss=joint.loss())
```

Lengths:
  * Frame lengths of `encoder_out`: the optional 4th input of `RNNTJoint` (after subsampling:
    `conv_output_lengths`), else the Keras mask of `encoder_out`. With neither, `RNNTJoint`
    raises unless built with `all_frames_valid=True`.
  * Label lengths come from padding: label entries equal to `pad_value` (default -1) are
    padding, at the end of each row.

The padded-node convention (how the loss gets the lengths): `RNNTJoint` writes
`PAD_NODE_VALUE` (+1.0) into both channels of every lattice node outside a sample's valid
rectangle (`t >= logit_length` or `u > label_length`). Real nodes hold log-probabilities, which
are never positive, so the marking is unambiguous; `FlashRNNTLoss` reads the lengths back
(`lattice_lengths`). The label channel of the last node column (`u = U`), never read by the
loss, holds `2 + blank`, so a loss given another blank fails. Lattices built without
`RNNTJoint` (e.g. with `tf_rnnt.joint_lattice`) are marked with `mark_lattice_padding`.

XLA: `model.compile(jit_compile=True)` (and Keras' "auto", which turns XLA on for a GPU model)
compiles the whole training step, these layers and losses included: the op library's XLA
kernels lower each op to an XLA custom call running the same CPU/CUDA code. With a library
without XLA kernels for the devices in use (built against a TensorFlow without the XLA FFI,
2.17, or without CUDA on a GPU machine) `RNNTJoint.supports_jit` is False, so Keras compiles a
model with an `RNNTJoint` without XLA, under "auto" and `jit_compile=True` alike (a warning
names the layer), and the fused joint stays. Under XLA without usable kernels (e.g. a
`tf.function(jit_compile=True)`, or `RNNTLoss` without `RNNTJoint`) the ops use the
pure-TensorFlow reference math (a warning names the op).
"""

import warnings

import keras
import tensorflow as tf

from tf_rnnt import _contract as contract
from tf_rnnt._keras_checks import check_pad_value as _check_pad_value
from tf_rnnt._keras_checks import (
    check_rank,
    check_same_batch,
    check_u_plus_one,
    frame_lengths_of,
    label_lengths_of,
    labels_as_int,
    missing_lengths_error,
)
from tf_rnnt._keras_lattice import BLANK_CODE as _BLANK_CODE
from tf_rnnt._keras_lattice import PAD_NODE_VALUE, lattice_lengths, mark_lattice_padding
from tf_rnnt._keras_lattice import PAD_THRESHOLD as _PAD_THRESHOLD
from tf_rnnt._keras_lengths import LengthMask, PredictorInput, conv_output_lengths

__all__ = ["RNNTJoint", "FlashRNNTLoss", "RNNTLoss", "PredictorInput", "LengthMask",
           "conv_output_lengths", "mark_lattice_padding", "lattice_lengths", "PAD_NODE_VALUE"]

_ACTIVATIONS = {"tanh": tf.tanh, "relu": tf.nn.relu, "identity": tf.identity}
_KERAS_REDUCTIONS = ("sum_over_batch_size", "sum", "mean", "mean_with_sample_weight", "none",
                     None)
_REDUCTIONS = _KERAS_REDUCTIONS + ("per_token",)


def _ops():
    # Late import: building a model (or loading tf_rnnt.keras) does not load the op library.
    from tf_rnnt import ops

    return ops


# ----------------------------------------------------------------------------------------------
# The layer.
# ----------------------------------------------------------------------------------------------
@keras.saving.register_keras_serializable(package="tf_rnnt")
class RNNTJoint(keras.layers.Layer):
    """RNN-T joint network whose output is the `[B, T, U+1, 2]` lattice, not the logits.

    Owns the joint's weights: encoder projection `encoder_kernel` `[D_enc, units]` with
    `encoder_bias` `[units]`, predictor projection `predictor_kernel` `[D_pred, units]` (no bias:
    it would add to the encoder's), and output projection `kernel` `[units, vocab_size]`,
    `bias` `[vocab_size]`. Node (b, t, u) scores
    `log_softmax(act(enc[b, t] @ encoder_kernel + encoder_bias + pred[b, u] @ predictor_kernel)
    @ kernel + bias)`, of which the layer keeps the blank and the next label through
    `tf_rnnt.joint_lattice` (tiled, recomputed in the backward pass).

    Call: `joint([encoder_out, predictor_out, labels, logit_lengths])` with `encoder_out`
    `[B, T, D_enc]`, `predictor_out` `[B, U+1, D_pred]` (the predictor run on blank followed by
    the labels, see `PredictorInput`), `labels` `[B, U]` integer ids padded at the end with
    `pad_value`, and the optional `logit_lengths` `[B]` int valid frames of `encoder_out`.
    Without `logit_lengths` the Keras mask of `encoder_out` gives the frame lengths; with
    neither the call raises ValueError, unless `all_frames_valid=True`. Returns the float32
    lattice `[B, T, U+1, 2]` with nodes outside each sample's rectangle set to
    `PAD_NODE_VALUE` (see the module docstring); train it with `joint.loss()`. The output
    carries no Keras mask.

    For decoding and export use `joint.logits(encoder_out, predictor_out)`: plain TensorFlow ops,
    no custom op in the graph.

    Args:
      vocab_size: V, including the blank.
      units: joint hidden size.
      activation: "tanh", "relu" or "identity".
      blank: blank id; negative counts from the end.
      mode: `tf_rnnt.joint_lattice` mode ("tiled" recomputes the joint in the backward pass).
      tile_size: `tf_rnnt.joint_lattice` tile size (None: chosen by the op).
      memory_budget: `tf_rnnt.joint_lattice` memory budget in bytes (None: the op's default).
      pad_value: label padding id (negative, or the blank).
      all_frames_valid: without `logit_lengths` or a mask, take every frame as valid instead of
        raising (for unpadded batches only).
      **kwargs: `keras.layers.Layer` arguments (name, dtype, trainable, ...).

    Example:

    ```python
    joint = tf_rnnt.keras.RNNTJoint(vocab_size=V, units=320)
    lattice = joint([encoder_out, predictor_out, labels, frame_lengths])
    model = keras.Model([features, feature_lengths, labels], lattice)
    model.compile(optimizer="adam", loss=joint.loss())
    ```
    """

    def __init__(self, vocab_size, units, activation="tanh", blank=0, mode="tiled",
                 tile_size=None, memory_budget=None, pad_value=-1, all_frames_valid=False,
                 **kwargs):
        super().__init__(**kwargs)
        owner = "RNNTJoint"
        vocab_size = contract.check_positive_int(vocab_size, "vocab_size", owner,
                                                 allow_none=False)
        if vocab_size < 2:
            raise ValueError(f"{owner}: vocab_size must be >= 2 (blank plus a label), got "
                             f"{vocab_size}.")
        self.vocab_size = vocab_size
        self.units = contract.check_positive_int(units, "units", owner, allow_none=False)
        self.activation = contract.check_choice(activation, tuple(_ACTIVATIONS), "activation",
                                                owner)
        self.blank = contract.check_blank(blank, owner, vocab_size)
        self._blank_id = self.blank % vocab_size
        self.all_frames_valid = bool(all_frames_valid)
        self.supports_masking = True  # reads the mask of encoder_out; its output has none
        self.mode = mode
        self.tile_size = tile_size
        self.memory_budget = memory_budget
        self.pad_value = _check_pad_value(pad_value, self._blank_id, vocab_size, "RNNTJoint")
        self._jit_warned = False

    @property
    def supports_jit(self):
        """Whether Keras may compile a model with this layer under XLA (read by `model.compile`).

        True exactly when `tf_rnnt.xla_kernels_available()` (the op library has XLA kernels for
        the visible devices). Elsewhere XLA would replace the fused joint by the reference math
        on the full `[B, T, U+1, V]` logits, so this is False, Keras compiles the model without
        XLA, and the first read warns.
        """
        if not self._jit_allowed:
            return False
        ops = _ops()
        if ops.xla_kernels_available():
            return True
        if not self._jit_warned:
            self._jit_warned = True
            warnings.warn(
                f"RNNTJoint '{self.name}': {ops._no_xla_kernels_reason()}, so Keras compiles "
                "this model without XLA, also under jit_compile=True (XLA would replace the "
                "fused joint by the full [B, T, U+1, V] logits). jit_compile=False keeps the "
                "fused joint.", stacklevel=2)
        return False

    @supports_jit.setter
    def supports_jit(self, value):
        # keras.layers.Layer.__init__ assigns True; assigning False turns XLA off for good.
        self._jit_allowed = bool(value)

    def loss(self, **kwargs):
        """A `FlashRNNTLoss` with this layer's blank and pad_value.

        Args:
          **kwargs: the other `FlashRNNTLoss` arguments (fastemit_lambda, clamp, reduction, ...).
        """
        return FlashRNNTLoss(blank=self._blank_id, pad_value=self.pad_value, **kwargs)

    def predictor_input(self, **kwargs):
        """A `PredictorInput` layer with this layer's blank and pad_value."""
        return PredictorInput(blank=self._blank_id, pad_value=self.pad_value, **kwargs)

    # -- weights --------------------------------------------------------------------------------
    def build(self, input_shape):
        if not isinstance(input_shape, (list, tuple)) or len(input_shape) not in (3, 4):
            raise ValueError("RNNTJoint: expects inputs [encoder_out, predictor_out, labels] or "
                             "[encoder_out, predictor_out, labels, logit_lengths], got input "
                             f"shape {input_shape}.")
        self._build_projections(input_shape[0][-1], input_shape[1][-1])

    def _build_projections(self, encoder_dim, predictor_dim):
        if encoder_dim is None or predictor_dim is None:
            raise ValueError("RNNTJoint: the last dimension of `encoder_out` and "
                             "`predictor_out` must be known.")
        self.encoder_kernel = self.add_weight(name="encoder_kernel",
                                              shape=(encoder_dim, self.units),
                                              initializer="glorot_uniform")
        self.encoder_bias = self.add_weight(name="encoder_bias", shape=(self.units,),
                                            initializer="zeros")
        self.predictor_kernel = self.add_weight(name="predictor_kernel",
                                                shape=(predictor_dim, self.units),
                                                initializer="glorot_uniform")
        self.kernel = self.add_weight(name="kernel", shape=(self.units, self.vocab_size),
                                      initializer="glorot_uniform")
        self.bias = self.add_weight(name="bias", shape=(self.vocab_size,), initializer="zeros")
        self.built = True

    def _weight(self, variable):
        return tf.cast(variable, self.compute_dtype)

    def _project(self, encoder_out, predictor_out):
        encoder = tf.einsum("btd,dh->bth", tf.cast(encoder_out, self.compute_dtype),
                            self._weight(self.encoder_kernel)) + self._weight(self.encoder_bias)
        predictor = tf.einsum("bud,dh->buh", tf.cast(predictor_out, self.compute_dtype),
                              self._weight(self.predictor_kernel))
        return encoder, predictor

    # -- training: the lattice ----------------------------------------------------------------
    def _split(self, inputs, mask):
        if not isinstance(inputs, (list, tuple)) or len(inputs) not in (3, 4):
            raise ValueError("RNNTJoint: expects inputs [encoder_out, predictor_out, labels] or "
                             "[encoder_out, predictor_out, labels, logit_lengths].")
        lengths = inputs[3] if len(inputs) == 4 else None
        encoder_mask = mask[0] if isinstance(mask, (list, tuple)) else None
        if lengths is None and encoder_mask is None and not self.all_frames_valid:
            raise missing_lengths_error(
                "encoder_out", "RNNTJoint",
                "pass them as the 4th input, joint([encoder_out, predictor_out, labels, "
                "logit_lengths]), or give `encoder_out` a Keras mask (tf_rnnt.keras.LengthMask).")
        return inputs[:3], lengths, encoder_mask

    def call(self, inputs, mask=None):
        owner = "RNNTJoint"
        (encoder_out, predictor_out, labels), lengths, encoder_mask = self._split(inputs, mask)
        encoder_out, predictor_out = tf.convert_to_tensor(encoder_out), tf.convert_to_tensor(
            predictor_out)
        check_rank(encoder_out, 3, "encoder_out", owner, "[B, T, D_enc]")
        check_rank(predictor_out, 3, "predictor_out", owner, "[B, U+1, D_pred]")
        labels = tf.convert_to_tensor(labels)
        if labels.dtype.is_floating:
            raise ValueError(f"{owner}: `labels` must be an integer tensor, got dtype "
                             f"{labels.dtype.name} (declare keras.Input(..., dtype='int32')).")
        labels = labels_as_int(labels, "labels", owner)
        asserts = check_same_batch(owner, ("encoder_out", encoder_out),
                                    ("predictor_out", predictor_out), ("labels", labels))
        asserts.append(check_u_plus_one(labels, predictor_out, 1, "predictor_out", owner))
        logit_lengths, checks = frame_lengths_of(lengths, encoder_mask, encoder_out,
                                               "encoder_out", owner)
        clean_labels, label_lengths, more = label_lengths_of(
            labels, self.pad_value, self._blank_id, self.vocab_size, "labels", owner)

        with tf.control_dependencies(asserts + checks + more):
            encoder, predictor = self._project(encoder_out, predictor_out)
            lattice = _ops().joint_lattice(
                encoder, predictor, self._weight(self.kernel), self._weight(self.bias),
                clean_labels, logit_lengths, label_lengths, blank=self._blank_id,
                activation=self.activation, mode=self.mode, tile_size=self.tile_size,
                memory_budget=self.memory_budget)
        lattice = mark_lattice_padding(lattice, logit_lengths, label_lengths)
        # The blank code: the label channel at u = U is never read by the loss.
        num_nodes = tf.shape(lattice)[2]
        is_code = (tf.range(num_nodes) == num_nodes - 1)[:, None] & tf.constant([False, True])
        return tf.where(is_code, _BLANK_CODE + self._blank_id, lattice)

    def compute_mask(self, inputs, mask=None):
        # The lengths live in the lattice; a [B, T] mask would be misapplied to [B] losses.
        return None

    def compute_output_spec(self, inputs, mask=None):
        (encoder_out, _, labels), _, _ = self._split(inputs, mask)
        num_labels = labels.shape[1]
        return keras.KerasTensor(
            (encoder_out.shape[0], encoder_out.shape[1],
             None if num_labels is None else num_labels + 1, 2), dtype="float32")

    # -- decoding / export: plain TensorFlow -----------------------------------------------------
    def logits(self, encoder_out, predictor_out):
        """Full joint logits with plain TensorFlow ops (no custom op), for decoding and export.

        Args:
          encoder_out: `[B, T, D_enc]`.
          predictor_out: `[B, U+1, D_pred]`.

        Returns:
          `[B, T, U+1, vocab_size]` logits in the layer's compute dtype.
        """
        encoder_out = tf.convert_to_tensor(encoder_out)
        predictor_out = tf.convert_to_tensor(predictor_out)
        if not self.built:
            self._build_projections(encoder_out.shape[-1], predictor_out.shape[-1])
        encoder, predictor = self._project(encoder_out, predictor_out)
        hidden = _ACTIVATIONS[self.activation](encoder[:, :, None, :] + predictor[:, None, :, :])
        return (tf.einsum("btuh,hv->btuv", hidden, self._weight(self.kernel))
                + self._weight(self.bias))

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, units=self.units, activation=self.activation,
                      blank=self.blank, mode=self.mode, tile_size=self.tile_size,
                      memory_budget=self.memory_budget, pad_value=self.pad_value,
                      all_frames_valid=self.all_frames_valid)
        return config


# ----------------------------------------------------------------------------------------------
# The losses.
# ----------------------------------------------------------------------------------------------
def _after_checks(tensor, checks):
    """`tensor`, and in the backward pass its gradient, once `checks` (assert ops) have passed:
    a failing check fails the step before any gradient reaches the weights."""
    if not checks or tf.executing_eagerly():  # eager asserts have already run
        return tensor

    @tf.custom_gradient
    def gated(x):
        with tf.control_dependencies(checks):
            y = tf.identity(x)

        def grad(dy):
            with tf.control_dependencies(checks):
                return tf.identity(dy)

        return y, grad

    return gated(tensor)


class _TransducerLoss(keras.losses.Loss):
    """Per-sample RNN-T costs from `call`; `keras.losses.Loss` applies sample_weight and the
    reduction.

    reduction="per_token" is not a Keras reduction: `call` divides each cost by the label count
    of the global batch (all-reduced over the replicas of a tf.distribute strategy) and Keras
    sums the weighted costs ("sum" takes no 1 / num_replicas factor; the global count already
    makes the replicas' summed gradients those of the global batch).
    """

    def __init__(self, blank, pad_value, fastemit_lambda, clamp, reduction, name, dtype):
        owner = type(self).__name__
        if dtype not in (None, "float32", tf.float32):
            raise ValueError(f"{owner}: the RNN-T costs are float32; got dtype={dtype!r}.")
        if reduction not in _REDUCTIONS:
            raise ValueError(f"{owner}: reduction must be one of {_REDUCTIONS}, got "
                             f"{reduction!r}.")
        self.per_token = reduction == "per_token"
        super().__init__(name=name, reduction="sum" if self.per_token else reduction,
                         dtype="float32")
        self.blank = None if blank is None else contract.check_blank(blank, owner)
        self.pad_value = None if pad_value is None else int(pad_value)
        self.fastemit_lambda = contract.check_fastemit_lambda(fastemit_lambda, owner)
        self.clamp = contract.check_clamp(clamp, owner)

    def _normalize(self, costs, label_lengths):
        if not self.per_token:
            return costs
        tokens = tf.cast(tf.reduce_sum(label_lengths), tf.float32)
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            tokens = context.all_reduce("sum", tokens)
        return costs / tf.maximum(tokens, 1.0)

    def get_config(self):
        config = super().get_config()
        config.update(reduction="per_token" if self.per_token else self.reduction,
                      blank=self.blank, pad_value=self.pad_value,
                      fastemit_lambda=self.fastemit_lambda, clamp=self.clamp)
        return config


@keras.saving.register_keras_serializable(package="tf_rnnt")
class FlashRNNTLoss(_TransducerLoss):
    """RNN-T loss on the lattice from `RNNTJoint`; get it from the layer: `joint.loss()`.

    `y_true` is `[B, U]` labels padded at the end (Keras passes them as floats; they are
    rounded back to integer ids). `y_pred` is the `[B, T, U+1, 2]` lattice of `RNNTJoint`,
    whose padded-node convention gives the frame and label lengths (see the module docstring).
    The per-sample costs -log P(y|x) are weighted by `sample_weight` and reduced by Keras.

    `blank` and `pad_value` default to None: the lattice carries the layer's settings.
    When given (as `joint.loss()` does), they are checked against the layer's: a different
    blank, or label lengths of `y_true` padded with `pad_value` that differ from the marked
    ones, raise InvalidArgumentError at the first step, naming both settings.

    Args:
      blank: None, or the blank id the `RNNTJoint` must use (a negative blank is not checked:
        the lattice does not hold V).
      pad_value: None, or the label padding id of `y_true`, checked against the marked lengths.
      fastemit_lambda: FastEmit regularization weight (changes the gradient, not the cost).
      clamp: clamp of d cost / d lattice; off when <= 0.
      reduction: a Keras reduction ("sum_over_batch_size", "sum", "mean",
        "mean_with_sample_weight", "none" or None), or "per_token": the summed weighted costs
        over the summed label lengths of the global batch (NeMo's "mean_volume"; sample
        weights scale the costs, not the label count; a batch without labels divides by 1).
      name: loss name.
      dtype: only float32 (or None) is accepted: the costs are float32.

    Example:

    ```python
    model.compile(optimizer="adam", loss=joint.loss(reduction="per_token"))
    ```
    """

    def __init__(self, blank=None, pad_value=None, fastemit_lambda=0.0, clamp=-1.0,
                 reduction="sum_over_batch_size", name="flash_rnnt_loss", dtype=None):
        super().__init__(blank, pad_value, fastemit_lambda, clamp, reduction, name, dtype)
        if (self.blank is not None and self.blank >= 0 and self.pad_value is not None
                and self.pad_value >= 0 and self.pad_value != self.blank):
            raise ValueError(f"FlashRNNTLoss: pad_value={pad_value} would be a label id; pad with "
                             f"a negative id (default -1) or with the blank ({blank}).")

    def call(self, y_true, y_pred):
        owner = type(self).__name__
        lattice = tf.convert_to_tensor(y_pred)
        check_rank(lattice, 4, "y_pred", owner, "the [B, T, U+1, 2] lattice from RNNTJoint")
        if contract.static_dim(lattice, 3) not in (None, 2):
            raise ValueError(f"{owner}: `y_pred` must be the [B, T, U+1, 2] lattice from "
                             f"RNNTJoint, got shape {lattice.shape}; for [B, T, U+1, V] logits "
                             f"use tf_rnnt.keras.RNNTLoss.")
        lattice = tf.cast(lattice, tf.float32)
        labels = labels_as_int(y_true, "y_true", owner)
        check_rank(labels, 2, "y_true", owner, "[B, U] padded labels")
        asserts = check_same_batch(owner, ("y_true", labels), ("y_pred", lattice))
        asserts += [check_u_plus_one(labels, lattice, 2, "y_pred", owner),
                    tf.debugging.assert_equal(tf.shape(lattice)[3], 2, message=(
                        f"{owner}: `y_pred` must be a [B, T, U+1, 2] lattice"))]
        # The lengths come from the lattice, so the device computes them only after the joint:
        # the checks of lattice values below run beside the loss op and gate the costs and
        # their gradient, not the op (which would then wait for a device-to-host copy while
        # the device idles).
        logit_lengths, label_lengths = lattice_lengths(lattice)
        label_lengths = tf.maximum(label_lengths, 0)  # -1 for a sample without frames
        value_checks = [tf.debugging.assert_positive(logit_lengths, message=(
            f"{owner}: `y_pred` marks a sample without frames (logit_lengths must be in "
            f"[1, T]); RNNTJoint never does (mark a hand-made lattice with "
            f"tf_rnnt.keras.mark_lattice_padding and logit_lengths >= 1)"))]
        if self.pad_value is not None:
            padded = tf.reduce_sum(tf.cast(tf.not_equal(labels, self.pad_value), tf.int32), 1)
            value_checks.append(tf.debugging.assert_equal(
                tf.where(logit_lengths > 0, label_lengths, padded), padded, message=(
                    f"{owner}: the label lengths of `y_true` padded with FlashRNNTLoss(pad_value="
                    f"{self.pad_value}) disagree with those marked in `y_pred` by RNNTJoint, "
                    f"whose pad_value differs. Set blank and pad_value once, on RNNTJoint, and "
                    f"compile with joint.loss() (mark a hand-made lattice with "
                    f"tf_rnnt.keras.mark_lattice_padding)")))
        if self.blank is not None and self.blank >= 0:
            code = lattice[:, :, -1, 1] - _BLANK_CODE
            has_code = code > -_PAD_THRESHOLD
            layer_blank = tf.where(has_code, tf.cast(tf.round(code), tf.int32), self.blank)
            message = (f"{owner}: FlashRNNTLoss(blank={self.blank}) differs from the blank of "
                       f"the RNNTJoint that built `y_pred`. Set blank and pad_value once, on "
                       f"RNNTJoint, and compile with joint.loss(). RNNTJoint blank id:")
            value_checks.append(tf.debugging.Assert(tf.reduce_all(layer_blank == self.blank), [
                message, tf.reduce_max(tf.where(layer_blank == self.blank, -1, layer_blank))]))
        with tf.control_dependencies(asserts):
            lattice = tf.where(lattice > _PAD_THRESHOLD, tf.zeros_like(lattice), lattice)
            # Marked lengths lie in [0, T] and [0, U]; the op needs no host copy of them. A
            # sample without frames (rejected by value_checks) gets a NaN cost, zero gradient.
            costs = _ops()._lattice_loss(lattice, logit_lengths, label_lengths,
                                         self.fastemit_lambda, self.clamp, owner,
                                         lengths_validated=True)
        costs = _after_checks(tf.where(logit_lengths > 0, costs, float("nan")), value_checks)
        return self._normalize(costs, label_lengths)


@keras.saving.register_keras_serializable(package="tf_rnnt")
class RNNTLoss(_TransducerLoss):
    """RNN-T loss on full logits, for models that compute them: `tf_rnnt.rnnt_loss` inside.

    `y_true` is `[B, U]` labels padded at the end with `pad_value`; `y_pred` the `[B, T, U+1, V]`
    logits (float32, float16 or bfloat16; not cast), `V >= 2`. Frame lengths come from the Keras
    mask of `y_pred` (`[B, T]`, e.g. from `LengthMask` on the encoder output); without a mask
    the call raises ValueError unless `all_frames_valid=True`. The costs are weighted by
    `sample_weight` and reduced by Keras. Prefer `RNNTJoint` + `FlashRNNTLoss`: the logits take
    `B*T*(U+1)*V` memory.

    Args:
      blank: blank id; negative counts from the end.
      pad_value: label padding id (default -1).
      fastemit_lambda: FastEmit regularization weight.
      clamp: clamp of d cost / d lattice; off when <= 0.
      reduction: a Keras reduction or "per_token" (see `FlashRNNTLoss`).
      name: loss name.
      dtype: only float32 (or None) is accepted: the costs are float32.
      all_frames_valid: without a mask on `y_pred`, take every frame as valid instead of
        raising (for unpadded batches only).

    Example:

    ```python
    model.compile(optimizer="adam", loss=tf_rnnt.keras.RNNTLoss())
    ```
    """

    def __init__(self, blank=0, pad_value=-1, fastemit_lambda=0.0, clamp=-1.0,
                 reduction="sum_over_batch_size", name="rnnt_loss", dtype=None,
                 all_frames_valid=False):
        super().__init__(blank, pad_value, fastemit_lambda, clamp, reduction, name, dtype)
        self.all_frames_valid = bool(all_frames_valid)

    def __call__(self, y_true, y_pred, sample_weight=None):
        # keras.losses.Loss.__call__ would multiply y_pred's [B, T] frame mask into the [B]
        # costs (a shape error) and cast float16 / bfloat16 logits to float32 (a second copy of
        # the largest tensor). So the costs are computed here, the mask giving the frame lengths,
        # and Keras weights and reduces them (`call` passes [B] costs through).
        with tf.name_scope(self.name):
            costs = self._costs(y_true, y_pred, getattr(y_pred, "_keras_mask", None))
        return super().__call__(y_true, costs, sample_weight)

    def call(self, y_true, y_pred):
        if y_pred.shape.rank == 1:  # the costs, from __call__
            return y_pred
        return self._costs(y_true, y_pred, None)

    def _costs(self, y_true, y_pred, frame_mask):
        owner = type(self).__name__
        logits = tf.convert_to_tensor(y_pred)
        check_rank(logits, 4, "y_pred", owner, "[B, T, U+1, V] logits")
        vocab_size = contract.static_dim(logits, 3)
        if vocab_size is None:
            raise ValueError(f"{owner}: the vocabulary dimension of `y_pred` must be known.")
        if logits.dtype not in contract.FLOAT_DTYPES:
            logits = tf.cast(logits, tf.float32)
        blank = contract.check_blank(self.blank, owner, vocab_size) % vocab_size
        _check_pad_value(self.pad_value, blank, vocab_size, owner)
        labels = labels_as_int(y_true, "y_true", owner)
        check_rank(labels, 2, "y_true", owner, "[B, U] padded labels")
        asserts = check_same_batch(owner, ("y_true", labels), ("y_pred", logits))
        asserts.append(check_u_plus_one(labels, logits, 2, "y_pred", owner))
        clean_labels, label_lengths, checks = label_lengths_of(
            labels, self.pad_value, blank, vocab_size, "y_true", owner)
        if frame_mask is None and not self.all_frames_valid:
            raise missing_lengths_error("y_pred", owner, "give the logits the Keras mask of the "
                                         "encoder output (tf_rnnt.keras.LengthMask).")
        logit_lengths, frame_checks = frame_lengths_of(None, frame_mask, logits, "y_pred", owner)
        with tf.control_dependencies(asserts + checks + frame_checks):
            costs = _ops().rnnt_loss(logits, clean_labels, logit_lengths, label_lengths,
                                     blank=blank, fastemit_lambda=self.fastemit_lambda,
                                     clamp=self.clamp)
        return self._normalize(costs, label_lengths)

    def get_config(self):
        return {**super().get_config(), "all_frames_valid": self.all_frames_valid}
