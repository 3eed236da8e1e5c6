"""Shared pytest set-up: import paths, devices, dtypes and the GPU marker.

GPU tests: anything marked `@pytest.mark.gpu` (or parametrized over DEVICES' "gpu" entry) is
reported as SKIPPED with the reason below on machines where TensorFlow sees no GPU, never as
passed.
"""

import importlib.util
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(_TESTS_DIR)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)  # `import oracle`
if importlib.util.find_spec("tf_rnnt") is None:
    sys.path.insert(0, _REPO_ROOT)  # running from a checkout without installing the package

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

GPUS = tf.config.list_physical_devices("GPU")
for _gpu in GPUS:
    try:
        tf.config.experimental.set_memory_growth(_gpu, True)
    except RuntimeError:  # already initialized by another conftest/plugin
        pass

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


def pytest_configure(config):
    config.addinivalue_line("markers",
                            "gpu: needs a GPU; skipped with a reason when none is visible")
    config.addinivalue_line("markers", "slow: a subprocess or a large case (still part of CI)")


def pytest_collection_modifyitems(config, items):
    if GPUS:
        return
    skip = pytest.mark.skip(reason=NO_GPU_REASON)
    for item in items:
        if "gpu" in item.keywords and item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def exact_float32_matmuls():
    """TF32 off in every test: the 1e-5 float32 comparisons need exact GEMMs on GPUs (TF32 is
    TensorFlow's default there); no effect on the CPU. Benchmarks keep TensorFlow's default."""
    enabled = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    yield
    tf.config.experimental.enable_tensor_float_32_execution(enabled)


@pytest.fixture(params=DEVICES)
def device(request):
    """A TensorFlow device string: "/CPU:0", or "/GPU:0" where one is visible."""
    return request.param


@pytest.fixture(scope="session")
def gpu_device():
    if not GPUS:
        pytest.skip(NO_GPU_REASON)
    return "/GPU:0"


GRAPH_MODES = ["eager", "function", "function_dynamic_shapes"]


@pytest.fixture(params=GRAPH_MODES)
def graph_mode(request):
    """How a test calls the op: eagerly, in a tf.function traced with the static shapes, or in
    a tf.function whose input_signature leaves every dimension unknown."""
    return request.param


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
