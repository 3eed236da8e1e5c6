"""The compiled RNN-T ops: lattice loss, logits-to-lattice and the fused Flash joint.

Shapes: `B` batch, `T` padded frames, `U` padded labels (`U1 = U + 1` predictor steps),
`V` vocabulary, `H` joint width. A lattice is `[B, T, U+1, 2]` float32 holding
`log P(blank | t, u)` in channel 0 and `log P(y_{u+1} | t, u)` in channel 1.
"""

import threading
import warnings

import tensorflow as tf
from tensorflow.python.framework import kernels as _kernels
from tensorflow.python.ops import control_flow_util as _control_flow_util

from tf_rnnt import _loader
from tf_rnnt import reference as _reference

__all__ = ["lattice_loss", "logits_to_lattice", "rnnt_loss", "joint_lattice", "flash_rnnt_loss",
           "library_available", "xla_kernels_available", "DEFAULT_MEMORY_BUDGET"]

ACTIVATIONS = ("tanh", "relu", "identity")
MODES = ("tiled", "untiled")
#: Bytes of one tile's workspace when neither tile_size nor memory_budget is given (GPU).
DEFAULT_MEMORY_BUDGET = 256 * 2**20
#: The same on the CPU, where large tiles buy nothing.
DEFAULT_CPU_MEMORY_BUDGET = 64 * 2**20
_FLOATS = (tf.float32, tf.float16, tf.bfloat16)


def library_available():
    """True when the compiled op library loads in this process."""
    try:
        _loader.load()
        return True
    except _loader.OpLibraryError:
        return False


def _lib():
    return _loader.load()


_XLA_LOCK = threading.Lock()
_XLA_KERNELS = None
_XLA_WARNED = set()


def xla_kernels_available():
    """True when the loaded op library has XLA kernels for every visible device kind.

    The build adds them against a TensorFlow whose wheel ships the XLA FFI (2.21: yes, 2.17: no),
    for the CPU, and for the GPU when it builds the CUDA kernels.
    """
    global _XLA_KERNELS
    with _XLA_LOCK:
        if _XLA_KERNELS is None:
            _lib()
            kernels = _kernels.get_registered_kernels_for_op("TfRnntLatticeLoss").kernel
            devices = {k.device_type for k in kernels}
            needed = {"XLA_CPU_JIT"}
            if tf.config.list_physical_devices("GPU"):
                needed.add("XLA_GPU_JIT")
            _XLA_KERNELS = needed <= devices
        return _XLA_KERNELS


def _xla_fallback(op_name, users, consequence):
    """True when tracing for XLA (`jit_compile=True`) with an op library that has no XLA kernels.

    The caller then builds the pure-TensorFlow reference math instead of the compiled op, so the
    model still compiles; one warning per op says so.
    """
    graph = tf.compat.v1.get_default_graph()
    if not _control_flow_util.GraphOrParentsInXlaContext(graph) or xla_kernels_available():
        return False
    with _XLA_LOCK:
        if op_name not in _XLA_WARNED:
            _XLA_WARNED.add(op_name)
            warnings.warn(
                f"tf_rnnt.{op_name} (used by {users}): this op library has no XLA kernels (it "
                f"was built against a TensorFlow without the XLA FFI, e.g. 2.17), so under "
                f"jit_compile tf_rnnt uses the pure-TensorFlow reference instead. {consequence}",
                stacklevel=3)
    return True


def _valid_node_mask(lattice, logit_lengths, label_lengths):
    """The compiled ops' zeros: 0 outside each sample's rectangle and in the label channel at
    `u = label_lengths[b]`."""
    shape = tf.shape(lattice)
    t_valid = tf.sequence_mask(logit_lengths, shape[1])[:, :, None]
    blank_valid = t_valid & tf.sequence_mask(label_lengths + 1, shape[2])[:, None, :]
    label_valid = t_valid & tf.sequence_mask(label_lengths, shape[2])[:, None, :]
    mask = tf.stack([blank_valid, label_valid], axis=-1)
    return tf.where(mask, lattice, tf.zeros_like(lattice))


def _int32(x, name, rank):
    x = tf.convert_to_tensor(x, name=name)
    if x.dtype not in (tf.int32, tf.int64):
        raise ValueError(f"{name} must be int32 or int64, got {x.dtype.name}")
    if x.shape.rank is not None and x.shape.rank != rank:
        raise ValueError(f"{name} must have rank {rank}, got shape {x.shape}")
    return tf.cast(x, tf.int32)


def _float(x, name, rank, dtypes=_FLOATS):
    x = tf.convert_to_tensor(x, name=name)
    if x.dtype not in dtypes:
        names = ", ".join(d.name for d in dtypes)
        raise ValueError(f"{name} must be one of {names}, got {x.dtype.name}")
    if x.shape.rank is not None and x.shape.rank != rank:
        raise ValueError(f"{name} must have rank {rank}, got shape {x.shape}")
    return x


def _same_dim(dims, what):
    """Raises ValueError when statically known dims (name -> Dimension) disagree."""
    known = {name: d for name, d in dims.items() if d is not None}
    if len(set(known.values())) > 1:
        detail = ", ".join(f"{name}: {d}" for name, d in known.items())
        raise ValueError(f"{what} disagree: {detail}")


def lattice_loss(lattice, logit_lengths, label_lengths, fastemit_lambda=0.0, clamp=-1.0):
    """Exact RNN-T loss of a lattice of log-probabilities.

    Alpha/beta recursions in log space (Graves 2012) on `[B, T, U+1, 2]`; the registered
    gradient is d cost / d lattice, computed in the same op and scaled by the upstream
    gradient. Nodes outside each sample's `(logit_length, label_length + 1)` rectangle are
    never read and get a zero gradient.

    Args:
      lattice: `[B, T, U+1, 2]` float32: `log P(blank|t,u)`, `log P(y_{u+1}|t,u)`.
      logit_lengths: `[B]` int32/int64 in `[1, T]`.
      label_lengths: `[B]` int32/int64 in `[0, U]`.
      fastemit_lambda: FastEmit weight (Yu et al. 2021): the label-emission gradient is scaled
        by `1 + fastemit_lambda`; the cost is unchanged.
      clamp: clamps d cost / d lattice to `[-clamp, clamp]`; off when <= 0.

    Returns:
      `[B]` float32 costs, `-log P(y|x)`.

    Example:
      >>> costs = tf_rnnt.lattice_loss(lattice, logit_lengths, label_lengths)
    """
    lattice = _float(lattice, "lattice", 4)
    lattice = tf.cast(lattice, tf.float32)
    if lattice.shape.rank == 4 and lattice.shape[3] is not None and lattice.shape[3] != 2:
        raise ValueError(f"lattice must have shape [B, T, U+1, 2], got {lattice.shape}")
    logit_lengths = _int32(logit_lengths, "logit_lengths", 1)
    label_lengths = _int32(label_lengths, "label_lengths", 1)
    _same_dim({"lattice": lattice.shape[0], "logit_lengths": logit_lengths.shape[0],
               "label_lengths": label_lengths.shape[0]}, "batch sizes")
    if _xla_fallback("lattice_loss", "keras.FlashRNNTLoss and keras.RNNTLoss",
                     "Lengths are not validated there."):
        return _reference.lattice_loss(lattice, logit_lengths, label_lengths,
                                       float(fastemit_lambda), float(clamp))
    costs, _ = _lib().tf_rnnt_lattice_loss(
        lattice, logit_lengths, label_lengths, logit_lengths, label_lengths,
        fastemit_lambda=float(fastemit_lambda), clamp=float(clamp))
    return costs


@tf.RegisterGradient("TfRnntLatticeLoss")
def _lattice_loss_grad(op, d_costs, unused_d_grads):
    return [op.outputs[1] * d_costs[:, None, None, None], None, None, None, None]


def _logits_to_lattice(logits, labels, blank, label_lengths):
    logits = _float(logits, "logits", 4)
    labels = _int32(labels, "labels", 2)
    _same_dim({"logits": logits.shape[0], "labels": labels.shape[0]}, "batch sizes")
    if labels.shape[1] is not None and logits.shape[2] is not None and \
            labels.shape[1] + 1 != logits.shape[2]:
        raise ValueError(f"labels [B, U] must have U = logits.shape[2] - 1 = {logits.shape[2] - 1}"
                         f", got labels of shape {labels.shape}")
    if _xla_fallback("logits_to_lattice", "keras.RNNTLoss", "Labels are not validated there."):
        return _reference.lattice_from_logits(logits, labels, blank)
    validate = label_lengths is not None
    if validate:
        labels_host, lengths_host = labels, label_lengths
    else:
        labels_host, lengths_host = tf.zeros([0, 0], tf.int32), tf.zeros([0], tf.int32)
    lattice, _ = _lib().tf_rnnt_logits_to_lattice(
        logits, labels, labels_host, lengths_host, blank=int(blank), validate_labels=validate)
    return lattice


def logits_to_lattice(logits, labels, blank=0):
    """Log-softmax picks of full logits, without materializing the log-softmax.

    One fused kernel computes the log-sum-exp over `V` and gathers blank and the next label;
    the gradient forms `d logits = g_blank * (onehot(blank) - softmax) + g_label *
    (onehot(label) - softmax)` in one kernel, writing into the logits' buffer when TensorFlow
    can forward it.

    Args:
      logits: `[B, T, U+1, V]` float32/float16/bfloat16.
      labels: `[B, U]` int32/int64. Values outside `[0, V)` (padding) give 0 in the label
        channel, as does `u = U`.
      blank: blank index in `[-V, V)`; negative counts from the end.

    Returns:
      `[B, T, U+1, 2]` float32 lattice.
    """
    return _logits_to_lattice(logits, labels, blank, None)


@tf.RegisterGradient("TfRnntLogitsToLattice")
def _logits_to_lattice_grad(op, d_lattice, unused_d_lse):
    d_logits = _lib().tf_rnnt_logits_to_lattice_grad(
        op.inputs[0], op.inputs[1], op.outputs[1], d_lattice, blank=op.get_attr("blank"))
    return [d_logits, None, None, None]


def rnnt_loss(logits, labels, logit_lengths, label_lengths, blank=0, fastemit_lambda=0.0,
              clamp=-1.0):
    """RNN-T loss on full logits: `lattice_loss(logits_to_lattice(logits, labels))`.

    For models that already compute `[B, T, U+1, V]` logits; only the log-softmax is saved
    (it is never materialized), so memory is the logits and their gradient.

    Args:
      logits: `[B, T, U+1, V]` float32/float16/bfloat16 (reduced in float32).
      labels: `[B, U]` int32/int64; entries beyond label_lengths are ignored.
      logit_lengths: `[B]` int in `[1, T]`.
      label_lengths: `[B]` int in `[0, U]`.
      blank: blank index; negative counts from the end.
      fastemit_lambda: FastEmit weight; see `lattice_loss`.
      clamp: gradient clamp on d cost / d lattice; off when <= 0.

    Returns:
      `[B]` float32 costs.

    Example:
      >>> costs = tf_rnnt.rnnt_loss(logits, labels, logit_lengths, label_lengths, blank=0)
      >>> loss = tf.reduce_mean(costs)
    """
    label_lengths = _int32(label_lengths, "label_lengths", 1)
    lattice = _logits_to_lattice(logits, labels, blank, label_lengths)
    return lattice_loss(lattice, logit_lengths, label_lengths, fastemit_lambda, clamp)


def _joint_attrs(activation, mode, tile_size, memory_budget, blank):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if tile_size is not None and (not isinstance(tile_size, int) or tile_size < 1):
        raise ValueError(f"tile_size must be a positive int (lattice nodes per tile), got {tile_size!r}")
    if memory_budget is not None and (not isinstance(memory_budget, int) or memory_budget < 1):
        raise ValueError(f"memory_budget must be a positive int (bytes), got {memory_budget!r}")
    return dict(blank=int(blank), activation=activation, untiled=mode == "untiled",
                tile_nodes=tile_size or 0, memory_budget=memory_budget or 0,
                allow_tf32=tf.config.experimental.tensor_float_32_execution_enabled())


def joint_lattice(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths, blank=0,
                  activation="tanh", mode="tiled", tile_size=None, memory_budget=None):
    """Fused RNN-T joint: the lattice of `log_softmax(act(enc + pred) @ kernel + bias)`.

    Computes, for every valid node `(b, t, u)`, `log P(blank)` and `log P(labels[b, u])` of
    `log_softmax(act(encoder[b, t] + predictor[b, u]) @ kernel + bias)` without ever holding
    the `[B, T, U+1, V]` logits. Valid nodes (`t < logit_lengths[b]`,
    `u <= label_lengths[b]`) are packed and processed in tiles: padding costs no work.

    mode="tiled" keeps only per-node statistics (the log-sum-exp) and recomputes each tile's
    joint values and logits in the backward pass. mode="untiled" keeps the joint values
    `[N, H]` and float32 logits `[N, V]` (N = valid nodes) from the forward pass and
    overwrites the logits with their gradient in the backward pass.

    The tile is `tile_size` nodes, else as many as fit `memory_budget` bytes of workspace
    (default `DEFAULT_MEMORY_BUDGET` = 256 MiB on the GPU, `DEFAULT_CPU_MEMORY_BUDGET` = 64 MiB
    on the CPU). A tile node needs about `4 * (2 H + V)` bytes in float32 (plus `2 V` for
    float16/bfloat16 inputs on the GPU).
    If the workspace cannot be allocated the op halves the tile, down to 1024 nodes, then
    raises ResourceExhaustedError.

    Under XLA (`jit_compile=True`) the op lowers to a custom call on the same kernels and always
    runs tiled (mode="untiled" keeps nothing there).

    GEMMs run in the input dtype with float32 accumulation (TF32 when TensorFlow allows it,
    `tf.config.experimental.enable_tensor_float_32_execution`); log-sum-exp and the lattice
    are float32. Results are deterministic (no atomics).

    Args:
      encoder: `[B, T, H]` projected encoder output (float32/float16/bfloat16).
      predictor: `[B, U+1, H]` projected predictor output, same dtype.
      kernel: `[H, V]` output layer, same dtype.
      bias: `[V]`, same dtype.
      labels: `[B, U]` int32/int64, in `[0, V)` and != blank within label_lengths.
      logit_lengths: `[B]` int in `[1, T]`.
      label_lengths: `[B]` int in `[0, U]`.
      blank: blank index; negative counts from the end.
      activation: "tanh", "relu" or "identity".
      mode: "tiled" or "untiled".
      tile_size: lattice nodes per tile (tiled mode).
      memory_budget: bytes for one tile's workspace (tiled mode).

    Returns:
      `[B, T, U+1, 2]` float32 lattice; 0 (with zero gradient) outside the valid nodes and in
      the label channel at `u = label_lengths[b]`.

    Example:
      >>> lattice = tf_rnnt.joint_lattice(enc, pred, kernel, bias, labels, t_len, u_len)
      >>> costs = tf_rnnt.lattice_loss(lattice, t_len, u_len)
    """
    attrs = _joint_attrs(activation, mode, tile_size, memory_budget, blank)
    encoder = _float(encoder, "encoder", 3)
    predictor = _float(predictor, "predictor", 3)
    kernel = _float(kernel, "kernel", 2)
    bias = _float(bias, "bias", 1)
    for name, x in (("predictor", predictor), ("kernel", kernel), ("bias", bias)):
        if x.dtype != encoder.dtype:
            raise ValueError(f"{name} must have the encoder's dtype {encoder.dtype.name}, "
                             f"got {x.dtype.name}")
    labels = _int32(labels, "labels", 2)
    logit_lengths = _int32(logit_lengths, "logit_lengths", 1)
    label_lengths = _int32(label_lengths, "label_lengths", 1)
    _same_dim({"encoder": encoder.shape[0], "predictor": predictor.shape[0],
               "labels": labels.shape[0], "logit_lengths": logit_lengths.shape[0],
               "label_lengths": label_lengths.shape[0]}, "batch sizes")
    _same_dim({"encoder": encoder.shape[2], "predictor": predictor.shape[2],
               "kernel": kernel.shape[0]}, "joint widths H (encoder/predictor last axis, kernel rows)")
    _same_dim({"kernel": kernel.shape[1], "bias": bias.shape[0]}, "vocabulary sizes V")
    if labels.shape[1] is not None and predictor.shape[1] is not None and \
            labels.shape[1] + 1 != predictor.shape[1]:
        raise ValueError(f"labels [B, U] must have U = predictor.shape[1] - 1 = "
                         f"{predictor.shape[1] - 1}, got labels of shape {labels.shape}")
    if _xla_fallback("joint_lattice", "keras.RNNTJoint", "It materializes the full "
                     "[B, T, U+1, V] logits: rebuild the library against TensorFlow 2.21 "
                     "for XLA kernels, or compile the model with jit_compile=False to keep the "
                     "fused, tiled joint."):
        lattice = _reference.joint_lattice(encoder, predictor, kernel, bias, labels, blank,
                                           activation)
        return _valid_node_mask(lattice, logit_lengths, label_lengths)
    lattice, _, _, _ = _lib().tf_rnnt_joint_lattice(
        encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths, labels,
        logit_lengths, label_lengths, **attrs)
    return lattice


_JOINT_ATTR_NAMES = ("blank", "activation", "untiled", "tile_nodes", "memory_budget", "allow_tf32")


@tf.RegisterGradient("TfRnntJointLattice")
def _joint_lattice_grad(op, d_lattice, unused_d_lse, unused_d_hidden, unused_d_logits):
    inputs = op.inputs
    lattice, lse, saved_hidden, saved_logits = op.outputs
    if d_lattice is None:
        d_lattice = tf.zeros_like(lattice)
    attrs = {name: op.get_attr(name) for name in _JOINT_ATTR_NAMES}
    if isinstance(attrs["activation"], bytes):
        attrs["activation"] = attrs["activation"].decode()
    grads = _lib().tf_rnnt_joint_lattice_grad(
        inputs[0], inputs[1], inputs[2], inputs[3], inputs[4], inputs[5], inputs[6], inputs[5],
        inputs[6], lse, d_lattice, saved_hidden, saved_logits, **attrs)
    return list(grads) + [None] * 6


def flash_rnnt_loss(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths, blank=0,
                    activation="tanh", mode="tiled", tile_size=None, memory_budget=None,
                    fastemit_lambda=0.0, clamp=-1.0):
    """Flash RNN-T loss: `lattice_loss(joint_lattice(...))`, costs `[B]`.

    The joint, output layer and log-softmax run fused and tiled (see `joint_lattice`), so the
    `[B, T, U+1, V]` logits and their gradient never exist at once. Arguments as in
    `joint_lattice` and `lattice_loss`.

    Example:
      >>> costs = tf_rnnt.flash_rnnt_loss(enc, pred, kernel, bias, labels, t_len, u_len)
    """
    lattice = joint_lattice(encoder, predictor, kernel, bias, labels, logit_lengths,
                            label_lengths, blank, activation, mode, tile_size, memory_budget)
    return lattice_loss(lattice, logit_lengths, label_lengths, fastemit_lambda, clamp)
