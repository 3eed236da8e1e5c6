"""Flash RNN-T: joint_lattice and flash_rnnt_loss, tiled and untiled.

tiled == untiled == reference == float64 oracle on random shapes and ragged lengths, every
activation, blank first/last/middle, tile sizes 1, a prime, larger than the lattice, and a
memory budget. float32: costs and all four gradients within 1e-5 relative (oracle.assert_close).
The float32 comparisons run with TF32 matmuls off (a GPU would otherwise round GEMM inputs to
10 mantissa bits); TF32 accuracy belongs to the benchmarks.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import oracle
import pytest
import tensorflow as tf
from rnnt_testing import (
    DEVICES,
    HALF_DTYPES,
    JOINT_GRAD_NAMES,
    JOINT_SHAPES,
    JOINT_TILINGS,
    REPO_ROOT,
    UNIT_ROUNDOFF,
    assert_half_precision_close,
    compare_joint_results,
    relative_error,
    requires_gpu,
    run_joint_loss,
)

import tf_rnnt
from tf_rnnt import reference

RTOL = 1e-5
ACTIVATIONS = ["tanh", "relu", "identity"]
BLANKS = [pytest.param(0, id="blank0"), pytest.param(-1, id="blank_last"),
          pytest.param("middle", id="blank_middle")]


_blank = oracle.blank_id
_problem = oracle.float32_joint_problem
_upstream = oracle.upstream_weights


# ------------------------------------------------------------------------------ runners

def run_joint_lattice(problem, d_lattice, device="/CPU:0", dtype=tf.float32, **options):
    """Lattice and the four gradients of sum(d_lattice * lattice), as float64 NumPy."""
    encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths = problem
    with tf.device(device):
        params = [tf.cast(tf.constant(x, tf.float32), dtype)
                  for x in (encoder, predictor, kernel, bias)]
        with tf.GradientTape() as tape:
            tape.watch(params)
            lattice = tf_rnnt.joint_lattice(*params, tf.constant(labels),
                                            tf.constant(logit_lengths),
                                            tf.constant(label_lengths), **options)
        # output_gradients, not sum(d * lattice): the unused label entry at u = label_length
        # may be -inf, and -inf * 0 would be NaN.
        grads = tape.gradient(lattice, params, output_gradients=tf.constant(d_lattice, tf.float32))
    assert lattice.dtype == tf.float32
    return lattice.numpy(), [tf.cast(g, tf.float64).numpy() for g in grads]


def _reference_flash(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths,
                     blank=0, activation="tanh", fastemit_lambda=0.0, clamp=-1.0, **_):
    return reference.flash_rnnt_loss(encoder, predictor, kernel, bias, labels, logit_lengths,
                                     label_lengths, blank=blank, activation=activation,
                                     fastemit_lambda=fastemit_lambda, clamp=clamp)


# ------------------------------------------------------------------------------ the oracle itself

@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("blank", BLANKS)
def test_joint_oracle_matches_reference(activation, blank):
    shape = (3, 5, 3, 6, 9)
    blank = _blank(blank, shape[4])
    problem = _problem(0, shape, blank)
    upstream = _upstream(shape[0])
    expected = oracle.flash_rnnt_loss(*problem, blank, activation, upstream=upstream)
    got = run_joint_loss(_reference_flash, problem, upstream, blank=blank, activation=activation)
    compare_joint_results(got, expected, what="reference vs oracle")


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_joint_oracle_matches_finite_differences(activation):
    problem = list(_problem(1, (2, 3, 2, 3, 5), blank=-1))
    labels, logit_lengths, label_lengths = problem[4:]
    upstream = np.array([1.5, -0.5])
    expected = oracle.flash_rnnt_loss(*problem, -1, activation, upstream=upstream)
    d_lattice = np.random.default_rng(2).normal(size=(2, 3, 3, 2))
    lattice_grads = oracle.joint_lattice_backward(*problem, d_lattice, -1, activation)
    for i, name in enumerate(JOINT_GRAD_NAMES):
        def total(x):
            args = list(problem)
            args[i] = x
            return np.dot(oracle.flash_rnnt_loss(*args, -1, activation)[0], upstream)

        def lattice_total(x):
            args = list(problem)
            args[i] = x
            return np.sum(oracle.joint_lattice(*args, -1, activation) * d_lattice)

        np.testing.assert_allclose(expected[1 + i],
                                   oracle.central_differences(total, problem[i]),
                                   rtol=1e-6, atol=1e-8, err_msg=name)
        np.testing.assert_allclose(lattice_grads[i],
                                   oracle.central_differences(lattice_total, problem[i]),
                                   rtol=1e-6, atol=1e-8, err_msg=name)
    del labels, logit_lengths, label_lengths


# ------------------------------------------------------------------------------ flash_rnnt_loss

@pytest.mark.parametrize("mode", ["tiled", "untiled"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("blank", BLANKS)
@pytest.mark.parametrize("shape", JOINT_SHAPES)
@pytest.mark.parametrize("device", DEVICES)
def test_flash_rnnt_loss_matches_oracle_and_reference(shape, blank, activation, mode, device):
    blank = _blank(blank, shape[4])
    problem = _problem(3, shape, blank)
    upstream = _upstream(shape[0])
    expected = oracle.flash_rnnt_loss(*problem, blank, activation, upstream=upstream)
    got = run_joint_loss(tf_rnnt.flash_rnnt_loss, problem, upstream, device, blank=blank,
                         activation=activation, mode=mode)
    compare_joint_results(got, expected, what=f"{mode} vs oracle")
    ref = run_joint_loss(_reference_flash, problem, upstream, blank=blank, activation=activation)
    compare_joint_results(got, (ref[0], *ref[1]), what=f"{mode} vs reference")


@pytest.mark.parametrize("tiling", JOINT_TILINGS)
@pytest.mark.parametrize("blank", BLANKS)
@pytest.mark.parametrize("device", DEVICES)
def test_flash_rnnt_loss_tilings(tiling, blank, device):
    shape = (3, 7, 4, 6, 13)
    blank = _blank(blank, shape[4])
    problem = _problem(4, shape, blank)
    upstream = _upstream(shape[0])
    expected = oracle.flash_rnnt_loss(*problem, blank, "tanh", upstream=upstream)
    got = run_joint_loss(tf_rnnt.flash_rnnt_loss, problem, upstream, device, blank=blank, **tiling)
    compare_joint_results(got, expected, what=str(tiling))


@pytest.mark.parametrize("tiling", [JOINT_TILINGS[0], JOINT_TILINGS[1], JOINT_TILINGS[3],
                                    pytest.param(dict(mode="tiled", tile_size=100),
                                                 id="tile_100")])
@pytest.mark.parametrize("device", DEVICES)
def test_flash_rnnt_loss_larger_case(tiling, device):
    # ~800 valid nodes: many row shards and tiles, so the multi-threaded paths run.
    shape = (4, 20, 10, 32, 64)
    problem = _problem(17, shape, blank=-1)
    upstream = _upstream(shape[0])
    expected = oracle.flash_rnnt_loss(*problem, -1, "tanh", upstream=upstream)
    got = run_joint_loss(tf_rnnt.flash_rnnt_loss, problem, upstream, device, blank=-1, **tiling)
    compare_joint_results(got, expected, what=str(tiling))


@pytest.mark.parametrize("device", DEVICES)
def test_flash_rnnt_loss_tilings_agree(device):
    # Different tile sizes only change the order of float32 sums: results agree closely.
    problem = _problem(5, (2, 9, 5, 7, 10), blank=-1)
    results = [run_joint_loss(tf_rnnt.flash_rnnt_loss, problem, None, device, blank=-1,
                              activation="relu", **tiling.values[0]) for tiling in JOINT_TILINGS]
    for tiling, other in zip(JOINT_TILINGS[1:], results[1:]):
        compare_joint_results(other, (results[0][0], *results[0][1]),
                              what=f"{tiling.id} vs untiled")


# Untiled mode's backward writes d logits and d hidden over the values its forward kept. A
# persistent tape still holds those after the first gradient, so the op must work on copies
# there: a second gradient equals the first and a plain tape's, bitwise (in 16-bit dtypes on a
# Hopper GPU the fused kernels keep the values), and in float32 the oracle's.
@pytest.mark.parametrize("dtype", [pytest.param(tf.float32, id="float32"), HALF_DTYPES[1]])
@pytest.mark.parametrize("device", DEVICES)
def test_flash_rnnt_loss_untiled_persistent_tape(device, dtype):
    shape = (3, 20, 9, 16, 131)
    problem = _problem(7, shape, blank=0)
    upstream = _upstream(shape[0])

    def gradients(persistent):
        with tf.device(device):
            params = [tf.cast(tf.constant(x, tf.float32), dtype) for x in problem[:4]]
            with tf.GradientTape(persistent=persistent) as tape:
                tape.watch(params)
                costs = tf_rnnt.flash_rnnt_loss(*params, *(tf.constant(x) for x in problem[4:]),
                                                mode="untiled")
                total = tf.reduce_sum(costs * tf.constant(upstream, costs.dtype))
            runs = [tape.gradient(total, params) for _ in range(2 if persistent else 1)]
        return [[tf.cast(g, tf.float64).numpy() for g in run] for run in runs]

    (plain,) = gradients(False)
    for k, run in enumerate(gradients(True)):
        for name, got, want in zip(JOINT_GRAD_NAMES, run, plain):
            np.testing.assert_array_equal(got, want, err_msg=f"persistent tape {k}: d {name}")
    if dtype == tf.float32:
        expected = oracle.flash_rnnt_loss(*problem, 0, "tanh", upstream=upstream)
        for name, got, want in zip(JOINT_GRAD_NAMES, plain, expected[1:]):
            oracle.assert_close(got, want, RTOL, err_msg=f"d {name}")


@pytest.mark.parametrize("device", DEVICES)
def test_flash_rnnt_loss_graph_modes(graph_mode, device):
    problem = _problem(6, (3, 5, 4, 6, 8), blank=2)
    expected = oracle.flash_rnnt_loss(*problem, 2, "tanh")
    for mode in ("tiled", "untiled"):
        got = run_joint_loss(tf_rnnt.flash_rnnt_loss, problem, None, device, graph_mode=graph_mode,
                             blank=2, mode=mode, tile_size=5 if mode == "tiled" else None)
        compare_joint_results(got, expected, what=f"{graph_mode} {mode}")


@pytest.mark.parametrize("fastemit_lambda,clamp", [(0.5, -1.0), (0.0, 0.05), (0.3, 0.05)])
@pytest.mark.parametrize("mode", ["tiled", "untiled"])
@pytest.mark.parametrize("device", DEVICES)
def test_flash_rnnt_loss_fastemit_and_clamp(fastemit_lambda, clamp, mode, device):
    problem = _problem(7, (3, 5, 3, 6, 9), blank=0)
    upstream = np.array([2.0, 0.5, -3.0])
    expected = oracle.flash_rnnt_loss(*problem, 0, "tanh", fastemit_lambda, clamp, upstream)
    got = run_joint_loss(tf_rnnt.flash_rnnt_loss, problem, upstream, device, mode=mode,
                         fastemit_lambda=fastemit_lambda, clamp=clamp)
    compare_joint_results(got, expected, what=mode)


@pytest.mark.parametrize("mode", ["tiled", "untiled"])
@pytest.mark.parametrize("device", DEVICES)
def test_flash_rnnt_loss_padding(mode, device):
    # Garbage in the padded frames / predictor steps changes nothing, and gets zero gradient.
    encoder, predictor, kernel, bias, labels, _, _ = _problem(8, (3, 6, 4, 5, 7))
    logit_lengths = np.array([6, 2, 4], np.int32)
    label_lengths = np.array([1, 4, 0], np.int32)
    clean = (encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths)
    expected = oracle.flash_rnnt_loss(*clean, 0, "identity")
    rng = np.random.default_rng(9)
    encoder, predictor = encoder.copy(), predictor.copy()
    for b in range(3):
        encoder[b, logit_lengths[b]:] = rng.uniform(-30, 30, encoder[b, logit_lengths[b]:].shape)
        predictor[b, label_lengths[b] + 1:] = rng.uniform(
            -30, 30, predictor[b, label_lengths[b] + 1:].shape)
        labels[b, label_lengths[b]:] = 0  # padded labels equal to blank are fine
    dirty = (encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths)
    costs, grads = run_joint_loss(tf_rnnt.flash_rnnt_loss, dirty, None, device,
                                  activation="identity", mode=mode,
                                  tile_size=3 if mode == "tiled" else None)
    compare_joint_results((costs, grads), expected, what="padded")
    for b in range(3):
        assert np.all(grads[0][b, logit_lengths[b]:] == 0.0), "d encoder leaked into padding"
        assert np.all(grads[1][b, label_lengths[b] + 1:] == 0.0), "d predictor leaked"


@pytest.mark.parametrize("device", DEVICES)
def test_flash_rnnt_loss_int64_labels_and_lengths(device):
    problem = _problem(10, (2, 4, 3, 5, 6))
    wide = problem[:4] + tuple(x.astype(np.int64) for x in problem[4:])
    narrow_result = run_joint_loss(tf_rnnt.flash_rnnt_loss, problem, None, device)
    wide_result = run_joint_loss(tf_rnnt.flash_rnnt_loss, wide, None, device)
    compare_joint_results(wide_result, (narrow_result[0], *narrow_result[1]), rtol=1e-6)


# ------------------------------------------------------------------------------ joint_lattice

def _lattice_masks(problem):
    """(valid node, label entry that the loss can use) masks, [B, T, U+1] each."""
    encoder, predictor, _, _, _, logit_lengths, label_lengths = problem
    valid = oracle.valid_node_mask(encoder.shape[1], predictor.shape[1], logit_lengths,
                                   label_lengths)
    u = np.arange(predictor.shape[1])[None, None, :]
    return valid, valid & (u < np.asarray(label_lengths)[:, None, None])


@pytest.mark.parametrize("tiling", [JOINT_TILINGS[0], JOINT_TILINGS[1], JOINT_TILINGS[3]])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("shape", JOINT_SHAPES[:3])
@pytest.mark.parametrize("device", DEVICES)
def test_joint_lattice_matches_oracle(shape, activation, tiling, device):
    blank = -1
    problem = _problem(11, shape, blank)
    valid, label_used = _lattice_masks(problem)
    d_lattice = np.random.default_rng(12).normal(size=valid.shape + (2,))
    # The label entry at u = label_length is unspecified (-inf or 0) and never used: no
    # gradient is sent into it. Padded nodes do get an upstream gradient, which must be ignored.
    d_lattice[..., 1] *= np.where(valid & ~label_used, 0.0, 1.0)
    lattice, grads = run_joint_lattice(problem, d_lattice, device, blank=blank,
                                       activation=activation, **tiling)
    expected = oracle.joint_lattice(*problem, blank, activation)
    oracle.assert_close(np.where(valid, lattice[..., 0], 0.0), expected[..., 0], RTOL)
    oracle.assert_close(np.where(label_used, lattice[..., 1], 0.0),
                        np.where(label_used, expected[..., 1], 0.0), RTOL)
    assert np.all(lattice[~valid] == 0.0), "nodes outside the rectangle must be 0"
    expected_grads = oracle.joint_lattice_backward(*problem, d_lattice, blank, activation)
    for name, g, e in zip(JOINT_GRAD_NAMES, grads, expected_grads):
        oracle.assert_close(g, e, RTOL, err_msg=f"d {name}")


# ------------------------------------------------------------------------------ half precision

@pytest.mark.parametrize("mode", ["tiled", "untiled"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_flash_rnnt_loss_half_precision(dtype, activation, mode, device):
    problem = _problem(13, (3, 6, 4, 16, 11), blank=-1)
    rounded = tuple(tf.cast(tf.cast(tf.constant(x, tf.float32), dtype), tf.float64).numpy()
                    for x in problem[:4]) + problem[4:]
    exact = oracle.flash_rnnt_loss(*rounded, -1, activation)
    ref_costs, ref_grads = run_joint_loss(_reference_flash, rounded, dtype=dtype, blank=-1,
                                          activation=activation)
    costs, grads = run_joint_loss(tf_rnnt.flash_rnnt_loss, rounded, None, device, dtype=dtype,
                                  blank=-1, activation=activation, mode=mode, tile_size=5)
    assert_half_precision_close((costs, grads), (ref_costs, ref_grads), exact, dtype)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_joint_lattice_half_precision(dtype, device):
    problem = _problem(14, (2, 5, 3, 16, 9), blank=0)
    rounded = tuple(tf.cast(tf.cast(tf.constant(x, tf.float32), dtype), tf.float64).numpy()
                    for x in problem[:4]) + problem[4:]
    valid, label_used = _lattice_masks(rounded)
    exact = oracle.joint_lattice(*rounded, 0, "tanh")
    params = [tf.cast(tf.constant(x, tf.float32), dtype) for x in rounded[:4]]
    ref = reference.joint_lattice(*params, rounded[4], blank=0, activation="tanh").numpy()
    lattice, _ = run_joint_lattice(rounded, np.zeros(valid.shape + (2,)), device, dtype=dtype,
                                   blank=0, activation="tanh")
    u = UNIT_ROUNDOFF[dtype]
    for channel, mask in ((0, valid), (1, label_used)):
        e = np.where(mask, exact[..., channel], 0.0)
        op_error = relative_error(np.where(mask, lattice[..., channel], 0.0), e)
        ref_error = relative_error(np.where(mask, ref[..., channel], 0.0), e)
        assert op_error <= 2 * ref_error + u, (channel, op_error, ref_error)


# The GPU's fused tile kernels (16-bit dtypes; gpu_kernel="fused": Hopper's wgmma kernels on
# compute capability 9.0), in `mode` (untiled: the fused
# forward keeps the joint values and rounded logits): the half precision criterion above against
# the oracle, close to the tiled cuBLAS path (same rounding points), and bitwise the same run to
# run. The paths round d logits to the dtype from float32 values a few float32 ulp apart (exp2
# against expf), so a d logit can land one half-precision ulp away and the gradients differ by up
# to 2 unit roundoffs.
def _check_fused_kernels(problem, dtype, blank, options, tile_size, mode="tiled"):
    rounded = tuple(tf.cast(tf.cast(tf.constant(x, tf.float32), dtype), tf.float64).numpy()
                    for x in problem[:4]) + problem[4:]
    exact = oracle.flash_rnnt_loss(*rounded, blank, "tanh", **options)
    ref_costs, ref_grads = run_joint_loss(_reference_flash, rounded, dtype=dtype, blank=blank,
                                          **options)
    runs = {}
    fused_path = "fused"
    for path in ("cublas", fused_path, fused_path):
        got = run_joint_loss(tf_rnnt.flash_rnnt_loss, rounded, None, "/GPU:0", dtype=dtype,
                             blank=blank, mode="tiled" if path == "cublas" else mode,
                             tile_size=tile_size, gpu_kernel=path, **options)
        if path in runs:
            for a, b in zip([runs[path][0]] + runs[path][1], [got[0]] + got[1]):
                np.testing.assert_array_equal(a, b, err_msg=f"{path}: a second run differs")
        runs[path] = got
    u = UNIT_ROUNDOFF[dtype]
    for i, (name, e) in enumerate(zip(("costs",) + JOINT_GRAD_NAMES, exact)):
        fused = runs[fused_path][0] if i == 0 else runs[fused_path][1][i - 1]
        cublas = runs["cublas"][0] if i == 0 else runs["cublas"][1][i - 1]
        ref = ref_costs if i == 0 else ref_grads[i - 1]
        op_error, ref_error = relative_error(fused, e), relative_error(ref, e)
        assert op_error <= 2 * ref_error + u, (
            f"{name}: {fused_path} error {op_error:.2e} vs reference {ref_error:.2e} in "
            f"{dtype.name}")
        assert relative_error(fused, cublas) <= 2 * u, f"{name}: {fused_path} vs cuBLAS path"


@pytest.mark.gpu
@pytest.mark.parametrize("options", [dict(), dict(fastemit_lambda=0.01), dict(clamp=0.1)],
                         ids=["plain", "fastemit", "clamp"])
@pytest.mark.parametrize("blank", [0, -1])
@pytest.mark.parametrize("vocab", [131, 140])
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("mode", ["tiled", "untiled"])
def test_flash_rnnt_loss_fused_kernels(mode, dtype, vocab, blank, options):
    # 600 nodes: several blocks of 128; V = 131 and 140: tails of 3 and 12 columns past the
    # chunks of 128 (chunk widths 8 and 16; the tiled recompute sums the first one's d kernel and
    # d bias columns itself).
    problem = _problem(15, (3, 20, 9, 16, vocab), blank=blank, ragged=False)
    _check_fused_kernels(problem, dtype, blank, options, 200, mode)


# 24,800 nodes in tiles of up to 20,000: at least one wave of the fused recompute (a block of
# 128 nodes per SM) on a GPU of up to 156 SMs, so the fused backward cuts its tiles to whole
# waves.
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_flash_rnnt_loss_fused_kernels_waves(dtype):
    problem = _problem(16, (8, 100, 30, 16, 131), blank=-1, ragged=False)
    _check_fused_kernels(problem, dtype, -1, {}, 20000)


# ------------------------------------------------------------------------------ numerical gradient

NUMERIC_DELTA = 1e-2
NUMERIC_TOL = 2e-3


def _smooth_problem(activation, shape=(2, 3, 2, 3, 5)):
    """A small problem whose relu pre-activations stay > 3 * delta away from the kink."""
    for seed in range(100):
        problem = _problem(100 + seed, shape, blank=1)
        pre = problem[0][:, :, None, :] + problem[1][:, None, :, :]
        if activation != "relu" or np.min(np.abs(pre)) > 3 * NUMERIC_DELTA:
            return problem
    raise AssertionError("no smooth problem found")


@pytest.mark.parametrize("mode", ["tiled", "untiled"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("device", DEVICES)
def test_joint_lattice_numerical_gradient(activation, mode, device):
    problem = _smooth_problem(activation)
    valid, label_used = _lattice_masks(problem)
    keep = tf.constant(np.stack([valid, label_used], axis=-1))
    labels, logit_lengths, label_lengths = problem[4:]

    def lattice_fn(encoder, predictor, kernel, bias):
        lattice = tf_rnnt.joint_lattice(encoder, predictor, kernel, bias, labels, logit_lengths,
                                        label_lengths, blank=1, activation=activation, mode=mode,
                                        tile_size=4 if mode == "tiled" else None)
        return tf.where(keep, lattice, 0.0)  # leave out the unspecified label entries

    with tf.device(device):
        theoretical, numerical = tf.test.compute_gradient(
            lattice_fn, [tf.constant(x, tf.float32) for x in problem[:4]], delta=NUMERIC_DELTA)
    for name, t, n in zip(JOINT_GRAD_NAMES, theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=NUMERIC_TOL, atol=NUMERIC_TOL, err_msg=name)


@pytest.mark.parametrize("device", DEVICES)
def test_flash_rnnt_loss_numerical_gradient(device):
    problem = _smooth_problem("tanh")
    labels, logit_lengths, label_lengths = problem[4:]

    def loss_fn(encoder, predictor, kernel, bias):
        return tf_rnnt.flash_rnnt_loss(encoder, predictor, kernel, bias, labels, logit_lengths,
                                       label_lengths, blank=1, tile_size=3)

    with tf.device(device):
        theoretical, numerical = tf.test.compute_gradient(
            loss_fn, [tf.constant(x, tf.float32) for x in problem[:4]], delta=NUMERIC_DELTA)
    for name, t, n in zip(JOINT_GRAD_NAMES, theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=NUMERIC_TOL, atol=NUMERIC_TOL, err_msg=name)


# ------------------------------------------------------------------------------ determinism

_DETERMINISM_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    import tf_rnnt
    tf.config.experimental.enable_op_determinism()
    device = sys.argv[1]
    rng = np.random.default_rng(0)
    B, T, U, H, V = 3, 24, 9, 16, 96
    with tf.device(device):
        params = [tf.constant(rng.normal(size=s).astype(np.float32))
                  for s in [(B, T, H), (B, U + 1, H), (H, V), (V,)]]
        labels = tf.constant(rng.integers(1, V, size=(B, U)).astype(np.int32))
        logit_lengths = tf.constant([T, T - 5, 11], tf.int32)
        label_lengths = tf.constant([U, 4, 7], tf.int32)

        def step(mode):
            with tf.GradientTape() as tape:
                tape.watch(params)
                costs = tf_rnnt.flash_rnnt_loss(*params, labels, logit_lengths, label_lengths,
                                                mode=mode, tile_size=7)
                total = tf.reduce_sum(costs)
            return [costs] + tape.gradient(total, params)

    result = {}
    for mode in ("tiled", "untiled"):
        try:
            first = [x.numpy() for x in step(mode)]
            second = [x.numpy() for x in step(mode)]
        except Exception as error:  # the op may refuse, saying so clearly
            result[mode] = {"error": type(error).__name__ + ": " + str(error)}
            continue
        result[mode] = {"bitwise_equal": all(np.array_equal(a, b)
                                             for a, b in zip(first, second)),
                        "finite": all(bool(np.all(np.isfinite(a))) for a in first)}
    print("RESULT " + json.dumps(result))
""")


def _run_subprocess(script, *argv, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True,
                          timeout=timeout, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"subprocess failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("device", DEVICES)
def test_op_determinism(device):
    result = _run_subprocess(_DETERMINISM_SCRIPT, device)
    for mode, outcome in result.items():
        if "error" in outcome:
            assert "determinis" in outcome["error"].lower(), (mode, outcome["error"])
        else:
            assert outcome["finite"], mode
            assert outcome["bitwise_equal"], f"{mode}: two runs differ under op determinism"


# ------------------------------------------------------------------------------ CPU vs GPU

@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["tiled", "untiled"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_cpu_gpu_parity(activation, mode):
    problem = _problem(16, (4, 13, 6, 32, 40), blank=-1)
    upstream = _upstream(4)
    results = [run_joint_loss(tf_rnnt.flash_rnnt_loss, problem, upstream, device, blank=-1,
                              activation=activation, mode=mode, tile_size=11, fastemit_lambda=0.1,
                              clamp=0.5) for device in ("/CPU:0", "/GPU:0")]
    compare_joint_results(results[1], (results[0][0], *results[0][1]), what="GPU vs CPU")

