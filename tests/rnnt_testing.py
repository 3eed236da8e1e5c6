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
