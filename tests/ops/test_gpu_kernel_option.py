"""The joint's gpu_kernel option ("auto", "fused", "cublas") of joint_lattice and flash_rnnt_loss.

Other values raise ValueError naming the argument. The CPU kernels accept every value and ignore
it: each one gives the float64 oracle's costs and gradients, bitwise the same across values,
eagerly, in a graph and under XLA; the gradient op takes the forward op's value.
"""

import numpy as np
import oracle
import pytest
import tensorflow as tf

import tf_rnnt

GPU_KERNELS = ["auto", "fused", "cublas"]
ENTRY_POINTS = [tf_rnnt.flash_rnnt_loss, tf_rnnt.joint_lattice]


def _problem():
    problem = oracle.float32_joint_problem(4, (3, 5, 3, 8, 11), blank=0)
    return tuple(x.astype(np.float32) for x in problem[:4]) + problem[4:]


@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("value", ["Fused", "fused-mma", "", None, 1, b"auto"])
def test_gpu_kernel_validated(fn, value):
    with pytest.raises(ValueError, match=rf"tf_rnnt\.{fn.__name__}: gpu_kernel must be one of "
                       r"'auto', 'fused', 'cublas'"):
        fn(*_problem(), gpu_kernel=value)


def _costs_and_grads(problem, gpu_kernel, jit_compile):
    def step(*args):
        params = list(args[:4])
        with tf.GradientTape() as tape:
            tape.watch(params)
            costs = tf_rnnt.flash_rnnt_loss(*args, gpu_kernel=gpu_kernel)
            total = tf.reduce_sum(costs)
        return costs, tape.gradient(total, params)

    if jit_compile is not None:
        step = tf.function(step, jit_compile=jit_compile)
    with tf.device("/CPU:0"):
        costs, grads = step(*[tf.constant(x) for x in problem])
    return costs.numpy().astype(np.float64), [g.numpy().astype(np.float64) for g in grads]


@pytest.mark.parametrize("jit_compile", [None, False, True], ids=["eager", "graph", "xla"])
def test_gpu_kernel_ignored_on_cpu(jit_compile):
    problem = _problem()
    expected = oracle.flash_rnnt_loss(*problem, 0, "tanh")
    results = {}
    for value in GPU_KERNELS:
        costs, grads = _costs_and_grads(problem, value, jit_compile)
        oracle.assert_close(costs, expected[0], 1e-5, err_msg=f"{value} costs")
        for name, g, e in zip(("encoder", "predictor", "kernel", "bias"), grads, expected[1:]):
            oracle.assert_close(g, e, 1e-5, err_msg=f"{value} d {name}")
        results[value] = [costs] + grads
    for value in GPU_KERNELS[1:]:
        for a, b in zip(results["auto"], results[value]):
            np.testing.assert_array_equal(a, b)


def test_gradient_op_gets_the_forward_gpu_kernel():
    problem = _problem()

    @tf.function
    def step(*args):
        params = list(args[:4])
        with tf.GradientTape() as tape:
            tape.watch(params)
            total = tf.reduce_sum(tf_rnnt.joint_lattice(*args, gpu_kernel="cublas"))
        return tape.gradient(total, params)

    args = [tf.constant(x) for x in problem]
    graph = step.get_concrete_function(*args).graph
    kernels = {op.type: op.get_attr("gpu_kernel") for op in graph.get_operations()
               if op.type in ("TfRnntJointLattice", "TfRnntJointLatticeGrad")}
    assert kernels == {"TfRnntJointLattice": b"cublas", "TfRnntJointLatticeGrad": b"cublas"}
