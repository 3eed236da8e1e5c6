"""What the test folders share: devices, dtypes, the GPU skip, graph modes, a runner of the
joint losses, a gradient-recording optimizer, and the checkout's folders (for the subprocesses
that tests start).

Importable in every test (tests/, examples/*/tests, benchmarks/tests) through pytest's
`pythonpath` setting in pyproject.toml, as `oracle` is.
"""

import importlib.util
import os

import keras
import numpy as np
import oracle
import pytest
import tensorflow as tf

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)
SPEECH_DIR = os.path.join(REPO_ROOT, "examples", "speech")
BENCHMARKS_DIR = os.path.join(REPO_ROOT, "benchmarks")


def pythonpath(*dirs):
    """A PYTHONPATH value for a child process: `dirs`, then the current PYTHONPATH's entries."""
    return os.pathsep.join([*dirs, os.environ.get("PYTHONPATH", "")])


GPUS = tf.config.list_physical_devices("GPU")

NO_GPU_REASON = ("needs a GPU: TensorFlow sees none on this machine "
                 "(run on the H200 for GPU coverage)")
requires_gpu = pytest.mark.skipif(not GPUS, reason=NO_GPU_REASON)

# Each test parametrized over DEVICES runs on the CPU, and on the GPU or is reported skipped.
DEVICES = [
    pytest.param("/CPU:0", id="cpu"),
    pytest.param("/GPU:0", id="gpu", marks=requires_gpu),
]
FLOAT_DTYPES = [
    pytest.param(tf.float32, id="float32"),
    pytest.param(tf.float16, id="float16"),
    pytest.param(tf.bfloat16, id="bfloat16"),
]
HALF_DTYPES = [
    pytest.param(tf.float16, id="float16"),
    pytest.param(tf.bfloat16, id="bfloat16"),
]

GRAPH_MODES = ["eager", "function", "function_dynamic_shapes"]


def load_module(name, path):
    """The Python file at `path`, executed as a fresh module called `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_for(fn, graph_mode, args):
    """`fn` wrapped for `graph_mode` ("eager", "function", "function_dynamic_shapes")."""
    if graph_mode == "eager":
        return fn
    if graph_mode == "function":
        return tf.function(fn)
    if graph_mode == "function_dynamic_shapes":
        specs = [tf.TensorSpec([None] * len(a.shape), a.dtype) for a in args]
        return tf.function(fn, input_signature=specs)
    raise ValueError(graph_mode)


def logits_loss_and_gradient(loss_fn, logits, labels, logit_lengths, label_lengths, upstream,
                             device, graph_mode, dtype, logits_source=tf.float32,
                             upstream_dtype=tf.float32, **options):
    """Costs and d (sum upstream * costs) / d logits of a logits loss, as tensors.

    `loss_fn(logits, labels, logit_lengths, label_lengths, **options)`; the logits are made
    `logits_source` then cast to `dtype`, `upstream` (ones by default) is made `upstream_dtype`.
    """
    upstream = np.ones(np.shape(logits)[0]) if upstream is None else upstream

    def step(logits, labels, logit_lengths, label_lengths, upstream):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            costs = loss_fn(logits, labels, logit_lengths, label_lengths, **options)
            total = tf.reduce_sum(costs * upstream)
        return costs, tape.gradient(total, logits)

    with tf.device(device):
        args = [tf.cast(tf.constant(logits, logits_source), dtype), tf.constant(labels),
                tf.constant(logit_lengths), tf.constant(label_lengths),
                tf.constant(upstream, upstream_dtype)]
        return compile_for(step, graph_mode, args)(*args)


def padded_rnnt_problem(seed, frame_lengths, vocab, pad):
    """A batch of 3 with label lengths [3, 1, 2] (labels `pad` past them), and oracle costs.

    Returns `(logits [3, max(frame_lengths), 4, vocab] float32, labels, frame_lengths,
    label_lengths, costs)`, the costs float64 from oracle.rnnt_loss (blank 0).
    """
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(3, max(frame_lengths), 4, vocab)).astype(np.float32)
    label_lengths = np.array([3, 1, 2])
    labels = rng.integers(1, vocab, size=(3, 3)).astype(np.int32)
    labels[np.arange(3)[None, :] >= label_lengths[:, None]] = pad
    frame_lengths = np.array(frame_lengths)
    costs, _ = oracle.rnnt_loss(logits, np.where(labels == pad, 0, labels), frame_lengths,
                                label_lengths)
    return logits, labels, frame_lengths, label_lengths, costs


def make_runner(loss_fn, device="/CPU:0", dtype=tf.float32, graph_mode="eager", **options):
    """run(problem, upstream) -> (costs, [4 gradients of sum(upstream * costs)]), float64.

    For the joint losses (`loss_fn(encoder, predictor, kernel, bias, labels, logit_lengths,
    label_lengths, **options)`); `problem` is oracle.float32_joint_problem's tuple, `upstream`
    per-sample weights (ones by default). The step is compiled once per runner."""
    def step(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths, upstream):
        params = [encoder, predictor, kernel, bias]
        with tf.GradientTape() as tape:
            tape.watch(params)
            costs = loss_fn(encoder, predictor, kernel, bias, labels, logit_lengths,
                            label_lengths, **options)
            total = tf.reduce_sum(costs * upstream)
        return costs, tape.gradient(total, params)

    compiled = {}

    def run(problem, upstream=None):
        encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths = problem
        upstream = np.ones(encoder.shape[0]) if upstream is None else upstream
        with tf.device(device):
            args = [tf.cast(tf.constant(x, tf.float32), dtype)
                    for x in (encoder, predictor, kernel, bias)]
            args += [tf.constant(labels), tf.constant(logit_lengths), tf.constant(label_lengths),
                     tf.constant(upstream, tf.float32)]
            if "fn" not in compiled:
                compiled["fn"] = compile_for(step, graph_mode, args)
            costs, grads = compiled["fn"](*args)
        assert costs.dtype == tf.float32
        assert [g.dtype for g in grads] == [dtype] * 4
        return costs.numpy().astype(np.float64), [tf.cast(g, tf.float64).numpy() for g in grads]

    return run


class GradientRecorder(keras.optimizers.Optimizer):
    """An optimizer that stores each variable's (all-reduced) gradient and changes nothing."""

    def __init__(self, **kwargs):
        super().__init__(learning_rate=0.0, **kwargs)

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.gradients = [self.add_variable_from_reference(v, name="gradient") for v in variables]

    def update_step(self, gradient, variable, learning_rate):
        gradient = tf.convert_to_tensor(gradient)  # sums an Embedding's IndexedSlices rows
        self.assign(self.gradients[self._get_variable_index(variable)], gradient)


# ---------------------------------------------------------------- the joint losses' cases
# (batch, max_t, max_u, hidden, vocab)
JOINT_SHAPES = [
    pytest.param((3, 6, 3, 8, 11), id="B3_T6_U3_H8_V11"),
    pytest.param((2, 3, 6, 5, 7), id="U_gt_T"),
    pytest.param((2, 1, 3, 4, 6), id="T1"),
    pytest.param((2, 5, 0, 4, 5), id="U0"),
]
JOINT_TILINGS = [
    pytest.param(dict(mode="untiled"), id="untiled"),
    pytest.param(dict(mode="tiled"), id="tiled_default"),
    pytest.param(dict(mode="tiled", tile_size=1), id="tile_1"),
    pytest.param(dict(mode="tiled", tile_size=7), id="tile_prime_7"),
    pytest.param(dict(mode="tiled", tile_size=1 << 20), id="tile_larger_than_lattice"),
    pytest.param(dict(mode="tiled", memory_budget=4096), id="memory_budget_4KiB"),
]
JOINT_GRAD_NAMES = ("encoder", "predictor", "kernel", "bias")

# Yardstick of the half-precision tests: the float64 oracle on the rounded half inputs is the
# exact answer; the reference run in the same precision (full logits, TF's own half kernels)
# shows what that precision costs. The op may round differently (GEMMs in half with float32
# accumulation), so it must stay within twice the reference's error plus one unit roundoff u
# (float16 2^-11, bfloat16 2^-8) of the tensor's largest entry: at most about one extra rounding.
UNIT_ROUNDOFF = {tf.float16: 2.0 ** -11, tf.bfloat16: 2.0 ** -8}


def relative_error(got, exact):
    """max |got - exact| over max |exact|."""
    return float(np.max(np.abs(np.asarray(got) - exact)) / max(np.max(np.abs(exact)), 1e-30))


def run_joint_loss(loss_fn, problem, upstream=None, device="/CPU:0", dtype=tf.float32,
                   graph_mode="eager", **options):
    """Costs and the four gradients of sum(upstream * costs), as float64 NumPy (make_runner)."""
    return make_runner(loss_fn, device, dtype, graph_mode, **options)(problem, upstream)


def compare_joint_results(got, expected, rtol=1e-5, what=""):
    """`got` = (costs, [4 gradients]) against `expected` = (costs, *4 gradients)."""
    got_costs, got_grads = got
    oracle.assert_close(got_costs, expected[0], rtol, err_msg=f"{what} costs")
    for name, g, e in zip(JOINT_GRAD_NAMES, got_grads, expected[1:]):
        oracle.assert_close(g, e, rtol, err_msg=f"{what} d {name}")


def assert_half_precision_close(got, ref, exact, dtype):
    """The UNIT_ROUNDOFF yardstick for (costs, [4 gradients]) of the op (`got`) and of the
    reference in the same precision (`ref`) against the float64 `exact` (costs, *4 gradients)."""
    u = UNIT_ROUNDOFF[dtype]
    for name, g, r, e in zip(("costs",) + JOINT_GRAD_NAMES, [got[0]] + list(got[1]),
                             [ref[0]] + list(ref[1]), exact):
        op_error, ref_error = relative_error(g, e), relative_error(r, e)
        assert op_error <= 2 * ref_error + u, (
            f"{name}: op error {op_error:.2e} vs reference {ref_error:.2e} in {dtype.name}")
