"""`FlashRNNTLoss` and `FlashTDTLoss` (on `RNNTJoint`'s lattice) and `RNNTLoss` (on full
logits)."""

import keras
import tensorflow as tf

from tf_rnnt import _contract as contract
from tf_rnnt.keras.checks import (
    check_pad_value,
    check_rank,
    check_same_batch,
    check_u_plus_one,
    frame_lengths_of,
    guard,
    label_lengths_of,
    labels_as_int,
    missing_lengths_error,
)
from tf_rnnt.keras.lattice import BLANK_CODE, PAD_NODE_VALUE, PAD_THRESHOLD, lattice_lengths

_KERAS_REDUCTIONS = ("sum_over_batch_size", "sum", "mean", "mean_with_sample_weight", "none",
                     None)
# NeMo's names, with NeMo's meaning: "mean_volume" is "per_token", "mean_batch" the mean of the
# per-sample costs over the batch (Keras' "sum_over_batch_size").
_NEMO_REDUCTIONS = {"mean_volume": "per_token", "mean_batch": "sum_over_batch_size"}
_REDUCTIONS = _KERAS_REDUCTIONS + ("per_token",) + tuple(_NEMO_REDUCTIONS)


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


_LATTICE_IN_RNNT_LOSS = (
    "RNNTLoss: `y_pred` is the [B, T, U+1, 2] lattice of RNNTJoint (log-probabilities marked "
    "with its padding and blank code), not V = 2 logits; train it with joint.loss() "
    "(FlashRNNTLoss).")


def _is_marked_lattice(values):
    """True for a `[B, T, U+1, 2]` tensor marked by RNNTJoint: every value a log-probability
    (<= 0) or the padding mark, and the label channel of the last node column the blank code."""
    values = tf.cast(values, tf.float32)
    code = values[:, :, -1, 1]
    coded = tf.reduce_all((code >= BLANK_CODE) & tf.equal(code, tf.round(code)))
    others = tf.concat([tf.reshape(values[:, :, :-1], [-1]), tf.reshape(values[:, :, -1, 0], [-1])],
                       0)
    marked = tf.reduce_all((others <= 0.0) | tf.equal(others, PAD_NODE_VALUE))
    return coded & marked & (tf.size(code) > 0)


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
        self._reduction_name = reduction
        keras_reduction = _NEMO_REDUCTIONS.get(reduction, reduction)
        self.per_token = keras_reduction == "per_token"
        super().__init__(name=name, reduction="sum" if self.per_token else keras_reduction,
                         dtype="float32")
        self.blank = None if blank is None else contract.check_blank(blank, owner)
        self.pad_value = None if pad_value is None else int(pad_value)
        self.fastemit_lambda = contract.check_fastemit_lambda(fastemit_lambda, owner)
        self.clamp = contract.check_clamp(clamp, owner)

    def __call__(self, y_true, y_pred, sample_weight=None):
        self._check_targets(y_true)  # before Keras' own conversion fails on None
        return super().__call__(y_true, y_pred, sample_weight)

    def _check_targets(self, y_true):
        if y_true is None:
            raise ValueError(
                f"{type(self).__name__}: no targets (y_true is None). Pass the padded labels as "
                f"the targets too, e.g. model.fit([features, ..., labels], labels): the loss "
                f"reads the label lengths from them.")

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
        config.update(reduction=self._reduction_name,
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
        "mean_with_sample_weight", "none" or None), "per_token", or NeMo's "mean_volume" /
        "mean_batch". "mean" is Keras' mean over the batch of the weighted costs, NOT NeMo's
        "mean" (which divides each cost by its label count first). "per_token" (NeMo's
        "mean_volume", accepted under either name): the summed weighted costs over the summed
        label lengths of the global batch (sample weights scale the costs, not the label count;
        a batch without labels divides by 1). "mean_batch": the mean over the batch of the
        weighted per-sample costs (as "sum_over_batch_size").
      name: loss name.
      dtype: only float32 (or None) is accepted: the costs are float32.
      lattice: what `y_pred` is. "rnnt_joint" (default): the output of `RNNTJoint`, which
        carries the layer's blank code; anything else (e.g. `[B, T, U+1, 2]` logits, whose
        costs would be meaningless) raises InvalidArgumentError. "marked": a lattice of
        log-probabilities marked with `tf_rnnt.keras.mark_lattice_padding` (not checked: the
        caller vouches for it).

    Example:

    ```python
    model.compile(optimizer="adam", loss=joint.loss(reduction="per_token"))
    ```
    """

    def __init__(self, blank=None, pad_value=None, fastemit_lambda=0.0, clamp=-1.0,
                 reduction="sum_over_batch_size", name="flash_rnnt_loss", dtype=None,
                 lattice="rnnt_joint"):
        super().__init__(blank, pad_value, fastemit_lambda, clamp, reduction, name, dtype)
        self.lattice = contract.check_choice(lattice, ("rnnt_joint", "marked"), "lattice",
                                             "FlashRNNTLoss")
        if (self.blank is not None and self.blank >= 0 and self.pad_value is not None
                and self.pad_value >= 0 and self.pad_value != self.blank):
            raise ValueError(f"FlashRNNTLoss: pad_value={pad_value} would be a label id; pad with "
                             f"a negative id (default -1) or with the blank ({blank}).")

    def get_config(self):
        return {**super().get_config(), "lattice": self.lattice}

    def call(self, y_true, y_pred):
        owner = type(self).__name__
        self._check_targets(y_true)
        self._check_layer_settings(getattr(y_pred, "_tf_rnnt_joint_settings", None))
        lattice = tf.convert_to_tensor(y_pred)
        channels, what = self._channels()
        check_rank(lattice, 4, "y_pred", owner, f"the {what} lattice from RNNTJoint")
        if contract.static_dim(lattice, 3) not in (None, channels):
            raise ValueError(f"{owner}: `y_pred` must be the {what} lattice from "
                             f"RNNTJoint, got shape {lattice.shape}; {self._other_lattices}")
        lattice = tf.cast(lattice, tf.float32)
        labels = labels_as_int(y_true, "y_true", owner)
        check_rank(labels, 2, "y_true", owner, "[B, U] padded labels")
        asserts = check_same_batch(owner, ("y_true", labels), ("y_pred", lattice))
        asserts += [check_u_plus_one(labels, lattice, 2, "y_pred", owner),
                    tf.debugging.assert_equal(tf.shape(lattice)[3], channels, message=(
                        f"{owner}: `y_pred` must be a {what} lattice"))]
        # The lengths come from the lattice, so the device computes them only after the joint:
        # the checks of lattice values below run beside the loss op and gate the costs and
        # their gradient, not the op (which would then wait for a device-to-host copy while
        # the device idles).
        logit_lengths, label_lengths = lattice_lengths(lattice)
        label_lengths = tf.maximum(label_lengths, 0)  # -1 for a sample without frames
        zero = tf.zeros([], tf.float32)
        gates = [guard(zero, logit_lengths > 0, (
            f"{owner}: `y_pred` marks a sample without frames (logit_lengths must be in "
            f"[1, T]); RNNTJoint never does (mark a hand-made lattice with "
            f"tf_rnnt.keras.mark_lattice_padding and logit_lengths >= 1)"))]
        code = lattice[:, :, -1, 1] - BLANK_CODE
        has_code = code > -PAD_THRESHOLD
        if self.lattice == "rnnt_joint":
            gates.append(guard(zero, has_code, (
                f"{owner}: `y_pred` is not a lattice from RNNTJoint (it lacks the layer's blank "
                f"code); for [B, T, U+1, 2] logits use tf_rnnt.keras.RNNTLoss, for a lattice "
                f"marked with tf_rnnt.keras.mark_lattice_padding pass "
                f"FlashRNNTLoss(lattice='marked')")))
        if self.pad_value is not None:
            padded = tf.reduce_sum(tf.cast(tf.not_equal(labels, self.pad_value), tf.int32), 1)
            gates.append(guard(zero, tf.equal(
                tf.where(logit_lengths > 0, label_lengths, padded), padded), (
                    f"{owner}: the label lengths of `y_true` padded with FlashRNNTLoss(pad_value="
                    f"{self.pad_value}) disagree with those marked in `y_pred` by RNNTJoint. "
                    f"Either the targets `y` given to fit differ from the labels input of "
                    f"RNNTJoint (pass the same padded labels as both), or RNNTJoint's pad_value "
                    f"differs (set blank and pad_value once, on RNNTJoint, and compile with "
                    f"joint.loss()). Per sample, its index where they disagree, else -1:"),
                data=tf.where(tf.not_equal(label_lengths, padded) & (logit_lengths > 0),
                              tf.range(tf.shape(padded)[0]), -1)))
        if self.blank is not None and self.blank >= 0:
            layer_blank = tf.where(has_code, tf.cast(tf.round(code), tf.int32), self.blank)
            gates.append(guard(zero, tf.equal(layer_blank, self.blank), (
                f"{owner}: FlashRNNTLoss(blank={self.blank}) differs from the blank of the "
                f"RNNTJoint that built `y_pred`. Set blank and pad_value once, on RNNTJoint, and "
                f"compile with joint.loss(). RNNTJoint blank id:"),
                data=tf.reduce_max(tf.where(layer_blank == self.blank, -1, layer_blank))))
        with tf.control_dependencies(asserts):
            lattice = tf.where(lattice > PAD_THRESHOLD, tf.zeros_like(lattice), lattice)
            # Marked lengths lie in [0, T] and [0, U]; the op needs no host copy of them. A
            # sample without frames (rejected by the gates) gets a NaN cost, zero gradient.
            costs = self._lattice_costs(lattice, logit_lengths, label_lengths, owner)
        # The checks of lattice values run beside the loss op (not before it: the op would wait
        # for a device-to-host copy) and gate the costs and their gradient; being in the data
        # flow, they also hold under XLA.
        costs = tf.where(logit_lengths > 0, costs, float("nan")) + tf.add_n(gates)
        costs = _after_checks(costs, gates)
        return self._normalize(costs, label_lengths)

    # What the lattice holds per node, and the costs of a lattice with its padding zeroed.
    _other_lattices = ("for [B, T, U+1, V] logits use tf_rnnt.keras.RNNTLoss; for a TDT joint's "
                       "lattice, FlashTDTLoss (joint.loss() of RNNTJoint(durations=...)).")

    def _channels(self):
        return 2, "[B, T, U+1, 2]"

    def _lattice_costs(self, lattice, logit_lengths, label_lengths, owner):
        return ops()._lattice_loss(lattice, logit_lengths, label_lengths, self.fastemit_lambda,
                                   self.clamp, owner, lengths_validated=True)

    def _check_layer_settings(self, settings):
        """At trace time, where `y_pred` is known to come from an RNNTJoint: its blank and
        pad_value against this loss's."""
        if settings is None:
            return
        layer_blank, layer_pad = settings
        for name, mine, theirs in (("blank", self.blank, layer_blank),
                                   ("pad_value", self.pad_value, layer_pad)):
            if mine is not None and not (name == "blank" and mine < 0) and mine != theirs:
                raise ValueError(
                    f"FlashRNNTLoss({name}={mine}) differs from the {name} of the RNNTJoint that "
                    f"built `y_pred` ({theirs}). Set blank and pad_value once, on RNNTJoint, and "
                    f"compile with joint.loss().")


@keras.saving.register_keras_serializable(package="tf_rnnt")
class FlashTDTLoss(FlashRNNTLoss):
    """TDT loss on the lattice of a TDT `RNNTJoint`; get it from the layer: `joint.loss()`.

    As `FlashRNNTLoss`, for `RNNTJoint(..., durations=...)`, whose `y_pred` is the
    `[B, T, U+1, 2 + D]` lattice: the blank and label log-probabilities, then the `D` duration
    log-probabilities, with the same padded-node convention. The costs are those of
    `tf_rnnt.tdt_lattice_loss` with `sigma` subtracted from the token channels (Xu et al. 2023,
    NeMo's TDT loss).

    Args:
      durations: the joint's durations (e.g. `[0, 1, 2, 3, 4]`); `joint.loss()` passes them.
      sigma: logit under-normalization (>= 0), as in `tf_rnnt.tdt_loss`.
      omega: probability that a step computes the plain RNN-T loss of the token channels
        instead (the duration channels then get no gradient), as in `tf_rnnt.tdt_loss`.
      seed: with `0 < omega < 1`, None draws with `tf.random.uniform` (follows
        `tf.random.set_seed`, a new draw each step); a pair of ints draws with
        `tf.random.stateless_uniform` (the same draw each step).
      blank, pad_value, fastemit_lambda, clamp, reduction, name, dtype, lattice: as in
        `FlashRNNTLoss`.

    Example:

    ```python
    joint = tf_rnnt.keras.RNNTJoint(vocab_size=V, units=320, durations=[0, 1, 2, 3, 4])
    model.compile(optimizer="adam", loss=joint.loss(sigma=0.05, omega=0.1))
    ```
    """

    def __init__(self, durations, sigma=0.0, omega=0.0, seed=None, blank=None, pad_value=None,
                 fastemit_lambda=0.0, clamp=-1.0, reduction="sum_over_batch_size",
                 name="flash_tdt_loss", dtype=None, lattice="rnnt_joint"):
        super().__init__(blank, pad_value, fastemit_lambda, clamp, reduction, name, dtype,
                         lattice)
        owner = "FlashTDTLoss"
        self.durations = list(contract.check_durations(durations, owner))
        self.sigma = contract.check_nonnegative_number(sigma, "sigma", owner)
        self.omega = contract.check_probability(omega, "omega", owner)
        self.seed = None if seed is None else [int(v) for v in seed]
        if self.seed is not None and len(self.seed) != 2:
            raise ValueError(f"{owner}: seed must be None or a pair of ints, got {seed!r}")

    def get_config(self):
        return {**super().get_config(), "durations": self.durations, "sigma": self.sigma,
                "omega": self.omega, "seed": self.seed}

    _other_lattices = ("for an RNN-T joint's [B, T, U+1, 2] lattice use FlashRNNTLoss; for "
                       "full logits, tf_rnnt.tdt_loss.")

    def _channels(self):
        channels = 2 + len(self.durations)
        return channels, f"[B, T, U+1, {channels}] TDT"

    def _lattice_costs(self, lattice, logit_lengths, label_lengths, owner):
        from tf_rnnt import tdt

        def tdt_costs():
            shifted = tdt.subtract_sigma(lattice, self.sigma, len(self.durations))
            return tdt._tdt_lattice_loss(shifted, logit_lengths, label_lengths,
                                         self.durations, self.fastemit_lambda, self.clamp, owner)

        def rnnt_costs():
            return ops()._lattice_loss(lattice[..., :2], logit_lengths, label_lengths,
                                       self.fastemit_lambda, self.clamp, owner,
                                       lengths_validated=True)

        seed = None if self.seed is None else tf.constant(self.seed, tf.int64)
        return tdt.with_omega(self.omega, seed, tdt_costs, rnnt_costs)


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
      reduction: as `FlashRNNTLoss`: a Keras reduction ("mean" is Keras' batch mean, not NeMo's
        length-normalized "mean"), "per_token" (= NeMo's "mean_volume") or "mean_batch".
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
        self._check_targets(y_true)
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
        if vocab_size == 2:
            if getattr(y_pred, "_tf_rnnt_joint_settings", None) is not None:
                raise ValueError(_LATTICE_IN_RNNT_LOSS)
            logit_lengths = guard(logit_lengths, ~_is_marked_lattice(logits),
                                  _LATTICE_IN_RNNT_LOSS)
        with tf.control_dependencies(asserts + checks + frame_checks):
            costs = ops().rnnt_loss(logits, clean_labels, logit_lengths, label_lengths,
                                     blank=blank, fastemit_lambda=self.fastemit_lambda,
                                     clamp=self.clamp)
        return self._normalize(costs, label_lengths)

    def get_config(self):
        return {**super().get_config(), "all_frames_valid": self.all_frames_valid}
