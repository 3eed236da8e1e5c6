"""Flash TDT: flash_tdt_loss, the fused and tiled TDT joint, tiled and untiled.

Checked against the float64 NumPy oracle (full joint logits, oracle.tdt_loss: explicit
alpha/beta loops), against tf_rnnt.tdt_loss on the full logits and against the pure-TF
reference (autodiff). float32: costs and all four gradients within 1e-5 relative, with TF32
matmuls off; float16/bfloat16: within the yardstick of the RNN-T joint's tests.
"""

import numpy as np
import oracle
import pytest
import tensorflow as tf
from rnnt_testing import (
    DEVICES,
    GPUS,
    HALF_DTYPES,
    JOINT_GRAD_NAMES,
    JOINT_SHAPES,
    JOINT_TILINGS,
    assert_half_precision_close,
    compare_joint_results,
    make_runner,
    requires_gpu,
    run_joint_loss,
)

import tf_rnnt
from tf_rnnt import reference

RTOL = 1e-5
DURATIONS = [pytest.param([0, 1], id="d01"), pytest.param([0, 1, 2, 3, 4], id="d01234"),
             pytest.param([1, 2], id="d12")]
BLANKS = [pytest.param(0, id="blank0"), pytest.param(-1, id="blank_last")]


@pytest.fixture(autouse=True)
def _no_tf32():
    enabled = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    yield
    tf.config.experimental.enable_tensor_float_32_execution(enabled)


def _problem(seed, shape, durations, blank=0):
    """A TDT joint problem where every sample has an alignment: without duration 0 a sample
    needs more frames than labels."""
    problem = list(oracle.float32_tdt_joint_problem(seed, shape, durations, blank))
    if 0 not in durations:
        problem[6] = np.minimum(problem[6], problem[5] - 1).astype(np.int32)
    return tuple(problem)


def _float32_problem(seed, shape, durations):
    problem = _problem(seed, shape, durations)
    return [x.astype(np.float32) for x in problem[:4]] + list(problem[4:])


def _tdt_loss_on_logits(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths,
                        durations, blank=0, sigma=0.0, **_):
    logits = reference.joint_logits(encoder, predictor, kernel, bias)
    return tf_rnnt.tdt_loss(logits, labels, logit_lengths, label_lengths, durations, blank=blank,
                            sigma=sigma)


# ------------------------------------------------------------------------------ against the oracle

@pytest.mark.parametrize("mode", ["tiled", "untiled"])
@pytest.mark.parametrize("blank", BLANKS)
@pytest.mark.parametrize("durations", DURATIONS)
@pytest.mark.parametrize("shape", JOINT_SHAPES)
@pytest.mark.parametrize("device", DEVICES)
def test_flash_tdt_loss_matches_oracle(shape, durations, blank, mode, device):
    problem = _problem(0, shape, durations, blank)
    upstream = oracle.upstream_weights(shape[0])
    expected = oracle.flash_tdt_loss(*problem, durations, blank, 0.05, upstream=upstream)
    got = run_joint_loss(tf_rnnt.flash_tdt_loss, problem, upstream, device, durations=durations,
                         blank=blank, sigma=0.05, mode=mode, tile_size=5)
    compare_joint_results(got, expected, what=f"flash_tdt_loss {mode}")


@pytest.mark.parametrize("durations", DURATIONS)
@pytest.mark.parametrize("device", DEVICES)
def test_flash_tdt_loss_matches_tdt_loss_on_logits_and_reference(durations, device):
    problem = _problem(1, (3, 5, 3, 6, 9), durations, blank=-1)
    options = dict(durations=durations, blank=-1, sigma=0.1)
    flash = run_joint_loss(tf_rnnt.flash_tdt_loss, problem, None, device, **options)
    on_logits = run_joint_loss(_tdt_loss_on_logits, problem, None, device, **options)
    ref = run_joint_loss(reference.flash_tdt_loss, problem, None, device, **options)
    compare_joint_results(flash, (on_logits[0], *on_logits[1]), what="flash vs tdt_loss on logits")
    compare_joint_results(flash, (ref[0], *ref[1]), what="flash vs reference")


@pytest.mark.parametrize("tiling", JOINT_TILINGS)
@pytest.mark.parametrize("device", DEVICES)
def test_flash_tdt_loss_tilings(tiling, device):
    durations = [0, 1, 2, 3, 4]
    problem = _problem(2, (4, 7, 4, 8, 13), durations, blank=3)
    expected = oracle.flash_tdt_loss(*problem, durations, 3)
    got = run_joint_loss(tf_rnnt.flash_tdt_loss, problem, None, device, durations=durations,
                         blank=3, **tiling)
    compare_joint_results(got, expected, what=str(tiling))


@pytest.mark.parametrize("fastemit_lambda,clamp", [(0.5, -1.0), (0.0, 0.05), (0.3, 0.05)])
@pytest.mark.parametrize("mode", ["tiled", "untiled"])
@pytest.mark.parametrize("device", DEVICES)
def test_flash_tdt_loss_fastemit_and_clamp(fastemit_lambda, clamp, mode, device):
    durations = [0, 1, 2]
    problem = _problem(3, (3, 6, 3, 8, 11), durations)
    upstream = oracle.upstream_weights(3)
    expected = oracle.flash_tdt_loss(*problem, durations, 0, 0.05, "tanh", fastemit_lambda, clamp,
                                     upstream)
    got = run_joint_loss(tf_rnnt.flash_tdt_loss, problem, upstream, device, durations=durations,
                         sigma=0.05, fastemit_lambda=fastemit_lambda, clamp=clamp, mode=mode)
    compare_joint_results(got, expected, what=f"fastemit {fastemit_lambda} clamp {clamp}")


@pytest.mark.parametrize("activation", ["relu", "identity"])
@pytest.mark.parametrize("device", DEVICES)
def test_flash_tdt_loss_activations(activation, device):
    durations = [0, 1, 2, 3, 4]
    problem = _problem(4, (2, 5, 3, 6, 7), durations)
    expected = oracle.flash_tdt_loss(*problem, durations, 0, 0.0, activation)
    got = run_joint_loss(tf_rnnt.flash_tdt_loss, problem, None, device, durations=durations,
                         activation=activation, tile_size=4)
    compare_joint_results(got, expected, what=activation)


@pytest.mark.parametrize("mode", ["tiled", "untiled"])
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_flash_tdt_loss_half_precision(dtype, mode, device):
    durations = [0, 1, 2, 3, 4]
    problem = _problem(5, (3, 6, 4, 16, 11), durations, blank=-1)
    rounded = tuple(tf.cast(tf.cast(tf.constant(x, tf.float32), dtype), tf.float64).numpy()
                    for x in problem[:4]) + problem[4:]
    exact = oracle.flash_tdt_loss(*rounded, durations, -1, 0.05)
    options = dict(durations=durations, blank=-1, sigma=0.05)
    ref_costs, ref_grads = run_joint_loss(reference.flash_tdt_loss, rounded, dtype=dtype, **options)
    costs, grads = run_joint_loss(tf_rnnt.flash_tdt_loss, rounded, None, device, dtype=dtype,
                                  mode=mode, tile_size=5, **options)
    assert_half_precision_close((costs, grads), (ref_costs, ref_grads), exact, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_flash_tdt_loss_graph_modes_and_jit_compile(graph_mode, device):
    durations = [0, 1, 2, 3, 4]
    problem = _problem(6, (3, 6, 3, 8, 11), durations)
    expected = oracle.flash_tdt_loss(*problem, durations, 0, 0.05)
    got = run_joint_loss(tf_rnnt.flash_tdt_loss, problem, None, device, graph_mode=graph_mode,
                         durations=durations, sigma=0.05)
    compare_joint_results(got, expected, what=graph_mode)
    if graph_mode != "eager":
        return
    encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths = problem
    with tf.device(device):
        params = [tf.constant(x, tf.float32) for x in (encoder, predictor, kernel, bias)]

        @tf.function(jit_compile=True)
        def step(*params):
            with tf.GradientTape() as tape:
                tape.watch(params)
                costs = tf_rnnt.flash_tdt_loss(*params, labels, logit_lengths, label_lengths,
                                               durations, sigma=0.05)
                total = tf.reduce_sum(costs)
            return costs, tape.gradient(total, params)

        costs, grads = step(*params)
    compare_joint_results((costs.numpy(), [g.numpy() for g in grads]), expected, what="jit_compile")


@pytest.mark.parametrize("device", DEVICES)
def test_flash_tdt_loss_omega(device):
    durations = [0, 1, 2]
    problem = _problem(7, (3, 5, 3, 8, 9), durations)
    encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths = problem
    vocab = kernel.shape[1] - len(durations)
    rnnt_problem = (encoder, predictor, kernel[:, :vocab], bias[:vocab], labels, logit_lengths,
                    label_lengths)
    rnnt = oracle.flash_rnnt_loss(*rnnt_problem)
    costs, grads = run_joint_loss(tf_rnnt.flash_tdt_loss, problem, None, device,
                                  durations=durations, sigma=0.05, omega=1.0)
    compare_joint_results((costs, [grads[0], grads[1], grads[2][:, :vocab], grads[3][:vocab]]),
                          rnnt, what="omega=1")
    assert np.all(grads[2][:, vocab:] == 0) and np.all(grads[3][vocab:] == 0)
    tdt = oracle.flash_tdt_loss(*problem, durations, 0, 0.05)[0]
    # A seeded draw repeats; over seeds both losses are drawn.
    drawn = []
    for seed in range(12):
        run = make_runner(tf_rnnt.flash_tdt_loss, device, durations=durations, sigma=0.05,
                          omega=0.5, seed=(seed, 1))
        first, again = run(problem)[0], run(problem)[0]
        np.testing.assert_array_equal(first, again)
        drawn.append("rnnt" if np.allclose(first, rnnt[0], rtol=1e-5) else "tdt")
        if drawn[-1] == "tdt":
            oracle.assert_close(first, tdt, RTOL)
    assert set(drawn) == {"rnnt", "tdt"}


@pytest.mark.parametrize("device", DEVICES)
def test_flash_tdt_loss_padding_is_ignored(device):
    durations = [0, 1, 2, 3, 4]
    problem = list(_problem(8, (3, 6, 3, 8, 11), durations))
    expected = oracle.flash_tdt_loss(*problem, durations)
    # Garbage in padded frames, predictor steps and labels changes nothing.
    encoder, predictor, labels = (np.array(problem[i]) for i in (0, 1, 4))
    for b in range(3):
        encoder[b, problem[5][b]:] = 1e4
        predictor[b, problem[6][b] + 1:] = np.nan
        labels[b, problem[6][b]:] = 10 ** 6
    problem[0], problem[1], problem[4] = encoder, predictor, labels
    got = run_joint_loss(tf_rnnt.flash_tdt_loss, tuple(problem), None, device, durations=durations)
    oracle.assert_close(got[0], expected[0], RTOL)
    for name, g, e in zip(JOINT_GRAD_NAMES[2:], got[1][2:], expected[3:]):
        oracle.assert_close(g, e, RTOL, err_msg=name)
    for b in range(3):
        assert np.all(got[1][0][b, problem[5][b]:] == 0)


@pytest.mark.parametrize("device", DEVICES)
def test_flash_tdt_loss_is_deterministic(device):
    durations = [0, 1, 2, 3, 4]
    problem = _problem(9, (4, 9, 5, 16, 37), durations)
    for dtype in (tf.float32, tf.bfloat16):
        run = make_runner(tf_rnnt.flash_tdt_loss, device, dtype, durations=durations,
                          tile_size=13)
        first, second = run(problem), run(problem)
        np.testing.assert_array_equal(first[0], second[0])
        for g1, g2 in zip(first[1], second[1]):
            np.testing.assert_array_equal(g1, g2)


# ------------------------------------------------------------------------------ the GPU's kernels

@requires_gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_flash_tdt_loss_gpu_kernel_choice(dtype):
    durations = [0, 1, 2, 3, 4]
    problem = _problem(10, (3, 6, 3, 16, 11), durations)
    auto = run_joint_loss(tf_rnnt.flash_tdt_loss, problem, None, "/GPU:0", dtype,
                          durations=durations)
    cublas = run_joint_loss(tf_rnnt.flash_tdt_loss, problem, None, "/GPU:0", dtype,
                            durations=durations, gpu_kernel="cublas")
    np.testing.assert_array_equal(auto[0], cublas[0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="duration head"):
        run_joint_loss(tf_rnnt.flash_tdt_loss, problem, None, "/GPU:0", dtype, durations=durations,
                       gpu_kernel="fused")


@pytest.mark.skipif(not GPUS, reason="needs a GPU")
def test_flash_tdt_loss_cpu_gpu_parity():
    durations = [0, 1, 2, 3, 4]
    problem = _problem(11, (4, 8, 5, 16, 21), durations, blank=-1)
    options = dict(durations=durations, blank=-1, sigma=0.05, fastemit_lambda=0.1, clamp=0.5)
    cpu = run_joint_loss(tf_rnnt.flash_tdt_loss, problem, None, "/CPU:0", **options)
    gpu = run_joint_loss(tf_rnnt.flash_tdt_loss, problem, None, "/GPU:0", **options)
    compare_joint_results(gpu, (cpu[0], *cpu[1]), what="GPU vs CPU")


# ------------------------------------------------------------------------------ bad input

@pytest.mark.parametrize("durations,match", [
    ([0, 2, 1], "increasing"), ([0, 2, 3], "contain 1"), ([-1, 1], "non-negative"),
    ([], "non-empty"), ([0, 1, 1], "increasing"),
])
def test_flash_tdt_loss_rejects_bad_durations(durations, match):
    problem = _float32_problem(12, (2, 4, 2, 4, 5), [0, 1, 2])
    with pytest.raises(ValueError, match=match):
        tf_rnnt.flash_tdt_loss(*problem, durations)


def test_flash_tdt_loss_rejects_bad_blank_and_kernel_width():
    durations = [0, 1, 2]
    problem = _float32_problem(13, (2, 4, 2, 4, 5), durations)
    with pytest.raises(ValueError, match="blank"):
        tf_rnnt.flash_tdt_loss(*problem, durations, blank=5)  # V = 5 token columns
    with pytest.raises(ValueError, match="blank"):
        tf_rnnt.flash_tdt_loss(*problem, durations, blank=-6)
    narrow = list(problem)
    narrow[2], narrow[3] = problem[2][:, :3], problem[3][:3]  # 3 columns for D = 3 durations
    with pytest.raises(ValueError, match="kernel must have shape"):
        tf_rnnt.flash_tdt_loss(*narrow, durations)
    with pytest.raises(ValueError, match="sigma"):
        tf_rnnt.flash_tdt_loss(*problem, durations, sigma=-0.1)


def test_flash_tdt_loss_rejects_labels_among_duration_columns():
    durations = [0, 1, 2]
    problem = _float32_problem(14, (2, 4, 2, 4, 5), durations)
    labels = np.array(problem[4])
    labels[0, 0] = 5  # a duration column's index, not a token
    problem[4] = labels
    problem[6] = np.array([2, 2], np.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="labels"):
        tf_rnnt.flash_tdt_loss(*problem, durations)


def test_flash_tdt_loss_is_exported():
    assert "flash_tdt_loss" in tf_rnnt.__all__
    assert tf_rnnt.flash_tdt_loss is tf_rnnt.tdt.flash_tdt_loss
