"""Fixtures of the library's tests (tests/): the device, a GPU device and the graph mode.

The hooks and fixtures for every test folder are in the checkout's conftest.py; the devices,
dtypes and helpers shared by the tests are in rnnt_testing.py (import them from there). They
are importable from here too.
"""

import pytest
from rnnt_testing import (  # noqa: F401  (importable as `from conftest import ...`)
    DEVICES,
    FLOAT_DTYPES,
    GPUS,
    GRAPH_MODES,
    HALF_DTYPES,
    NO_GPU_REASON,
    compile_for,
    make_runner,
    requires_gpu,
)


@pytest.fixture(params=DEVICES)
def device(request):
    """A TensorFlow device string: "/CPU:0", or "/GPU:0" where one is visible."""
    return request.param


@pytest.fixture(scope="session")
def gpu_device():
    if not GPUS:
        pytest.skip(NO_GPU_REASON)
    return "/GPU:0"


@pytest.fixture(params=GRAPH_MODES)
def graph_mode(request):
    """How a test calls the op: eagerly, in a tf.function traced with the static shapes, or in
    a tf.function whose input_signature leaves every dimension unknown."""
    return request.param
