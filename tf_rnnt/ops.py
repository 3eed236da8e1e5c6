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

from tf_rnnt import _contract as contract
from tf_rnnt import _loader
from tf_rnnt import reference as _reference

__all__ = ["lattice_loss", "logits_to_lattice", "rnnt_loss", "joint_lattice", "flash_rnnt_loss",
           "library_available", "xla_kernels_available", "DEFAULT_MEMORY_BUDGET"]

ACTIVATIONS = contract.ACTIVATION_NAMES
MODES = contract.MODES
#: Bytes of one tile's workspace when neither tile_size nor memory_budget is given (GPU).
DEFAULT_MEMORY_BUDGET = contract.DEFAULT_GPU_TILE_MEMORY_BUDGET
#: The same on the CPU, where large tiles buy nothing.
DEFAULT_CPU_MEMORY_BUDGET = contract.DEFAULT_CPU_TILE_MEMORY_BUDGET


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
    for the CPU, and for the GPU when it builds the CUDA kernels. Where this is False, the ops
    fall back to the pure-TensorFlow reference math under XLA (`jit_compile=True`).
    """
    global _XLA_KERNELS
    with _XLA_LOCK:
        if _XLA_KERNELS is None:
            _XLA_KERNELS = _needed_xla_devices() <= _registered_kernel_devices()
        return _XLA_KERNELS


def _needed_xla_devices():
    if tf.config.list_physical_devices("GPU"):
        return {"XLA_CPU_JIT", "XLA_GPU_JIT"}
    return {"XLA_CPU_JIT"}


def _registered_kernel_devices():
    _lib()
    kernels = _kernels.get_registered_kernels_for_op("TfRnntLatticeLoss").kernel
    return {k.device_type for k in kernels}


def _no_xla_kernels_reason():
    """Why `xla_kernels_available()` is False, as a clause for messages."""
    if "XLA_CPU_JIT" in _registered_kernel_devices():
        return ("this op library has no GPU XLA kernels (it was built without CUDA) and a GPU "
                "is visible")
    return ("this op library has no XLA kernels (it was built against a TensorFlow without the "
            "XLA FFI, e.g. 2.17)")


def _xla_fallback(op_name, users, consequence):
    """True when tracing for XLA (`jit_compile=True`) where tf_rnnt's XLA kernels are not usable
    (a library without XLA kernels, or without GPU ones and a visible GPU).

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
                f"tf_rnnt.{op_name} (used by {users}): {_no_xla_kernels_reason()}, so under "
                f"jit_compile tf_rnnt uses the pure-TensorFlow reference instead. {consequence}",
                stacklevel=3)
    return True


class XlaCheckUnavailableError(ValueError):
    """An input check cannot run under XLA with this op library (see `check`)."""


def check(value, ok, message, data=None):
    """`value` unchanged once every entry of `ok` is true; else InvalidArgumentError(message),
    followed by the entries of `data` when given.

    A compiled op (TfRnntCheck) that stays in the data flow, so it runs under XLA too, where
    tf.debugging assertions are dropped: thread a small tensor that feeds the computation through
    it (e.g. the label lengths). Its gradient is the upstream gradient.

    Args:
      value: int32 or float32 tensor.
      ok: bool tensor of any shape.
      message: the error message.
      data: None, or an int tensor of details for the message (e.g. the offending ids), of a
        static size under XLA (no boolean_mask or single-argument where).

    Raises:
      XlaCheckUnavailableError: when traced for XLA and the op library has no XLA kernels for
        the visible devices (the check could not run; compile without jit_compile).
    """
    graph = tf.compat.v1.get_default_graph()
    if _control_flow_util.GraphOrParentsInXlaContext(graph) and not xla_kernels_available():
        raise XlaCheckUnavailableError(
            f"{message.split(':')[0]}: an input check cannot run under XLA: "
            f"{_no_xla_kernels_reason()}. Compile without XLA (jit_compile=False).")
    value = tf.convert_to_tensor(value)
    data = tf.zeros([0], tf.int32) if data is None else tf.cast(tf.reshape(data, [-1]), tf.int32)
    return _lib().tf_rnnt_check(value, tf.cast(ok, tf.bool), data, message=message)


@tf.RegisterGradient("TfRnntCheck")
def _check_grad(_, upstream):
    return upstream, None, None


def _valid_node_mask(lattice, logit_lengths, label_lengths, num_durations=0):
    """The compiled ops' zeros: 0 outside each sample's rectangle and in the label channel at
    `u = label_lengths[b]` (a TDT lattice's duration channels as its blank channel)."""
    shape = tf.shape(lattice)
    t_valid = tf.sequence_mask(logit_lengths, shape[1])[:, :, None]
    blank_valid = t_valid & tf.sequence_mask(label_lengths + 1, shape[2])[:, None, :]
    label_valid = t_valid & tf.sequence_mask(label_lengths, shape[2])[:, None, :]
    mask = tf.stack([blank_valid, label_valid] + [blank_valid] * num_durations, axis=-1)
    return tf.where(mask, lattice, tf.zeros_like(lattice))


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
    return _lattice_loss(lattice, logit_lengths, label_lengths, fastemit_lambda, clamp,
                         "tf_rnnt.lattice_loss")


def _lattice_loss(lattice, logit_lengths, label_lengths, fastemit_lambda, clamp, owner,
                  lengths_validated=False):
    """`lattice_loss`; with `lengths_validated` the caller guarantees logit lengths in `[0, T]`
    and label lengths in `[0, U]`, and the op reads them on its device only (no host copy, so
    lengths computed on the GPU late in a step do not stall it). The caller must reject samples
    with 0 frames: their cost is undefined (their gradient is 0)."""
    fastemit_lambda = contract.check_fastemit_lambda(fastemit_lambda, owner)
    clamp = contract.check_clamp(clamp, owner)
    lattice = contract.float_tensor(lattice, "lattice", owner)
    lattice = tf.cast(lattice, tf.float32)
    if contract.static_dim(lattice, 3) not in (None, 2):
        raise ValueError(f"{owner}: lattice must have shape [B, T, U+1, 2], got {lattice.shape}")
    logit_lengths, label_lengths = contract.lattice_lengths(lattice, logit_lengths, label_lengths,
                                                           owner)
    if _xla_fallback("lattice_loss", "keras.FlashRNNTLoss and keras.RNNTLoss",
                     "Lengths are not validated there."):
        return _reference.lattice_loss(lattice, logit_lengths, label_lengths,
                                       float(fastemit_lambda), float(clamp))
    if lengths_validated:
        logit_lengths_host = label_lengths_host = tf.zeros([0], tf.int32)
    else:
        logit_lengths_host, label_lengths_host = logit_lengths, label_lengths
    costs, _ = _lib().tf_rnnt_lattice_loss(
        lattice, logit_lengths, label_lengths, logit_lengths_host, label_lengths_host,
        fastemit_lambda=fastemit_lambda, clamp=clamp, validate_lengths=not lengths_validated)
    return costs


@tf.RegisterGradient("TfRnntLatticeLoss")
def _lattice_loss_grad(op, d_costs, unused_d_grads):
    # The op's second output is d cost / d lattice; its own derivative (the Hessian) is not
    # computed, so differentiating it again must fail rather than give zeros.
    grads, = contract.first_order_only(
        [op.outputs[1]], "tf_rnnt.lattice_loss (and rnnt_loss, flash_rnnt_loss)")
    return [grads * d_costs[:, None, None, None], None, None, None, None]


def _logits_to_lattice(logits, labels, blank, label_lengths, owner):
    logits = contract.float_tensor(logits, "logits", owner)
    contract.check_vocabulary_size(contract.static_dim(logits, 3), "logits", owner)
    blank = contract.check_blank(blank, owner, contract.static_dim(logits, 3))
    labels = contract.int32_tensor(labels, "labels", owner)
    contract.check_same_dims({"logits": contract.static_dim(logits, 0),
                              "labels": contract.static_dim(labels, 0)}, "batch sizes", owner)
    num_labels, num_states = contract.static_dim(labels, 1), contract.static_dim(logits, 2)
    if num_labels is not None and num_states is not None and num_labels + 1 != num_states:
        raise ValueError(f"{owner}: labels [B, U] must have U = logits.shape[2] - 1 = "
                         f"{num_states - 1}, got labels of shape {labels.shape}")
    if _xla_fallback("logits_to_lattice", "keras.RNNTLoss", "Labels are not validated there."):
        return _reference.lattice_from_logits(logits, labels, blank)
    validate = label_lengths is not None
    if validate:
        labels_host, lengths_host = labels, label_lengths
    else:
        labels_host, lengths_host = tf.zeros([0, 0], tf.int32), tf.zeros([0], tf.int32)
    lattice, _ = _lib().tf_rnnt_logits_to_lattice(
        logits, labels, labels_host, lengths_host, blank=blank, validate_labels=validate)
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
    return _logits_to_lattice(logits, labels, blank, None, "tf_rnnt.logits_to_lattice")


@tf.RegisterGradient("TfRnntLogitsToLattice")
def _logits_to_lattice_grad(op, d_lattice, unused_d_lse):
    d_logits = _lib().tf_rnnt_logits_to_lattice_grad(
        op.inputs[0], op.inputs[1], op.outputs[1], d_lattice, blank=op.get_attr("blank"))
    d_logits, = contract.first_order_only([d_logits],
                                          "tf_rnnt.logits_to_lattice (and rnnt_loss, tdt_loss)")
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
    owner = "tf_rnnt.rnnt_loss"
    fastemit_lambda = contract.check_fastemit_lambda(fastemit_lambda, owner)
    clamp = contract.check_clamp(clamp, owner)
    label_lengths = contract.int32_tensor(label_lengths, "label_lengths", owner)
    lattice = _logits_to_lattice(logits, labels, blank, label_lengths, owner)
    return _lattice_loss(lattice, logit_lengths, label_lengths, fastemit_lambda, clamp, owner)


def _joint_attrs(activation, mode, tile_size, memory_budget, gpu_kernel, blank, vocab_size,
                 owner, num_durations=0):
    contract.check_choice(activation, contract.ACTIVATION_NAMES, "activation", owner)
    contract.check_choice(mode, contract.MODES, "mode", owner)
    contract.check_choice(gpu_kernel, contract.GPU_KERNELS, "gpu_kernel", owner)
    tile_size = contract.check_positive_int(tile_size, "tile_size", owner, "lattice nodes per tile")
    memory_budget = contract.check_positive_int(memory_budget, "memory_budget", owner, "bytes")
    return dict(blank=contract.check_blank(blank, owner, vocab_size), activation=activation,
                untiled=mode == "untiled", tile_nodes=tile_size or 0,
                memory_budget=memory_budget or 0, gpu_kernel=gpu_kernel,
                allow_tf32=tf.config.experimental.tensor_float_32_execution_enabled(),
                num_durations=num_durations)


def joint_lattice(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths, blank=0,
                  activation="tanh", mode="tiled", tile_size=None, memory_budget=None,
                  gpu_kernel="auto", durations=None):
    """Fused RNN-T joint: the lattice of `log_softmax(act(enc + pred) @ kernel + bias)`.

    Computes, for every valid node `(b, t, u)`, `log P(blank)` and `log P(labels[b, u])` of
    `log_softmax(act(encoder[b, t] + predictor[b, u]) @ kernel + bias)` without ever holding
    the `[B, T, U+1, V]` logits. Valid nodes (`t < logit_lengths[b]`,
    `u <= label_lengths[b]`) are packed and processed in tiles: padding costs no work.

    mode="tiled" keeps only per-node statistics (the log-sum-exp) and recomputes each tile's
    joint values and logits in the backward pass. mode="untiled" keeps the joint values
    `[N, H]` and the logits `[N, V]` (N = valid nodes) from the forward pass and
    overwrites the logits with their gradient in the backward pass: float32 logits, except
    where the GPU's fused tile kernels run (16-bit inputs), which keep them in the input dtype
    as tiled mode rounds them.

    The tile is `tile_size` nodes, else as many as fit `memory_budget` bytes of workspace
    (default `DEFAULT_MEMORY_BUDGET` = 256 MiB on the GPU, `DEFAULT_CPU_MEMORY_BUDGET` = 64 MiB
    on the CPU). A tile node needs about `4 * (2 H + V)` bytes in float32 (plus `2 V` for
    float16/bfloat16 inputs on the GPU).
    If the workspace cannot be allocated the op halves the tile, down to 1024 nodes, then
    raises ResourceExhaustedError.

    Under XLA (`jit_compile=True`) the op lowers to a custom call on the same CPU/CUDA kernels
    and always runs tiled (mode="untiled" keeps nothing there); XLA allocates the workspace for
    the tile of a batch with every node valid, and the tile is never halved. With a library
    built against TensorFlow 2.17 (no XLA kernels) the op falls back under XLA to the
    pure-TensorFlow reference, which materializes the full `[B, T, U+1, V]` logits; compile
    with `jit_compile=False` to keep the fused joint.

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
      gpu_kernel: the joint's GPU kernels: "auto" (Hopper's fused tile kernels where they
        apply: float16/bfloat16, H a multiple of 8 up to 640, compute capability 9.0; else
        the cuBLAS path), "fused" (the fused kernels; InvalidArgumentError where they do not
        apply) or "cublas" (element-wise kernels around cuBLAS GEMMs). The gradient uses the
        same kernels. Accepted and ignored on the CPU. A TDT joint (`durations`) runs the
        cuBLAS path under "auto"; "fused" raises InvalidArgumentError.
      durations: None (RNN-T), or a TDT joint's durations (see `tf_rnnt.flash_tdt_loss`):
        the last `D = len(durations)` columns of `kernel` and `bias` are duration logits with
        their own log-softmax, and the lattice gains `D` channels `log P(durations[i])`.

    Returns:
      `[B, T, U+1, 2]` float32 lattice (`[B, T, U+1, 2 + D]` with durations; its token channels
      carry no `sigma`); 0 (with zero gradient) outside the valid nodes and in the label channel
      at `u = label_lengths[b]`.

    Example:
      >>> lattice = tf_rnnt.joint_lattice(enc, pred, kernel, bias, labels, t_len, u_len)
      >>> costs = tf_rnnt.lattice_loss(lattice, t_len, u_len)
    """
    owner = "tf_rnnt.joint_lattice"
    durations = () if durations is None else contract.check_durations(durations, owner)
    return _joint_lattice(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths,
                          blank, activation, mode, tile_size, memory_budget, gpu_kernel, owner,
                          durations)


def _joint_lattice(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths, blank,
                   activation, mode, tile_size, memory_budget, gpu_kernel, owner, durations=()):
    # durations: a TDT joint's (checked by the caller): the kernel's last len(durations) columns.
    num_durations = len(durations)
    encoder, predictor, kernel, bias = (
        contract.float_tensor(x, name, owner) for name, x in
        (("encoder", encoder), ("predictor", predictor), ("kernel", kernel), ("bias", bias)))
    width = contract.static_dim(kernel, 1)
    if num_durations and width is not None and width <= num_durations:
        raise ValueError(f"{owner}: kernel must have shape [H, V + D] with V >= 1 token columns "
                         f"and D = len(durations) = {num_durations} duration columns, got "
                         f"{kernel.shape}")
    vocab_size = None if width is None else width - num_durations
    contract.check_vocabulary_size(vocab_size, "kernel", owner)
    attrs = _joint_attrs(activation, mode, tile_size, memory_budget, gpu_kernel, blank,
                         vocab_size, owner, num_durations)
    for name, x in (("predictor", predictor), ("kernel", kernel), ("bias", bias)):
        if x.dtype != encoder.dtype:
            raise ValueError(f"{owner}: {name} must have the encoder's dtype "
                             f"{encoder.dtype.name}, got {x.dtype.name}")
    labels, logit_lengths, label_lengths = (
        contract.int32_tensor(x, name, owner) for name, x in
        (("labels", labels), ("logit_lengths", logit_lengths), ("label_lengths", label_lengths)))
    contract.check_joint_dims(encoder, predictor, kernel, bias, labels, logit_lengths,
                              label_lengths, owner)
    if _xla_fallback("joint_lattice", "keras.RNNTJoint", "It materializes the full "
                     "[B, T, U+1, V] logits: compile the model with jit_compile=False to keep "
                     "the fused, tiled joint."):
        if num_durations:
            logits = _reference.joint_logits(encoder, predictor, kernel, bias, activation)
            lattice = _reference.tdt_lattice_from_logits(logits, labels, durations,
                                                         attrs["blank"])
        else:
            lattice = _reference.joint_lattice(encoder, predictor, kernel, bias, labels,
                                               attrs["blank"], activation)
        return _valid_node_mask(lattice, logit_lengths, label_lengths, num_durations)
    lattice, _, _, _ = _lib().tf_rnnt_joint_lattice(
        encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths, labels,
        logit_lengths, label_lengths, **attrs)
    return lattice


_JOINT_ATTR_NAMES = ("blank", "activation", "untiled", "tile_nodes", "memory_budget", "allow_tf32",
                     "gpu_kernel", "num_durations")


@tf.RegisterGradient("TfRnntJointLattice")
def _joint_lattice_grad(op, d_lattice, unused_d_lse, unused_d_hidden, unused_d_logits):
    inputs = op.inputs
    lattice, lse, saved_hidden, saved_logits = op.outputs
    if d_lattice is None:
        d_lattice = tf.zeros_like(lattice)
    attrs = {name: op.get_attr(name) for name in _JOINT_ATTR_NAMES}
    for name in ("activation", "gpu_kernel"):
        if isinstance(attrs[name], bytes):
            attrs[name] = attrs[name].decode()
    grads = _lib().tf_rnnt_joint_lattice_grad(
        inputs[0], inputs[1], inputs[2], inputs[3], inputs[4], inputs[5], inputs[6], inputs[5],
        inputs[6], lse, d_lattice, saved_hidden, saved_logits, **attrs)
    return contract.first_order_only(
        list(grads), "tf_rnnt.joint_lattice (and flash_rnnt_loss)") + [None] * 6


def flash_rnnt_loss(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths, blank=0,
                    activation="tanh", mode="tiled", tile_size=None, memory_budget=None,
                    fastemit_lambda=0.0, clamp=-1.0, gpu_kernel="auto"):
    """Flash RNN-T loss: `lattice_loss(joint_lattice(...))`, costs `[B]`.

    The joint, output layer and log-softmax run fused and tiled (see `joint_lattice`), so the
    `[B, T, U+1, V]` logits and their gradient never exist at once. Arguments as in
    `joint_lattice` and `lattice_loss`.

    Example:
      >>> costs = tf_rnnt.flash_rnnt_loss(enc, pred, kernel, bias, labels, t_len, u_len)
    """
    owner = "tf_rnnt.flash_rnnt_loss"
    fastemit_lambda = contract.check_fastemit_lambda(fastemit_lambda, owner)
    clamp = contract.check_clamp(clamp, owner)
    lattice = _joint_lattice(encoder, predictor, kernel, bias, labels, logit_lengths,
                             label_lengths, blank, activation, mode, tile_size, memory_budget,
                             gpu_kernel, owner)
    return _lattice_loss(lattice, logit_lengths, label_lengths, fastemit_lambda, clamp, owner)
