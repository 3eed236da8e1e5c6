"""Sample-wise RNN-T: tf_rnnt.samplewise_rnnt_loss.

Checked against two oracles that share no code with it: the float64 NumPy oracle
(tests/oracle.py, alpha/beta by explicit loops) and tf_rnnt.reference.flash_rnnt_loss (full
logits, autodiff). float32: costs and all four gradients within 1e-5 relative to each
tensor's scale (oracle.assert_close), for parallel_iterations 1, 2, 7 and "auto", every
activation, blank first/middle/last, uniform and per-sample upstream gradients (the latter
takes the weighted recomputation path), eagerly and in tf.function with unknown shapes.
Also: FastEmit, half precision, the compiled flash op, the While ops' parallel_iterations
(and which loop "auto" runs), MirroredStrategy (subprocess), Keras mixed precision and labels
outside their lengths. The float32 comparisons run with TF32 matmuls off.
"""

import json
import os
import subprocess
import sys

import numpy as np
import oracle
import pytest
import tensorflow as tf
from rnnt_testing import DEVICES, HALF_DTYPES, REPO_ROOT, compile_for, make_runner, pythonpath

import tf_rnnt
from tf_rnnt import reference, samplewise

RTOL = 1e-5
ACTIVATIONS = ["tanh", "relu", "identity"]
GRAD_NAMES = ("encoder", "predictor", "kernel", "bias")
# (batch, max_t, max_u, hidden, vocab)
SHAPE = (5, 7, 4, 6, 9)


_blank = oracle.blank_id
_upstream = oracle.upstream_weights


def _problem(seed, shape=SHAPE, blank=0):
    return oracle.float32_joint_problem(seed, shape, blank)


def _samplewise(*args, **options):
    return tf_rnnt.samplewise_rnnt_loss(*args, **options)


def _reference(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths, blank=0,
               activation="tanh", fastemit_lambda=0.0, **_):
    return reference.flash_rnnt_loss(encoder, predictor, kernel, bias, labels, logit_lengths,
                                     label_lengths, blank=blank, activation=activation,
                                     fastemit_lambda=fastemit_lambda)


def _compare(got, expected, rtol=RTOL, what=""):
    """got: (costs, [4 gradients]); expected: the same or the oracle's (costs, *4 gradients)."""
    got_costs, got_grads = got
    costs, grads = (expected[0], expected[1]) if len(expected) == 2 else \
        (expected[0], expected[1:])
    oracle.assert_close(got_costs, costs, rtol, err_msg=f"{what} costs")
    for name, g, e in zip(GRAD_NAMES, got_grads, grads):
        oracle.assert_close(g, e, rtol, err_msg=f"{what} d {name}")


def _check_against_oracles(run, problem, upstream, blank=0, activation="tanh",
                           fastemit_lambda=0.0, what=""):
    got = run(problem, upstream)
    expected = oracle.flash_rnnt_loss(*problem, blank, activation, fastemit_lambda,
                                      upstream=upstream)
    _compare(got, expected, what=f"{what} vs float64 oracle")
    ref = make_runner(_reference, blank=blank, activation=activation,
                      fastemit_lambda=fastemit_lambda)(problem, upstream)
    _compare(got, ref, what=f"{what} vs reference")
    return got


# ------------------------------------------------------------------------------ correctness

@pytest.mark.parametrize("graph_mode", ["eager", "function_dynamic_shapes"])
@pytest.mark.parametrize("parallel_iterations", [1, 2, 7, "auto"])
@pytest.mark.parametrize("device", DEVICES)
def test_matches_oracle_and_reference(parallel_iterations, graph_mode, device):
    problem = _problem(0)
    run = make_runner(_samplewise, device, graph_mode=graph_mode,
                      parallel_iterations=parallel_iterations)
    batch = SHAPE[0]
    # Uniform upstream (a mean): saved gradients scaled. Per-sample: weighted recomputation.
    _check_against_oracles(run, problem, np.full(batch, 1.0 / batch), what="uniform")
    _check_against_oracles(run, problem, _upstream(batch), what="per-sample")


@pytest.mark.parametrize("blank", [pytest.param(0, id="blank0"), pytest.param(-1, id="blank_last"),
                                   pytest.param("middle", id="blank_middle")])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_activations_and_blank(activation, blank):
    blank = _blank(blank, SHAPE[4])
    problem = _problem(1, blank=blank)
    run = make_runner(_samplewise, blank=blank, activation=activation, parallel_iterations=3)
    _check_against_oracles(run, problem, _upstream(SHAPE[0], 2), blank, activation)


@pytest.mark.parametrize("shape", [
    pytest.param((3, 1, 3, 4, 6), id="T1"),
    pytest.param((3, 5, 0, 4, 5), id="U0"),
    pytest.param((2, 3, 6, 5, 7), id="U_gt_T"),
])
def test_edge_shapes(shape):
    problem = _problem(2, shape)
    run = make_runner(_samplewise, parallel_iterations=2)
    _check_against_oracles(run, problem, _upstream(shape[0], 3))


def test_long_label_sequences():
    """Label lengths around multiples of the recursion's unrolling (8 steps per iteration)."""
    problem = list(_problem(16, (5, 6, 17, 4, 6)))
    problem[6] = np.array([17, 16, 8, 9, 1], np.int32)
    run = make_runner(_samplewise, parallel_iterations=2)
    _check_against_oracles(run, tuple(problem), _upstream(5, 16))


def test_blank_only_vocabulary():
    rng = np.random.default_rng(3)
    problem = (rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 1, 3)), rng.normal(size=(3, 1)),
               rng.normal(size=(1,)), np.zeros((2, 0), np.int32), np.array([4, 2], np.int32),
               np.zeros(2, np.int32))
    problem = tuple(x.astype(np.float32).astype(np.float64) for x in problem[:4]) + problem[4:]
    _check_against_oracles(make_runner(_samplewise, parallel_iterations=1), problem,
                           np.array([1.0, -0.5]))


def test_empty_batch():
    rng = np.random.default_rng(3)
    problem = (rng.normal(size=(0, 4, 3)), rng.normal(size=(0, 3, 3)), rng.normal(size=(3, 5)),
               rng.normal(size=(5,)), np.zeros((0, 2), np.int32), np.zeros(0, np.int32),
               np.zeros(0, np.int32))
    for graph_mode in ("eager", "function_dynamic_shapes"):
        costs, grads = make_runner(_samplewise, graph_mode=graph_mode,
                                   parallel_iterations=1)(problem)
        assert costs.shape == (0,)
        assert [g.shape for g in grads] == [(0, 4, 3), (0, 3, 3), (3, 5), (5,)]
        assert all(not np.any(g) for g in grads)


@pytest.mark.parametrize("graph_mode", ["eager", "function"])
def test_later_calls_leave_earlier_gradients_alone(graph_mode):
    """The gradients are written in place into a buffer; each call must get its own."""
    problem = _problem(14)
    tensors = [tf.constant(x, tf.float32) for x in problem[:4]] + \
        [tf.constant(x) for x in problem[4:]]

    def step(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths):
        params = [encoder, predictor, kernel, bias]
        with tf.GradientTape() as tape:
            tape.watch(params)
            costs = tf_rnnt.samplewise_rnnt_loss(encoder, predictor, kernel, bias, labels,
                                                 logit_lengths, label_lengths,
                                                 parallel_iterations=2)
        return tape.gradient(costs, params)

    step = compile_for(step, graph_mode, tensors)
    first = step(*tensors)  # kept as tensors: their buffers must not change
    copies = [np.array(g.numpy(), copy=True) for g in first]
    second = step(tensors[0] * 1.5, *tensors[1:])
    for name, g, copy, e in zip(GRAD_NAMES, first, copies, oracle.flash_rnnt_loss(*problem)[1:]):
        np.testing.assert_array_equal(g.numpy(), copy, err_msg=name)
        oracle.assert_close(copy, e, RTOL, err_msg=name)
    problem2 = (problem[0] * 1.5,) + problem[1:]
    for name, g, e in zip(GRAD_NAMES, second, oracle.flash_rnnt_loss(*problem2)[1:]):
        oracle.assert_close(g.numpy(), e, RTOL, err_msg=name)


@pytest.mark.parametrize("parallel_iterations", [2, "auto"])
def test_persistent_tape(parallel_iterations):
    """A persistent tape differentiates the traced function's saved outputs as well; that must
    not reach into the loops."""
    problem = _problem(15)
    params = [tf.constant(x, tf.float32) for x in problem[:4]]
    upstream = _upstream(SHAPE[0], 15)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(params)
        costs = tf_rnnt.samplewise_rnnt_loss(*params, *[tf.constant(x) for x in problem[4:]],
                                             parallel_iterations=parallel_iterations)
        weighted = tf.reduce_sum(costs * upstream)
        mean = tf.reduce_mean(costs)
    for total, weights in ((weighted, upstream), (mean, np.full(SHAPE[0], 1.0 / SHAPE[0]))):
        grads = tape.gradient(total, params)
        expected = oracle.flash_rnnt_loss(*problem, upstream=weights)
        _compare((costs.numpy(), [g.numpy() for g in grads]), expected)


def test_fastemit():
    problem = _problem(4)
    upstream = _upstream(SHAPE[0], 4)
    run = make_runner(_samplewise, fastemit_lambda=0.5, parallel_iterations=2)
    got = _check_against_oracles(run, problem, upstream, fastemit_lambda=0.5)
    # The cost is unchanged; the gradient is not.
    plain = oracle.flash_rnnt_loss(*problem, upstream=upstream)
    oracle.assert_close(got[0], plain[0], RTOL)
    assert np.max(np.abs(got[1][2] - plain[3])) > 1e-3 * np.max(np.abs(plain[3]))


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_half_precision(dtype, device):
    """Half inputs compute in float32 inside the loop; gradients come back in the input dtype."""
    problem = list(_problem(5))
    # The exact values the half-precision run sees.
    for i in range(4):
        problem[i] = tf.cast(tf.cast(problem[i], dtype), tf.float64).numpy()
    upstream = _upstream(SHAPE[0], 5)
    got = make_runner(_samplewise, device, dtype, parallel_iterations=2)(problem, upstream)
    # float32 math on the rounded inputs: the costs agree to float32 accuracy; the gradients to
    # the rounding of the result into the half dtype.
    expected = oracle.flash_rnnt_loss(*problem, upstream=upstream)
    oracle.assert_close(got[0], expected[0], RTOL, err_msg="costs")
    grad_rtol = {tf.float16: 1e-3, tf.bfloat16: 8e-3}[dtype]  # about 2 ulp of the dtype
    for name, g, e in zip(GRAD_NAMES, got[1], expected[1:]):
        oracle.assert_close(g, e, grad_rtol, err_msg=f"d {name}")
    # The reference in the same precision rounds the joint and logits to the half dtype.
    ref = make_runner(_reference, device, dtype)(problem, upstream)
    loose = {tf.float16: 5e-3, tf.bfloat16: 3e-2}[dtype]
    _compare(got, ref, loose, what="vs half-precision reference")


@pytest.mark.skipif(not tf_rnnt.ops.library_available(), reason="op library not built")
@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("device", DEVICES)
def test_matches_compiled_flash_op(activation, device):
    problem = _problem(6, blank=-1)
    upstream = _upstream(SHAPE[0], 6)
    got = make_runner(_samplewise, device, activation=activation, blank=-1,
                      parallel_iterations=3)(problem, upstream)
    flash = make_runner(tf_rnnt.flash_rnnt_loss, device, activation=activation,
                        blank=-1)(problem, upstream)
    _compare(got, flash, what="vs tf_rnnt.flash_rnnt_loss")


# ------------------------------------------------------------------------------ parallel_iterations

def _while_ops(graph_def):
    """{function name ("" for the graph itself): [(While node name, parallel_iterations)]}."""
    found = {}
    bodies = [("", graph_def.node)] + [(f.signature.name, f.node_def)
                                       for f in graph_def.library.function]
    for function_name, nodes in bodies:
        for node in nodes:
            if node.op in ("While", "StatelessWhile"):
                found.setdefault(function_name, []).append(
                    (node.name, node.attr["parallel_iterations"].i))
    return found


def _batch_loops(graph_def):
    return [p for loops in _while_ops(graph_def).values() for name, p in loops
            if "samplewise_batch_loop" in name]


def test_fixed_parallel_iterations_in_graph():
    problem = _problem(7)
    args = [tf.constant(x, tf.float32) for x in problem[:4]]
    args += [tf.constant(x) for x in problem[4:]] + [tf.constant(_upstream(SHAPE[0]), tf.float32)]

    def step(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths, upstream):
        with tf.GradientTape() as tape:
            tape.watch([encoder, predictor, kernel, bias])
            costs = tf_rnnt.samplewise_rnnt_loss(encoder, predictor, kernel, bias, labels,
                                                 logit_lengths, label_lengths,
                                                 parallel_iterations=3)
            total = tf.reduce_sum(costs * upstream)
        return tape.gradient(total, [encoder, predictor, kernel, bias])

    # 3 < the static batch, which would lower a larger value.
    assert SHAPE[0] > 3
    graph_def = tf.function(step).get_concrete_function(*args).graph.as_graph_def()
    # The forward loop and the backward's weighted recomputation, both at 3.
    assert sorted(_batch_loops(graph_def)) == [3, 3]
    for op in graph_def.node:
        assert op.op not in ("Case", "StatelessCase")


def _expected_auto(logit_lengths, label_lengths, hidden, vocab, budget):
    """The documented rule, computed here from its statement."""
    per_sample = 4 * max(int(t) * (int(u) + 1) for t, u in zip(logit_lengths, label_lengths)) \
        * (3 * vocab + 2 * hidden)
    fitting = [p for p in (1, 2, 4, 8, 16, 32, 64) if p * per_sample <= budget]
    return max(fitting) if fitting else 1


def test_auto_runs_the_loop_the_documented_rule_picks():
    batch, max_t, max_u, hidden, vocab = SHAPE
    problem = _problem(8)
    budget = 8_000  # spreads the cases below over P = 1 ... 32

    def loss(logit_lengths, label_lengths):
        return tf_rnnt.samplewise_rnnt_loss(*[tf.constant(x, tf.float32) for x in problem[:4]],
                                            tf.constant(problem[4]), logit_lengths,
                                            label_lengths, memory_budget=budget)

    spec = tf.TensorSpec([batch], tf.int32)
    wrapped = tf.compat.v1.wrap_function(loss, [spec, spec])
    cases = [op for op in wrapped.graph.get_operations()
             if op.type in ("Case", "StatelessCase")]
    assert len(cases) == 1
    # Branch i holds the loop with parallel_iterations PARALLEL_ITERATIONS_CHOICES[i] = 2**i.
    graph_def = wrapped.graph.as_graph_def()
    loops = _while_ops(graph_def)
    branches = [f.name for f in cases[0].node_def.attr["branches"].list.func]
    branch_loops = [[p for name, p in loops[b] if "samplewise_batch_loop" in name]
                    for b in branches]
    assert branch_loops == [[2 ** i] for i in range(7)]
    assert samplewise.PARALLEL_ITERATIONS_CHOICES == tuple(2 ** i for i in range(7))
    # The branch index the graph computes at run time, for batches of different sizes.
    branch_index = wrapped.prune(wrapped.inputs, cases[0].inputs[0])
    rng = np.random.default_rng(9)
    seen = set()
    for top_t, top_u in [(7, 4), (5, 3), (3, 2), (2, 1), (1, 0), (6, 4), (4, 1)]:
        logit_lengths = rng.integers(1, top_t + 1, size=batch).astype(np.int32)
        label_lengths = rng.integers(0, top_u + 1, size=batch).astype(np.int32)
        logit_lengths[0], label_lengths[0] = top_t, top_u
        expected = _expected_auto(logit_lengths, label_lengths, hidden, vocab, budget)
        index = int(branch_index(tf.constant(logit_lengths), tf.constant(label_lengths)))
        assert branch_loops[index] == [expected], (top_t, top_u)
        assert int(samplewise.auto_parallel_iterations(
            logit_lengths, label_lengths, hidden, vocab, budget)) == expected
        seen.add(expected)
        # And the loop it runs gives the right answer.
        costs = wrapped(tf.constant(logit_lengths), tf.constant(label_lengths)).numpy()
        expected_costs = oracle.flash_rnnt_loss(*problem[:5], logit_lengths, label_lengths)[0]
        oracle.assert_close(costs, expected_costs, RTOL)
    assert len(seen) >= 4  # the cases span several loops


@pytest.mark.parametrize("budget", [None, 1, 4 * 20 * 31, 4 * 20 * 31 * 4, 4 * 20 * 31 * 4 - 1,
                                    1e15])
def test_auto_rule_boundaries(budget):
    # max T_b * (U_b + 1) = 20, 3 V + 2 H = 31: working set 2480 bytes.
    logit_lengths, label_lengths = [5, 4, 2], [3, 4, 0]
    expected = _expected_auto(logit_lengths, label_lengths, 5, 7,
                              samplewise.DEFAULT_MEMORY_BUDGET if budget is None else budget)
    got = samplewise.auto_parallel_iterations(logit_lengths, label_lengths, 5, 7, budget)
    assert int(got) == expected


def test_default_budget_on_the_paper_setting():
    # The documented default: the paper's long utterances (T=1000, U=150, H=640, V=1024) run
    # one sample at a time; T=200, U=30 sixteen (108 MB each).
    assert samplewise.DEFAULT_MEMORY_BUDGET == 2 * 1024 ** 3
    assert int(samplewise.auto_parallel_iterations([1000] * 4, [150] * 4, 640, 1024)) == 1
    assert int(samplewise.auto_parallel_iterations([200, 50], [30, 5], 640, 1024)) == 16


# ------------------------------------------------------------------------------ Keras, distribution

def test_keras_mixed_precision():
    import keras

    problem = _problem(10)
    encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths = problem

    class Joint(keras.layers.Layer):
        def build(self, input_shape):
            self.kernel = self.add_weight(shape=kernel.shape, initializer="zeros", name="kernel")
            self.bias = self.add_weight(shape=bias.shape, initializer="zeros", name="bias")

        def call(self, encoder, predictor, labels, logit_lengths, label_lengths):
            return tf_rnnt.samplewise_rnnt_loss(encoder, predictor, self.kernel, self.bias,
                                                labels, logit_lengths, label_lengths,
                                                parallel_iterations=2)

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        layer = Joint()
        layer.build(None)
        layer.kernel.assign(kernel.astype(np.float32))
        layer.bias.assign(bias.astype(np.float32))
        assert layer.kernel.dtype == "float32" and layer.compute_dtype == "float16"
        enc16 = tf.cast(tf.constant(encoder, tf.float32), tf.float16)
        pred16 = tf.cast(tf.constant(predictor, tf.float32), tf.float16)
        learning_rate = 0.1
        # A scale under the default 2**15, at which the float16 bias gradient overflows (the
        # optimizer would rightly skip the step).
        optimizer = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(learning_rate),
                                                             initial_scale=256.0)
        optimizer.build(layer.trainable_variables)

        @tf.function
        def train_step(enc16, pred16):
            with tf.GradientTape() as tape:
                tape.watch([enc16, pred16])
                costs = layer(enc16, pred16, labels, logit_lengths, label_lengths)
                scaled_loss = optimizer.scale_loss(tf.reduce_mean(costs))
            grads = tape.gradient(scaled_loss, [enc16, pred16] + layer.trainable_variables)
            scale = tf.identity(optimizer.dynamic_scale)
            optimizer.apply(grads[2:], layer.trainable_variables)  # unscales, then steps
            return costs, grads, scale

        costs, grads, scale = train_step(enc16, pred16)
        new_kernel, new_bias = layer.kernel.numpy(), layer.bias.numpy()
    finally:
        keras.mixed_precision.set_global_policy(previous)
    assert costs.dtype == tf.float32
    assert [g.dtype for g in grads] == [tf.float16, tf.float16, tf.float32, tf.float32]
    # The layer computes with float16-rounded inputs and weights.
    rounded = [tf.cast(tf.cast(x, tf.float16), tf.float64).numpy()
               for x in (encoder, predictor, kernel, bias)]
    batch = encoder.shape[0]
    expected = oracle.flash_rnnt_loss(*rounded, labels, logit_lengths, label_lengths,
                                      upstream=np.full(batch, 1.0 / batch))
    oracle.assert_close(costs.numpy(), expected[0], RTOL, err_msg="costs")
    scale = float(scale)
    assert scale > 1
    for name, g, e in zip(GRAD_NAMES, grads, expected[1:]):
        oracle.assert_close(tf.cast(g, tf.float64).numpy() / scale, e, 2e-3, err_msg=name)
    # The optimizer stepped with the unscaled gradients.
    for name, old, new, e in (("kernel", kernel, new_kernel, expected[3]),
                              ("bias", bias, new_bias, expected[4])):
        oracle.assert_close((old - new) / learning_rate, e, 2e-3, err_msg=f"{name} step")


# The MirroredStrategy worker: a fresh process, because logical devices must be configured
# before TensorFlow initializes (in the pytest process it already has).
_MIRRORED_WORKER = r"""
import json, sys
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
import tf_rnnt

problem = np.load(sys.argv[1])
strategy = tf.distribute.MirroredStrategy(
    ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice("/cpu:0"))
with strategy.scope():
    kernel = tf.Variable(problem["kernel"].astype(np.float32))
    bias = tf.Variable(problem["bias"].astype(np.float32))


def shard(name, dtype):
    x = problem[name]
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(x[2 * ctx.replica_id_in_sync_group:
                                  2 * ctx.replica_id_in_sync_group + 2], dtype))


inputs = [shard("encoder", tf.float32), shard("predictor", tf.float32), shard("labels", tf.int32),
          shard("logit_lengths", tf.int32), shard("label_lengths", tf.int32)]


def replica_step(encoder, predictor, labels, logit_lengths, label_lengths):
    with tf.GradientTape() as tape:
        tape.watch([encoder, predictor])
        costs = tf_rnnt.samplewise_rnnt_loss(encoder, predictor, kernel, bias, labels,
                                             logit_lengths, label_lengths, parallel_iterations=2)
        loss = tf.reduce_mean(costs)
    grads = tape.gradient(loss, [encoder, predictor, kernel, bias])
    reduced = tf.distribute.get_replica_context().all_reduce("sum", grads[2])
    return costs, grads, reduced


def distributed_step(*inputs):
    return strategy.run(replica_step, args=inputs)


results = {"num_replicas": strategy.num_replicas_in_sync, "modes": {}, "reduced_kernel_grad": {}}
for mode, fn in (("eager", distributed_step), ("function", tf.function(distributed_step))):
    costs, grads, reduced = fn(*inputs)
    local_costs = strategy.experimental_local_results(costs)
    local_grads = [strategy.experimental_local_results(g) for g in grads]
    results["modes"][mode] = [{"costs": local_costs[r].numpy().tolist(),
                               "grads": [g[r].numpy().tolist() for g in local_grads]}
                              for r in range(2)]
    results["reduced_kernel_grad"][mode] = \
        strategy.experimental_local_results(reduced)[0].numpy().tolist()
with open(sys.argv[2], "w") as f:
    json.dump(results, f)
"""


@pytest.mark.slow
def test_mirrored_strategy_two_cpu_replicas(tmp_path):
    problem = _problem(11, (4, 6, 3, 5, 7))
    names = ("encoder", "predictor", "kernel", "bias", "labels", "logit_lengths",
             "label_lengths")
    data, out = os.path.join(tmp_path, "problem.npz"), os.path.join(tmp_path, "results.json")
    np.savez(data, **dict(zip(names, problem)))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=pythonpath(REPO_ROOT))
    proc = subprocess.run([sys.executable, "-c", _MIRRORED_WORKER, data, out], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"worker failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    with open(out) as f:
        results = json.load(f)
    assert results["num_replicas"] == 2
    assert sorted(results["modes"]) == ["eager", "function"]
    for mode, replicas in results["modes"].items():
        assert len(replicas) == 2
        for replica, got in enumerate(replicas):
            shard = slice(2 * replica, 2 * replica + 2)  # global batch 4, 2 per replica
            local = [x[shard] for x in problem[:2]] + list(problem[2:4]) + \
                [x[shard] for x in problem[4:]]
            expected = oracle.flash_rnnt_loss(*local, upstream=np.full(2, 0.5))
            _compare((np.array(got["costs"]), [np.array(g) for g in got["grads"]]), expected,
                     what=f"{mode} replica {replica}")
        # The all-reduced kernel gradient is the sum over the replicas.
        total = oracle.flash_rnnt_loss(*problem, upstream=np.full(4, 0.5))
        oracle.assert_close(np.array(results["reduced_kernel_grad"][mode]), total[3], RTOL)


# ------------------------------------------------------------------------------ labels

def test_labels_outside_their_length_may_hold_anything():
    problem = list(_problem(13))
    labels, label_lengths = problem[4].copy(), problem[6]
    for b in range(SHAPE[0]):
        labels[b, label_lengths[b]:] = [-7, 10 ** 6, SHAPE[4], 0][b % 4]  # 0 is blank
    expected = oracle.flash_rnnt_loss(*problem)
    problem[4] = labels
    got = make_runner(_samplewise, parallel_iterations=1)(problem)
    _compare(got, expected)

