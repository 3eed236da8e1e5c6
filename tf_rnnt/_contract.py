"""The contract of every tf_rnnt entry point: inputs, options, defaults and their checks.

One place declares what each loss accepts, so the compiled ops (`tf_rnnt.ops`), the
sample-wise loss, the reference and the Keras classes validate the same way and say the
same thing when they refuse an input. Every check takes the argument's `name` and the
`owner` (the public function or class, e.g. "tf_rnnt.rnnt_loss") and puts both in its
message.

Static problems (wrong dtype, rank, option value, statically known disagreeing sizes) raise
`ValueError` when the call is made. Value problems that may only be known at run time
(int64 values outside the int32 range, blank outside `[-V, V)` with `V` unknown) raise
`tf.errors.InvalidArgumentError` when the graph runs, eagerly at the call.
"""

import math
import numbers

import numpy as np
import tensorflow as tf

# ------------------------------------------------------------------------------------------
# Inputs.
# ------------------------------------------------------------------------------------------
#: Input names of each entry point, in argument order.
OP_INPUTS = {
    "lattice_loss": ("lattice", "logit_lengths", "label_lengths"),
    "logits_to_lattice": ("logits", "labels"),
    "rnnt_loss": ("logits", "labels", "logit_lengths", "label_lengths"),
    "joint_lattice": ("encoder", "predictor", "kernel", "bias", "labels", "logit_lengths",
                      "label_lengths"),
    "flash_rnnt_loss": ("encoder", "predictor", "kernel", "bias", "labels", "logit_lengths",
                        "label_lengths"),
    "samplewise_rnnt_loss": ("encoder", "predictor", "kernel", "bias", "labels",
                             "logit_lengths", "label_lengths"),
    "tdt_lattice_loss": ("lattice", "logit_lengths", "label_lengths"),
    "tdt_loss": ("logits", "labels", "logit_lengths", "label_lengths"),
}

#: Rank of each input, by name: `lattice [B, T, U+1, 2]`, `logits [B, T, U+1, V]`,
#: `encoder [B, T, H]`, `predictor [B, U+1, H]`, `kernel [H, V]`, `bias [V]`, `labels [B, U]`,
#: `logit_lengths [B]`, `label_lengths [B]`.
INPUT_RANKS = {
    "lattice": 4, "logits": 4, "encoder": 3, "predictor": 3, "kernel": 2, "bias": 1,
    "labels": 2, "logit_lengths": 1, "label_lengths": 1,
}

#: Floating dtypes the losses take (reduced in float32).
FLOAT_DTYPES = (tf.float32, tf.float16, tf.bfloat16)
#: Most durations a TDT loss takes (the kernels keep them in a fixed-size argument).
MAX_TDT_DURATIONS = 64
#: Integer dtypes of labels and lengths; int64 values must fit in int32.
INT_DTYPES = (tf.int32, tf.int64)
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
#: Largest value of an integer op attribute.
INT64_MAX = 2**63 - 1

# ------------------------------------------------------------------------------------------
# Options.
# ------------------------------------------------------------------------------------------
#: Joint activations: the function and its derivative as a function of the activation's
#: output (`d act / d pre = derivative(act(pre), upstream)`), with fused kernels where TF has
#: them so no `[N, H]` temporary is made.
ACTIVATIONS = {
    "tanh": (tf.tanh, lambda out, grad: tf.raw_ops.TanhGrad(y=out, dy=grad)),
    "relu": (tf.nn.relu, lambda out, grad: tf.raw_ops.ReluGrad(gradients=grad, features=out)),
    "identity": (tf.identity, lambda out, grad: grad),
}
ACTIVATION_NAMES = tuple(ACTIVATIONS)
#: Modes of the fused joint: "tiled" recomputes each tile in the backward pass, "untiled"
#: keeps the joint values and logits of all valid nodes.
MODES = ("tiled", "untiled")
#: GPU kernels of the fused joint (`gpu_kernel`): "auto" runs Hopper's fused tile kernels where
#: they apply (float16/bfloat16, H a multiple of 8 up to 640, compute capability 9.0) and the
#: cuBLAS path elsewhere; "fused" asks for the fused kernels (an error where they do not apply);
#: "cublas" for the cuBLAS path. The CPU kernels accept every value and ignore it.
GPU_KERNELS = ("auto", "fused", "cublas")

# ------------------------------------------------------------------------------------------
# Defaults.
# ------------------------------------------------------------------------------------------
#: Bytes of one tile's workspace of the fused joint on the GPU when neither tile_size nor
#: memory_budget is given.
DEFAULT_GPU_TILE_MEMORY_BUDGET = 256 * 2**20
#: The same on the CPU, where large tiles buy nothing.
DEFAULT_CPU_TILE_MEMORY_BUDGET = 64 * 2**20
#: Working-set bytes of the sample-wise loss' loop that parallel_iterations="auto" fills.
DEFAULT_SAMPLEWISE_MEMORY_BUDGET = 2 * 2**30


# ------------------------------------------------------------------------------------------
# Checks of Python options.
# ------------------------------------------------------------------------------------------
def _is_bool(value):
    return isinstance(value, (bool, np.bool_))


def check_choice(value, choices, name, owner):
    """Returns `value` if it is one of `choices` (strings), else raises ValueError."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{owner}: {name} must be one of {', '.join(map(repr, choices))}, "
                         f"got {value!r}")
    return value


def check_positive_int(value, name, owner, unit="", maximum=INT64_MAX, allow_none=True):
    """A positive Python int from an int or NumPy integer (not a bool), or None.

    Args:
      value: the argument.
      name: the argument's name, for the message.
      owner: the public function or class, for the message.
      unit: what the number counts (e.g. "bytes"), for the message.
      maximum: largest accepted value (default: the largest int64 op attribute).
      allow_none: whether None is accepted (and returned).

    Returns:
      `int(value)`, or None.

    Raises:
      ValueError: anything else, including bools, floats and values outside `[1, maximum]`.
    """
    if value is None and allow_none:
        return None
    what = f"a positive int{f' ({unit})' if unit else ''} <= {maximum}"
    if _is_bool(value) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{owner}: {name} must be {what}"
                         f"{' or None' if allow_none else ''}, got {value!r}")
    if not 1 <= int(value) <= maximum:
        raise ValueError(f"{owner}: {name} must be {what}, got {value!r}")
    return int(value)


def check_positive_number(value, name, owner, unit=""):
    """A positive finite Python float from an int, float or NumPy number (not a bool), or None."""
    if value is None:
        return None
    if (_is_bool(value) or not isinstance(value, numbers.Real) or not math.isfinite(value)
            or value <= 0):
        raise ValueError(f"{owner}: {name} must be a positive finite number"
                         f"{f' of {unit}' if unit else ''} or None, got {value!r}")
    return float(value)


def check_fastemit_lambda(value, owner, name="fastemit_lambda"):
    """FastEmit weight as a Python float: finite and >= 0, else ValueError."""
    if (_is_bool(value) or not isinstance(value, numbers.Real) or not math.isfinite(value)
            or value < 0):
        raise ValueError(f"{owner}: {name} must be a finite number >= 0, got {value!r}")
    return float(value)


def check_clamp(value, owner, name="clamp"):
    """Gradient clamp as a Python float (off when <= 0); NaN and non-numbers raise ValueError."""
    if _is_bool(value) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise ValueError(f"{owner}: {name} must be a number (<= 0 turns clamping off), "
                         f"got {value!r}")
    return float(value)


def check_durations(value, owner, name="durations"):
    """TDT durations as a tuple of Python ints, else ValueError naming the argument.

    They must be a non-empty sequence of ints (not bools) that are non-negative and strictly
    increasing (so a 0 comes first), contain 1 (a blank always advances, and a sample must be
    able to end on its last frame) and number at most `MAX_TDT_DURATIONS`.
    """
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{owner}: {name} must be a list of ints such as [0, 1, 2, 3, 4], "
                         f"got {value!r}")
    values = list(value)
    if not values or any(_is_bool(d) or not isinstance(d, numbers.Integral) for d in values):
        raise ValueError(f"{owner}: {name} must be a non-empty list of ints such as "
                         f"[0, 1, 2, 3, 4], got {value!r}")
    values = [int(d) for d in values]
    if any(d < 0 for d in values):
        raise ValueError(f"{owner}: {name} must be non-negative, got {values}")
    if any(b <= a for a, b in zip(values, values[1:])):
        raise ValueError(f"{owner}: {name} must be strictly increasing (a 0 comes first), "
                         f"got {values}")
    if 1 not in values:
        raise ValueError(f"{owner}: {name} must contain 1, got {values}")
    if len(values) > MAX_TDT_DURATIONS or values[-1] > INT32_MAX:
        raise ValueError(f"{owner}: {name} must hold at most {MAX_TDT_DURATIONS} values in the "
                         f"int32 range, got {values}")
    return tuple(values)


def check_nonnegative_number(value, name, owner):
    """A finite Python float >= 0 from an int, float or NumPy number (not a bool), else
    ValueError."""
    if (_is_bool(value) or not isinstance(value, numbers.Real) or not math.isfinite(value)
            or value < 0):
        raise ValueError(f"{owner}: {name} must be a finite number >= 0, got {value!r}")
    return float(value)


def check_probability(value, name, owner):
    """A Python float in [0, 1] from an int, float or NumPy number (not a bool), else
    ValueError."""
    if (_is_bool(value) or not isinstance(value, numbers.Real) or math.isnan(value)
            or not 0 <= value <= 1):
        raise ValueError(f"{owner}: {name} must be a number in [0, 1], got {value!r}")
    return float(value)


def check_vocabulary_size(vocab_size, name, owner):
    """ValueError when the statically known vocabulary size `vocab_size` (int or None) is 0.

    `name` is the input whose last axis is the vocabulary (e.g. "kernel", "logits").
    """
    if vocab_size == 0:
        raise ValueError(f"{owner}: {name} must have a non-empty vocabulary (last axis V >= 1), "
                         "got V = 0")


def check_blank(value, owner, vocab_size=None, name="blank"):
    """The blank index as a Python int, not yet normalized.

    It must be an integer (int or NumPy integer, not a bool or float) in the int32 range,
    and in `[-V, V)` when the vocabulary size `vocab_size` is known statically (an int);
    with an unknown `V` the range is checked at run time (`normalized_blank` or the ops).

    Raises:
      ValueError: with the argument and owner names.
    """
    if _is_bool(value) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{owner}: {name} must be an int index in [-V, V), got {value!r}")
    value = int(value)
    if vocab_size is not None and not -vocab_size <= value < vocab_size:
        raise ValueError(f"{owner}: {name} must be in [-V, V) for V = {vocab_size}, "
                         f"got {value}")
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"{owner}: {name} must be in [-V, V), got {value}")
    return value


def normalized_blank(blank, vocab_size, owner, name="blank"):
    """`blank` in `[0, V)` as an int32 tensor, checked against a possibly dynamic `V`.

    Args:
      blank: a Python int from `check_blank`, or an int32 scalar tensor.
      vocab_size: `V`, a Python int or an int32 scalar tensor.
      owner: the public function, for the message.
      name: the argument name, for the message.

    Returns:
      int32 scalar tensor `blank mod V`; when `V` is a tensor, it carries a check that
      raises InvalidArgumentError at run time if `blank` is outside `[-V, V)` (or `V` is 0).
    """
    if isinstance(vocab_size, int) and isinstance(blank, int):
        return tf.constant(check_blank(blank, owner, vocab_size, name) % vocab_size, tf.int32)
    blank = tf.convert_to_tensor(blank, tf.int32)
    vocab_size = tf.convert_to_tensor(vocab_size, tf.int32)
    check = tf.debugging.Assert(
        (vocab_size > 0) & (blank >= -vocab_size) & (blank < vocab_size),
        [f"{owner}: {name} must be in [-V, V) for the vocabulary size V; blank, V =", blank,
         vocab_size])
    with tf.control_dependencies([check]):
        return tf.math.floormod(blank, tf.maximum(vocab_size, 1))


# ------------------------------------------------------------------------------------------
# Checks of tensors.
# ------------------------------------------------------------------------------------------
def _check_rank(x, name, owner, rank):
    if rank is not None and x.shape.rank is not None and x.shape.rank != rank:
        raise ValueError(f"{owner}: {name} must have rank {rank}, got shape {x.shape}")


def float_tensor(x, name, owner, dtypes=FLOAT_DTYPES, rank=None):
    """`x` as a tensor, checked for a float dtype in `dtypes` and its rank (`INPUT_RANKS`)."""
    x = tf.convert_to_tensor(x, name=name)
    if x.dtype not in dtypes:
        raise ValueError(f"{owner}: {name} must be one of "
                         f"{', '.join(d.name for d in dtypes)}, got {x.dtype.name}")
    _check_rank(x, name, owner, INPUT_RANKS.get(name) if rank is None else rank)
    return x


def int32_tensor(x, name, owner, rank=None):
    """`x` (int32 or int64) as an int32 tensor, int64 values checked to fit first.

    An int64 value outside the int32 range would wrap around in the cast (2**32 + 2 reads as
    2), so the cast carries a check that raises InvalidArgumentError naming the argument.

    Raises:
      ValueError: for another dtype or the wrong rank (`INPUT_RANKS[name]` unless given).
    """
    x = tf.convert_to_tensor(x, name=name)
    if x.dtype not in INT_DTYPES:
        raise ValueError(f"{owner}: {name} must be int32 or int64, got {x.dtype.name}")
    _check_rank(x, name, owner, INPUT_RANKS.get(name) if rank is None else rank)
    if x.dtype == tf.int32:
        return x
    fits = tf.reduce_all((x >= INT32_MIN) & (x <= INT32_MAX))
    check = tf.debugging.Assert(
        fits, [f"{owner}: {name} holds int64 values outside the int32 range; {name} =", x],
        summarize=8)
    with tf.control_dependencies([check]):
        return tf.cast(x, tf.int32)


def check_same_dims(dims, what, owner):
    """Raises ValueError when the statically known sizes in `dims` (name -> int or None) differ.

    Args:
      dims: dict from a description (e.g. "encoder") to a static size or None.
      what: what the sizes are (e.g. "batch sizes"), for the message.
      owner: the public function, for the message.
    """
    known = {name: d for name, d in dims.items() if d is not None}
    if len(set(known.values())) > 1:
        detail = ", ".join(f"{name}: {d}" for name, d in known.items())
        raise ValueError(f"{owner}: {what} disagree: {detail}")


def lattice_lengths(lattice, logit_lengths, label_lengths, owner):
    """int32 `(logit_lengths, label_lengths)` of a lattice loss; ValueError when the statically
    known batch sizes of the lattice and both lengths disagree."""
    logit_lengths = int32_tensor(logit_lengths, "logit_lengths", owner)
    label_lengths = int32_tensor(label_lengths, "label_lengths", owner)
    check_same_dims(
        {"lattice": static_dim(lattice, 0),
         "logit_lengths": static_dim(logit_lengths, 0),
         "label_lengths": static_dim(label_lengths, 0)}, "batch sizes", owner)
    return logit_lengths, label_lengths


def check_joint_dims(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths,
                      owner):
    """ValueError when statically known sizes of a joint loss' inputs disagree.

    Batch sizes of all seven inputs, the joint width `H` of encoder, predictor and kernel, the
    vocabulary `V` of kernel and bias, and `U + 1` of predictor against labels' `U`. Unknown
    sizes are skipped (the ops check them at run time).
    """
    dim = static_dim
    check_same_dims(
        {"encoder": dim(encoder, 0), "predictor": dim(predictor, 0), "labels": dim(labels, 0),
         "logit_lengths": dim(logit_lengths, 0), "label_lengths": dim(label_lengths, 0)},
        "batch sizes", owner)
    check_same_dims(
        {"encoder": dim(encoder, 2), "predictor": dim(predictor, 2), "kernel": dim(kernel, 0)},
        "joint widths H (encoder/predictor last axis, kernel rows)", owner)
    check_same_dims({"kernel": dim(kernel, 1), "bias": dim(bias, 0)},
                             "vocabulary sizes V", owner)
    num_labels, num_states = dim(labels, 1), dim(predictor, 1)
    if num_labels is not None and num_states is not None and num_labels + 1 != num_states:
        raise ValueError(f"{owner}: labels [B, U] must have U = predictor.shape[1] - 1 = "
                         f"{num_states - 1}, got labels of shape {labels.shape}")


def static_dim(x, axis):
    """`x.shape[axis]` as an int, or None when unknown (also for an unknown rank)."""
    if x.shape.rank is None:
        return None
    return x.shape[axis]


# ------------------------------------------------------------------------------------------
# Gradients.
# ------------------------------------------------------------------------------------------
class SecondOrderGradientError(NotImplementedError):
    """Raised when a second-order gradient of a loss without one is requested."""


def first_order_only(tensors, owner, inputs=()):
    """Marks gradient tensors as not differentiable again.

    Differentiating the returned tensors raises `SecondOrderGradientError` naming `owner`,
    instead of silently returning zeros or failing with a bare LookupError. None entries pass
    through.

    Args:
      tensors: the gradient tensors (or None).
      owner: the public function, for the message.
      inputs: the loss' differentiable inputs, when `tensors` were computed from copies cut off
        by stop_gradient: they connect the mark to them, so differentiating with respect to
        them reaches the error instead of an unconnected None.
    """

    @tf.custom_gradient
    def mark(*xs):
        def backward(*unused_upstream):
            raise SecondOrderGradientError(
                f"{owner}: second-order gradients are not supported (its gradient is computed "
                "by a hand-written kernel or loop, which is not differentiable). Use "
                "tf_rnnt.reference for higher-order derivatives.")

        return [tf.identity(x) for x in xs[:len(present)]], backward

    present = [x for x in tensors if x is not None]
    if not present:
        return list(tensors)
    marked = iter(mark(*present, *inputs))
    return [None if x is None else next(marked) for x in tensors]
