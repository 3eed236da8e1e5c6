"""`FlashRNNTLoss` (on `RNNTJoint`'s lattice) and `RNNTLoss` (on full logits)."""

import keras
import tensorflow as tf

from tf_rnnt import _contract as contract
from tf_rnnt.keras.checks import (
    check_pad_value,
    check_rank,
    check_same_batch,
    check_u_plus_one,
    frame_lengths_of,
    label_lengths_of,
    labels_as_int,
    missing_lengths_error,
)
from tf_rnnt.keras.lattice import BLANK_CODE, PAD_THRESHOLD, lattice_lengths

_KERAS_REDUCTIONS = ("sum_over_batch_size", "sum", "mean", "mean_with_sample_weight", "none",
                     None)
_REDUCTIONS = _KERAS_REDUCTIONS + ("per_token",)


def ops():
    """`tf_rnnt.ops`, imported late: building a model does not load the op library."""
    from tf_rnnt import ops as module

    return module


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
            code = lattice[:, :, -1, 1] - BLANK_CODE
            has_code = code > -PAD_THRESHOLD
            layer_blank = tf.where(has_code, tf.cast(tf.round(code), tf.int32), self.blank)
            message = (f"{owner}: FlashRNNTLoss(blank={self.blank}) differs from the blank of "
                       f"the RNNTJoint that built `y_pred`. Set blank and pad_value once, on "
                       f"RNNTJoint, and compile with joint.loss(). RNNTJoint blank id:")
            value_checks.append(tf.debugging.Assert(tf.reduce_all(layer_blank == self.blank), [
                message, tf.reduce_max(tf.where(layer_blank == self.blank, -1, layer_blank))]))
        with tf.control_dependencies(asserts):
            lattice = tf.where(lattice > PAD_THRESHOLD, tf.zeros_like(lattice), lattice)
            # Marked lengths lie in [0, T] and [0, U]; the op needs no host copy of them. A
            # sample without frames (rejected by value_checks) gets a NaN cost, zero gradient.
            costs = ops()._lattice_loss(lattice, logit_lengths, label_lengths,
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
        check_pad_value(self.pad_value, blank, vocab_size, owner)
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
            costs = ops().rnnt_loss(logits, clean_labels, logit_lengths, label_lengths,
                                     blank=blank, fastemit_lambda=self.fastemit_lambda,
                                     clamp=self.clamp)
        return self._normalize(costs, label_lengths)

    def get_config(self):
        return {**super().get_config(), "all_frames_valid": self.all_frames_valid}
