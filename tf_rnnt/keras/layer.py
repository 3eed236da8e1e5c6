"""`RNNTJoint`: the joint network whose output is the RNN-T lattice (see `tf_rnnt.keras`)."""

import warnings

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
from tf_rnnt.keras.lattice import BLANK_CODE, mark_lattice_padding
from tf_rnnt.keras.lengths import PredictorInput
from tf_rnnt.keras.losses import FlashRNNTLoss, FlashTDTLoss, ops

_ACTIVATIONS = {"tanh": tf.tanh, "relu": tf.nn.relu, "identity": tf.identity}


@keras.saving.register_keras_serializable(package="tf_rnnt")
class RNNTJoint(keras.layers.Layer):
    """RNN-T (or TDT) joint network whose output is the `[B, T, U+1, 2]` lattice, not the logits.

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
      gpu_kernel: `tf_rnnt.joint_lattice`'s GPU kernel path: "auto", "fused" or "cublas" (no
        effect on the CPU).
      durations: None (RNN-T), or a TDT joint's durations, e.g. `[0, 1, 2, 3, 4]` (Xu et al.
        2023; see `tf_rnnt.flash_tdt_loss`): `kernel` gains `D = len(durations)` duration
        columns `[units, vocab_size + D]` (and `bias` `[vocab_size + D]`), the output is the
        `[B, T, U+1, 2 + D]` TDT lattice, and `joint.loss()` is a `FlashTDTLoss`.
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
                 gpu_kernel="auto", durations=None, **kwargs):
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
        self.gpu_kernel = contract.check_choice(gpu_kernel, contract.GPU_KERNELS, "gpu_kernel",
                                                owner)
        self.pad_value = check_pad_value(pad_value, self._blank_id, vocab_size, "RNNTJoint")
        self.durations = (None if durations is None
                          else list(contract.check_durations(durations, owner)))
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
        lib = ops()
        if lib.xla_kernels_available():
            return True
        if not self._jit_warned:
            self._jit_warned = True
            warnings.warn(
                f"RNNTJoint '{self.name}': {lib._no_xla_kernels_reason()}, so Keras compiles "
                "this model without XLA, also under jit_compile=True (XLA would replace the "
                "fused joint by the full [B, T, U+1, V] logits). jit_compile=False keeps the "
                "fused joint.", stacklevel=2)
        return False

    @supports_jit.setter
    def supports_jit(self, value):
        # keras.layers.Layer.__init__ assigns True; assigning False turns XLA off for good.
        self._jit_allowed = bool(value)

    def loss(self, **kwargs):
        """A `FlashRNNTLoss` with this layer's blank and pad_value; for a TDT joint
        (`durations`), a `FlashTDTLoss` with its durations too.

        Args:
          **kwargs: the other arguments of the loss (fastemit_lambda, clamp, reduction, ...;
            for TDT also sigma, omega and seed).
        """
        if self.durations is not None:
            return FlashTDTLoss(durations=self.durations, blank=self._blank_id,
                                pad_value=self.pad_value, **kwargs)
        return FlashRNNTLoss(blank=self._blank_id, pad_value=self.pad_value, **kwargs)

    @property
    def num_durations(self):
        """D: the duration columns of the output layer (0 for RNN-T)."""
        return 0 if self.durations is None else len(self.durations)

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
        width = self.vocab_size + self.num_durations
        self.kernel = self.add_weight(name="kernel", shape=(self.units, width),
                                      initializer="glorot_uniform")
        self.bias = self.add_weight(name="bias", shape=(width,), initializer="zeros")
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
            lattice = ops().joint_lattice(
                encoder, predictor, self._weight(self.kernel), self._weight(self.bias),
                clean_labels, logit_lengths, label_lengths, blank=self._blank_id,
                activation=self.activation, mode=self.mode, tile_size=self.tile_size,
                memory_budget=self.memory_budget, gpu_kernel=self.gpu_kernel,
                durations=self.durations)
        lattice = mark_lattice_padding(lattice, logit_lengths, label_lengths)
        # The blank code: the label channel at u = U is never read by the loss.
        num_nodes = tf.shape(lattice)[2]
        is_code = ((tf.range(num_nodes) == num_nodes - 1)[:, None]
                   & tf.constant([False, True] + [False] * self.num_durations))
        lattice = tf.where(is_code, BLANK_CODE + self._blank_id, lattice)
        try:  # read by the losses at trace time: a static mismatch raises there
            lattice._tf_rnnt_joint_settings = (self._blank_id, self.pad_value)
        except AttributeError:
            pass
        return lattice

    def compute_mask(self, inputs, mask=None):
        # The lengths live in the lattice; a [B, T] mask would be misapplied to [B] losses.
        return None

    def compute_output_spec(self, inputs, mask=None):
        (encoder_out, _, labels), _, _ = self._split(inputs, mask)
        num_labels = labels.shape[1]
        return keras.KerasTensor(
            (encoder_out.shape[0], encoder_out.shape[1],
             None if num_labels is None else num_labels + 1, 2 + self.num_durations),
            dtype="float32")

    # -- decoding / export: plain TensorFlow -----------------------------------------------------
    def logits(self, encoder_out, predictor_out):
        """Full joint logits with plain TensorFlow ops (no custom op), for decoding and export.

        Args:
          encoder_out: `[B, T, D_enc]`.
          predictor_out: `[B, U+1, D_pred]`.

        Returns:
          `[B, T, U+1, vocab_size]` logits in the layer's compute dtype; for a TDT joint
          `[B, T, U+1, vocab_size + D]`: the token logits, then the duration logits.
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
                      all_frames_valid=self.all_frames_valid, gpu_kernel=self.gpu_kernel,
                      durations=self.durations)
        return config
