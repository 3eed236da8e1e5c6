"""pytest set-up for every test folder of the checkout (tests/, examples/*/tests,
benchmarks/tests): TensorFlow's log level, GPU memory growth, the GPU skip and exact float32
GEMMs. Markers and import paths are in pyproject.toml ([tool.pytest.ini_options]).

GPU tests: anything marked `@pytest.mark.gpu` (or parametrized over DEVICES' "gpu" entry) is
reported as SKIPPED with the reason below on machines where TensorFlow sees no GPU, never as
passed.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from rnnt_testing import GPUS, NO_GPU_REASON  # noqa: E402

for _gpu in GPUS:
    try:
        tf.config.experimental.set_memory_growth(_gpu, True)
    except RuntimeError:  # already initialized by another conftest/plugin
        pass


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
