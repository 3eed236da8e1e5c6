"""Keras 3 API: the `RNNTJoint` layer and the `FlashRNNTLoss` / `RNNTLoss` losses.

A transducer trained with Keras ends in an `RNNTJoint` layer and is compiled with
`FlashRNNTLoss`:

```python
joint = tf_rnnt.keras.RNNTJoint(vocab_size=V, units=320)
lattice = joint([encoder_out, predictor_out, labels])   # [B, T, U+1, 2], never [B, T, U+1, V]
model = keras.Model([features, labels], lattice)
model.compile(optimizer="adam", loss=tf_rnnt.keras.FlashRNNTLoss())
model.fit(dataset)  # elements ((features, labels), labels), labels padded with -1
```

Lengths:
  * Frame lengths come from the Keras mask of `encoder_out` (e.g. a `keras.layers.Masking`
    in front of a masking-aware encoder); without a mask every frame is valid.
  * Label lengths come from padding: every label entry equal to `pad_value` (default -1) is
    padding, and padding must sit at the end of each row.

The padded-node convention (how the loss learns the frame lengths): `RNNTJoint` writes
`PAD_NODE_VALUE` (+1.0) into both channels of every lattice node outside a sample's valid
rectangle (`t >= logit_length` or `u > label_length`). Real nodes hold log-probabilities, which
are never positive, so the marking is unambiguous. `FlashRNNTLoss` reads the frame lengths back
from it (`lattice_lengths`) and checks that the label lengths it marks agree with the padding of
`y_true`. Lattices built without `RNNTJoint` (e.g. with `tf_rnnt.joint_lattice`) can be marked
with `mark_lattice_padding`.

XLA: `model.compile(jit_compile=True)` (and Keras' "auto", which turns XLA on for a GPU model)
compiles the whole training step, these layers and losses included: the op library's XLA
kernels lower each op to an XLA custom call running the same CPU/CUDA code. A library built
against a TensorFlow without the XLA FFI (2.17) has no XLA kernels; under XLA the ops then use
the pure-TensorFlow reference math, and `RNNTJoint` materializes the full logits (a warning
names the op).
"""

import keras
import tensorflow as tf

__all__ = ["RNNTJoint", "FlashRNNTLoss", "RNNTLoss", "mark_lattice_padding", "lattice_lengths",
           "PAD_NODE_VALUE"]

# Written into lattice nodes outside a sample's rectangle: log-probabilities are <= 0.
PAD_NODE_VALUE = 1.0
# Anything above this is a padded node; NaN compares False and so stays a real node.
_PAD_THRESHOLD = 0.5

_ACTIVATIONS = {"tanh": tf.tanh, "relu": tf.nn.relu, "identity": tf.identity}
_REDUCTIONS = ("sum_over_batch_size", "sum", "mean", "mean_with_sample_weight", "none", None)


def _ops():
    # Late import: building a model (or loading tf_rnnt.keras) does not load the op library.
    from tf_rnnt import ops

    return ops


# ----------------------------------------------------------------------------------------------
# The padded-node convention.
# ----------------------------------------------------------------------------------------------
def mark_lattice_padding(lattice, logit_lengths, label_lengths):
    """Writes `PAD_NODE_VALUE` into the nodes outside each sample's valid rectangle.

    Args:
      lattice: `[B, T, U+1, 2]` float32 lattice.
      logit_lengths: `[B]` int, valid frames per sample.
      label_lengths: `[B]` int, valid labels per sample.

    Returns:
      `[B, T, U+1, 2]` float32: `lattice` on nodes `t < logit_lengths[b]`,
      `u <= label_lengths[b]`, `PAD_NODE_VALUE` (with zero gradient) elsewhere.
    """
    lattice = tf.convert_to_tensor(lattice, tf.float32)
    shape = tf.shape(lattice)
    frame_valid = tf.sequence_mask(tf.cast(logit_lengths, tf.int32), shape[1])
    node_valid = tf.sequence_mask(tf.cast(label_lengths, tf.int32) + 1, shape[2])
    valid = frame_valid[:, :, None, None] & node_valid[:, None, :, None]
    return tf.where(valid, lattice, tf.constant(PAD_NODE_VALUE, tf.float32))


def lattice_lengths(lattice):
    """Reads `(logit_lengths, label_lengths)` back from a lattice marked by `RNNTJoint`.

    Args:
      lattice: `[B, T, U+1, 2]` lattice following the padded-node convention.

    Returns:
      `logit_lengths` `[B]` int32 (frames whose node u = 0 is real) and `label_lengths`
      `[B]` int32 (real nodes of frame 0, minus one; -1 for a sample without frames).
    """
    is_pad = tf.convert_to_tensor(lattice)[..., 0] > _PAD_THRESHOLD  # [B, T, U+1]
    logit_lengths = tf.reduce_sum(tf.cast(~is_pad[:, :, 0], tf.int32), axis=1)
    label_lengths = tf.reduce_sum(tf.cast(~is_pad[:, 0, :], tf.int32), axis=1) - 1
    return logit_lengths, label_lengths


# ----------------------------------------------------------------------------------------------
# Shared checks.
# ----------------------------------------------------------------------------------------------
def _static_dim(tensor, axis):
    return tensor.shape[axis] if tensor.shape.rank is not None else None


def _check_rank(tensor, rank, argument, owner, layout):
    if tensor.shape.rank is not None and tensor.shape.rank != rank:
        raise ValueError(f"{owner}: `{argument}` must be {layout} (rank {rank}), got shape "
                         f"{tensor.shape}.")


def _labels_for(y_true, y_pred, owner):
    """`y_true` as [B, U] int32 labels for `y_pred` of shape [B, T, U+1, ...], and the run-time
    checks of that agreement."""
    labels = _labels_as_int(y_true, "y_true", owner)
    _check_rank(labels, 2, "y_true", owner, "[B, U] padded labels")
    asserts = _check_same_batch(owner, ("y_true", labels), ("y_pred", y_pred))
    asserts.append(_check_u_plus_one(
        labels, y_pred, 2, owner,
        static=lambda u, got: (f"`y_pred` must have U+1 = {u + 1} label nodes for `y_true` of "
                               f"length U = {u}, got shape {y_pred.shape}."),
        dynamic="`y_pred` must have U+1 label nodes for `y_true` of length U"))
    return labels, asserts


def _check_u_plus_one(labels, tensor, axis, owner, static, dynamic):
    """`tensor.shape[axis]` == U + 1 for `[B, U]` labels: a ValueError now when both are static
    (`static(U, got)` says what is wrong), else the returned run-time assertion (`dynamic`)."""
    num_labels, num_nodes = _static_dim(labels, 1), _static_dim(tensor, axis)
    if num_labels is not None and num_nodes is not None and num_nodes != num_labels + 1:
        raise ValueError(f"{owner}: {static(num_labels, num_nodes)}")
    return tf.debugging.assert_equal(tf.shape(tensor)[axis], tf.shape(labels)[1] + 1,
                                     message=f"{owner}: {dynamic}")


def _check_same_batch(owner, *named):
    """Static check where batch sizes are known, runtime asserts for the rest."""
    known = [(name, _static_dim(t, 0)) for name, t in named if _static_dim(t, 0) is not None]
    if len({size for _, size in known}) > 1:
        sizes = ", ".join(f"{name}: {size}" for name, size in known)
        raise ValueError(f"{owner}: mismatched batch sizes ({sizes}).")
    (first_name, first), rest = named[0], named[1:]
    return [tf.debugging.assert_equal(
        tf.shape(first)[0], tf.shape(t)[0],
        message=f"{owner}: mismatched batch sizes of `{first_name}` and `{name}`")
        for name, t in rest]


def _labels_as_int(labels, argument, owner):
    labels = tf.convert_to_tensor(labels)
    if labels.dtype.is_floating:
        # Keras hands y_true over as floats; label ids are exact in float32 below 2**24.
        labels = tf.round(labels)
    elif not labels.dtype.is_integer:
        raise ValueError(f"{owner}: `{argument}` must hold integer label ids, got dtype "
                         f"{labels.dtype.name}.")
    return tf.cast(labels, tf.int32)


def _label_lengths(labels, pad_value, blank, vocab_size, argument, owner):
    """Label lengths from padding, labels with padding replaced by 0, and the input checks.

    Args:
      labels: `[B, U]` int32.
      pad_value: the padding id.
      blank: blank id (normalized, >= 0) or None when unknown.
      vocab_size: V or None when unknown.

    Returns:
      `(clean_labels [B, U], label_lengths [B], asserts)`.
    """
    is_label = tf.not_equal(labels, pad_value)
    label_lengths = tf.reduce_sum(tf.cast(is_label, tf.int32), axis=1)
    prefix = tf.sequence_mask(label_lengths, tf.shape(labels)[1])
    asserts = [tf.debugging.assert_equal(
        is_label, prefix,
        message=f"{owner}: `{argument}` must be padded at the end with pad_value={pad_value}, "
                f"with no pad_value before a label")]
    # Checked on real labels only; padded entries become 0 (any id in [0, V) would do).
    clean = tf.where(is_label, labels, 0)
    asserts.append(tf.debugging.assert_non_negative(
        clean, message=f"{owner}: `{argument}` holds negative ids other than pad_value="
                       f"{pad_value}"))
    if vocab_size is not None:
        asserts.append(tf.debugging.assert_less(
            clean, tf.constant(vocab_size, tf.int32),
            message=f"{owner}: `{argument}` holds ids >= vocab_size={vocab_size}"))
    if blank is not None:
        asserts.append(tf.debugging.assert_equal(
            tf.reduce_any(is_label & tf.equal(labels, blank)), False,
            message=f"{owner}: `{argument}` holds the blank id {blank} as a label (blank is "
                    f"never a target; pad with pad_value={pad_value})"))
    return clean, label_lengths, asserts


def _frame_lengths_from_mask(mask, num_frames, argument, owner):
    mask = tf.cast(mask, tf.bool)
    lengths = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)
    check = tf.debugging.assert_equal(
        mask, tf.sequence_mask(lengths, num_frames),
        message=f"{owner}: the Keras mask of `{argument}` must mark a prefix of the frames "
                f"(padding at the end)")
    return lengths, [check]


def _check_pad_value(pad_value, blank, vocab_size, owner):
    if int(pad_value) != pad_value:
        raise ValueError(f"{owner}: pad_value must be an integer, got {pad_value!r}.")
    pad_value = int(pad_value)
    if vocab_size is not None and 0 <= pad_value < vocab_size and pad_value != blank:
        raise ValueError(f"{owner}: pad_value={pad_value} is a label id in [0, {vocab_size}); "
                         f"pad with a negative id (default -1) or with the blank ({blank}).")
    return pad_value


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

    Call: `joint([encoder_out, predictor_out, labels])` with `encoder_out` `[B, T, D_enc]`
    (its Keras mask gives the frame lengths; no mask: all frames valid), `predictor_out`
    `[B, U+1, D_pred]` (the predictor run on blank followed by the labels) and `labels` `[B, U]`
    integer ids padded at the end with `pad_value`. Returns the float32 lattice `[B, T, U+1, 2]`
    with nodes outside each sample's rectangle set to `PAD_NODE_VALUE` (see the module
    docstring); train it with `FlashRNNTLoss`. The output carries no Keras mask.

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
      pad_value: label padding id (negative, or the blank); must match `FlashRNNTLoss`.
      **kwargs: `keras.layers.Layer` arguments (name, dtype, trainable, ...).
    """

    def __init__(self, vocab_size, units, activation="tanh", blank=0, mode="tiled",
                 tile_size=None, memory_budget=None, pad_value=-1, **kwargs):
        super().__init__(**kwargs)
        vocab_size, units = int(vocab_size), int(units)
        if vocab_size < 2:
            raise ValueError(f"RNNTJoint: vocab_size must be >= 2 (blank plus a label), got "
                             f"{vocab_size}.")
        if units < 1:
            raise ValueError(f"RNNTJoint: units must be >= 1, got {units}.")
        if activation not in _ACTIVATIONS:
            raise ValueError(f"RNNTJoint: activation must be one of {sorted(_ACTIVATIONS)}, got "
                             f"{activation!r}.")
        if not -vocab_size <= int(blank) < vocab_size:
            raise ValueError(f"RNNTJoint: blank={blank} is outside [-{vocab_size}, {vocab_size}).")
        self.vocab_size = vocab_size
        self.units = units
        self.activation = activation
        self.blank = int(blank)
        self._blank_id = self.blank % vocab_size
        self.mode = mode
        self.tile_size = tile_size
        self.memory_budget = memory_budget
        self.pad_value = _check_pad_value(pad_value, self._blank_id, vocab_size, "RNNTJoint")

    # -- weights --------------------------------------------------------------------------------
    def build(self, input_shape):
        if not isinstance(input_shape, (list, tuple)) or len(input_shape) != 3:
            raise ValueError("RNNTJoint: expects inputs [encoder_out, predictor_out, labels], got "
                             f"input shape {input_shape}.")
        encoder_shape, predictor_shape, _ = input_shape
        self._build_projections(encoder_shape[-1], predictor_shape[-1])

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
    def call(self, inputs, mask=None):
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 3:
            raise ValueError("RNNTJoint: expects inputs [encoder_out, predictor_out, labels].")
        owner = "RNNTJoint"
        encoder_out, predictor_out, labels = (tf.convert_to_tensor(x) for x in inputs)
        _check_rank(encoder_out, 3, "encoder_out", owner, "[B, T, D_enc]")
        _check_rank(predictor_out, 3, "predictor_out", owner, "[B, U+1, D_pred]")
        _check_rank(labels, 2, "labels", owner, "[B, U]")
        if labels.dtype.is_floating:
            raise ValueError(f"{owner}: `labels` must be an integer tensor, got dtype "
                             f"{labels.dtype.name} (declare keras.Input(..., dtype='int32')).")
        labels = _labels_as_int(labels, "labels", owner)
        asserts = _check_same_batch(owner, ("encoder_out", encoder_out),
                                    ("predictor_out", predictor_out), ("labels", labels))
        asserts.append(_check_u_plus_one(
            labels, predictor_out, 1, owner,
            static=lambda u, got: (f"`predictor_out` must have U+1 = {u + 1} steps for `labels` "
                                   f"of length U = {u}, got {got}."),
            dynamic="`predictor_out` must have U+1 steps for `labels` of length U"))

        num_frames = tf.shape(encoder_out)[1]
        encoder_mask = mask[0] if isinstance(mask, (list, tuple)) else None
        if encoder_mask is None:
            logit_lengths = tf.fill([tf.shape(encoder_out)[0]], num_frames)
        else:
            logit_lengths, checks = _frame_lengths_from_mask(encoder_mask, num_frames,
                                                             "encoder_out", owner)
            asserts += checks
        clean_labels, label_lengths, checks = _label_lengths(
            labels, self.pad_value, self._blank_id, self.vocab_size, "labels", owner)
        asserts += checks

        with tf.control_dependencies(asserts):
            encoder, predictor = self._project(encoder_out, predictor_out)
            lattice = _ops().joint_lattice(
                encoder, predictor, self._weight(self.kernel), self._weight(self.bias),
                clean_labels, logit_lengths, label_lengths, blank=self._blank_id,
                activation=self.activation, mode=self.mode, tile_size=self.tile_size,
                memory_budget=self.memory_budget)
        return mark_lattice_padding(lattice, logit_lengths, label_lengths)

    def compute_mask(self, inputs, mask=None):
        # The lengths live in the lattice; a [B, T] mask would be misapplied to [B] losses.
        return None

    def compute_output_spec(self, inputs, mask=None):
        encoder_out, _, labels = inputs
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
                      memory_budget=self.memory_budget, pad_value=self.pad_value)
        return config


# ----------------------------------------------------------------------------------------------
# The losses.
# ----------------------------------------------------------------------------------------------
class _TransducerLoss(keras.losses.Loss):
    """Per-sample RNN-T costs reduced the way every Keras loss is (sample_weight, reduction)."""

    def __init__(self, blank, pad_value, fastemit_lambda, clamp, reduction, name, dtype):
        if dtype not in (None, "float32", tf.float32):
            raise ValueError(f"{type(self).__name__}: the RNN-T costs are float32; got "
                             f"dtype={dtype!r}.")
        if reduction not in _REDUCTIONS:
            raise ValueError(f"{type(self).__name__}: reduction must be one of {_REDUCTIONS}, got "
                             f"{reduction!r}.")
        super().__init__(name=name, reduction=reduction, dtype="float32")
        self.blank = int(blank)
        self.pad_value = int(pad_value)
        self.fastemit_lambda = float(fastemit_lambda)
        self.clamp = float(clamp)

    def __call__(self, y_true, y_pred, sample_weight=None):
        # A Keras mask on y_pred marks frames ([B, T]); Keras' default would multiply it into the
        # [B] costs, so it is taken out here and used for the frame lengths instead.
        frame_mask = getattr(y_pred, "_keras_mask", None)
        with tf.name_scope(self.name):
            costs = self._costs(y_true, y_pred, frame_mask)
            return self._reduce(costs, sample_weight)

    def call(self, y_true, y_pred):
        return self._costs(y_true, y_pred, None)

    def _reduce(self, costs, sample_weight):
        if sample_weight is not None:
            sample_weight = tf.cast(sample_weight, tf.float32)
            if sample_weight.shape.rank == 2 and sample_weight.shape[-1] == 1:
                sample_weight = tf.squeeze(sample_weight, -1)
            costs = costs * sample_weight
        if self.reduction in (None, "none"):
            return costs
        total = tf.reduce_sum(costs)
        if self.reduction == "sum":
            return total
        if self.reduction == "mean_with_sample_weight" and sample_weight is not None:
            divisor = tf.reduce_sum(tf.broadcast_to(sample_weight, tf.shape(costs)))
        else:
            divisor = tf.cast(tf.size(costs), tf.float32)
        loss = tf.math.divide_no_nan(total, divisor)
        # As every Keras mean loss: per-replica means are summed by tf.distribute's gradient
        # all-reduce, so each replica contributes 1 / num_replicas.
        num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if num_replicas > 1:
            loss = loss * (1.0 / num_replicas)
        return loss

    def _costs(self, y_true, y_pred, frame_mask):
        raise NotImplementedError

    def get_config(self):
        config = super().get_config()
        config.update(blank=self.blank, pad_value=self.pad_value,
                      fastemit_lambda=self.fastemit_lambda, clamp=self.clamp)
        return config


@keras.saving.register_keras_serializable(package="tf_rnnt")
class FlashRNNTLoss(_TransducerLoss):
    """RNN-T loss on the lattice from `RNNTJoint`: `model.compile(loss=FlashRNNTLoss())`.

    `y_true` is `[B, U]` labels padded at the end with `pad_value` (Keras passes them as
    floats; they are rounded back to integer ids). `y_pred` is the `[B, T, U+1, 2]` lattice of
    `RNNTJoint`, whose padded-node convention gives the frame lengths (a Keras mask on `y_pred`,
    if any, removes frames as well). The label lengths come from `y_true`'s padding and must
    agree with those `RNNTJoint` marked (same `pad_value` in both). The per-sample costs
    -log P(y|x) are weighted by `sample_weight` and reduced as every Keras loss.

    Args:
      blank: blank id, used to reject a blank among the labels (the lattice already holds the
        blank's log-probability; a negative blank is checked by `RNNTJoint` only).
      pad_value: label padding id (default -1); must match `RNNTJoint`.
      fastemit_lambda: FastEmit regularization weight (changes the gradient, not the cost).
      clamp: clamp of d cost / d lattice; off when <= 0.
      reduction: a Keras reduction: "sum_over_batch_size", "sum", "mean",
        "mean_with_sample_weight", "none" or None.
      name: loss name.
      dtype: only float32 (or None) is accepted: the costs are float32.
    """

    def __init__(self, blank=0, pad_value=-1, fastemit_lambda=0.0, clamp=-1.0,
                 reduction="sum_over_batch_size", name="flash_rnnt_loss", dtype=None):
        super().__init__(blank, pad_value, fastemit_lambda, clamp, reduction, name, dtype)
        if self.blank >= 0 and self.pad_value >= 0 and self.pad_value != self.blank:
            raise ValueError(f"FlashRNNTLoss: pad_value={pad_value} would be a label id; pad with "
                             f"a negative id (default -1) or with the blank ({blank}).")

    def _costs(self, y_true, y_pred, frame_mask):
        owner = type(self).__name__
        lattice = tf.convert_to_tensor(y_pred)
        _check_rank(lattice, 4, "y_pred", owner, "the [B, T, U+1, 2] lattice from RNNTJoint")
        if _static_dim(lattice, 3) not in (None, 2):
            raise ValueError(f"{owner}: `y_pred` must be the [B, T, U+1, 2] lattice from "
                             f"RNNTJoint, got shape {lattice.shape}; for [B, T, U+1, V] logits "
                             f"use tf_rnnt.keras.RNNTLoss.")
        lattice = tf.cast(lattice, tf.float32)
        labels, asserts = _labels_for(y_true, lattice, owner)
        asserts.append(tf.debugging.assert_equal(
            tf.shape(lattice)[3], 2, message=f"{owner}: `y_pred` must be a [B, T, U+1, 2] "
                                             f"lattice"))
        blank = self.blank if self.blank >= 0 else None
        _, label_lengths, checks = _label_lengths(labels, self.pad_value, blank, None, "y_true",
                                                  owner)
        asserts += checks

        is_pad = lattice > _PAD_THRESHOLD
        frame_valid = ~is_pad[:, :, 0, 0]
        if frame_mask is not None:
            frame_valid &= tf.cast(frame_mask, tf.bool)
        logit_lengths = tf.reduce_sum(tf.cast(frame_valid, tf.int32), axis=1)
        marked_label_lengths = tf.reduce_sum(tf.cast(~is_pad[:, 0, :, 0], tf.int32), axis=1) - 1
        asserts.append(tf.debugging.assert_equal(
            tf.where(logit_lengths > 0, marked_label_lengths, label_lengths), label_lengths,
            message=f"{owner}: the label lengths of `y_true` (padding pad_value={self.pad_value}) "
                    f"disagree with those marked in `y_pred`; give RNNTJoint and FlashRNNTLoss "
                    f"the same pad_value (or mark a hand-made lattice with "
                    f"tf_rnnt.keras.mark_lattice_padding)"))
        with tf.control_dependencies(asserts):
            lattice = tf.where(is_pad, tf.zeros_like(lattice), lattice)
            return _ops().lattice_loss(lattice, logit_lengths, label_lengths,
                                       fastemit_lambda=self.fastemit_lambda, clamp=self.clamp)


@keras.saving.register_keras_serializable(package="tf_rnnt")
class RNNTLoss(_TransducerLoss):
    """RNN-T loss on full logits, for models that compute them: `tf_rnnt.rnnt_loss` inside.

    `y_true` is `[B, U]` labels padded at the end with `pad_value`; `y_pred` the `[B, T, U+1, V]`
    logits (float32, float16 or bfloat16; not cast). Frame lengths come from the Keras mask of
    `y_pred` (`[B, T]`), all frames when there is none. The costs are weighted by
    `sample_weight` and reduced as every Keras loss. Prefer `RNNTJoint` + `FlashRNNTLoss`: the
    logits take `B*T*(U+1)*V` memory.

    Args:
      blank: blank id; negative counts from the end.
      pad_value: label padding id (default -1).
      fastemit_lambda: FastEmit regularization weight.
      clamp: clamp of d cost / d lattice; off when <= 0.
      reduction: a Keras reduction (see `FlashRNNTLoss`).
      name: loss name.
      dtype: only float32 (or None) is accepted: the costs are float32.
    """

    def __init__(self, blank=0, pad_value=-1, fastemit_lambda=0.0, clamp=-1.0,
                 reduction="sum_over_batch_size", name="rnnt_loss", dtype=None):
        super().__init__(blank, pad_value, fastemit_lambda, clamp, reduction, name, dtype)

    def _costs(self, y_true, y_pred, frame_mask):
        owner = type(self).__name__
        logits = tf.convert_to_tensor(y_pred)
        _check_rank(logits, 4, "y_pred", owner, "[B, T, U+1, V] logits")
        vocab_size = _static_dim(logits, 3)
        if vocab_size is None:
            raise ValueError(f"{owner}: the vocabulary dimension of `y_pred` must be known.")
        if vocab_size == 2:
            raise ValueError(f"{owner}: `y_pred` has 2 channels, which looks like a lattice from "
                             f"RNNTJoint; use tf_rnnt.keras.FlashRNNTLoss for it.")
        if logits.dtype not in (tf.float32, tf.float16, tf.bfloat16):
            logits = tf.cast(logits, tf.float32)
        blank = self.blank % vocab_size
        _check_pad_value(self.pad_value, blank, vocab_size, owner)
        labels, asserts = _labels_for(y_true, logits, owner)
        clean_labels, label_lengths, checks = _label_lengths(
            labels, self.pad_value, blank, vocab_size, "y_true", owner)
        asserts += checks
        num_frames = tf.shape(logits)[1]
        if frame_mask is None:
            logit_lengths = tf.fill([tf.shape(logits)[0]], num_frames)
        else:
            logit_lengths, checks = _frame_lengths_from_mask(frame_mask, num_frames, "y_pred",
                                                             owner)
            asserts += checks
        with tf.control_dependencies(asserts):
            return _ops().rnnt_loss(logits, clean_labels, logit_lengths, label_lengths,
                                    blank=blank, fastemit_lambda=self.fastemit_lambda,
                                    clamp=self.clamp)
