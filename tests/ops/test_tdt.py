"""The TDT (Token-and-Duration Transducer) loss: oracle, reference and compiled op.

The float64 NumPy oracle (tests/oracle.py: explicit alpha/beta loops, gradients from move
posteriors) is checked against a brute-force sum over every alignment, closed-form path counts
and central differences; tf_rnnt.reference.tdt_loss (pure TF, autodiff) and the compiled op
(tf_rnnt.tdt_loss, tf_rnnt.tdt_lattice_loss) are checked against the oracle.
"""

import numpy as np
import oracle
import pytest
import tensorflow as tf
from rnnt_testing import DEVICES, compile_for, logits_loss_and_gradient, requires_gpu

import tf_rnnt
from tf_rnnt import ops as rnnt_ops
from tf_rnnt import reference

DURATIONS = [pytest.param([0, 1], id="d01"), pytest.param([0, 1, 2, 3, 4], id="d01234"),
             pytest.param([1, 2], id="d12")]


def _tdt_problem(seed, shape, durations, blank=0, ragged=True):
    return oracle.random_tdt_problem(np.random.default_rng(seed), *shape, durations, blank,
                                     ragged)


# ------------------------------------------------------------------------------ the oracle itself

@pytest.mark.parametrize("durations", DURATIONS)
@pytest.mark.parametrize("blank", [0, -1])
@pytest.mark.parametrize("seed", range(4))
def test_oracle_matches_brute_force(durations, blank, seed):
    # T <= 4, U <= 2, V <= 3: ragged lengths give T_b < max(durations) and U_b = 0 cases.
    rng = np.random.default_rng(seed)
    shape = (3, int(rng.integers(1, 5)), int(rng.integers(0, 3)), 3)
    logits, labels, logit_lengths, label_lengths = _tdt_problem(seed, shape, durations, blank)
    sigma = [0.0, 0.05, 0.3, 1.0][seed]
    costs, _ = oracle.tdt_loss(logits, labels, logit_lengths, label_lengths, durations, blank,
                               sigma)
    expected = oracle.tdt_brute_force_costs(logits, labels, logit_lengths, label_lengths,
                                            durations, blank, sigma)
    np.testing.assert_allclose(costs, expected, rtol=1e-12)


def test_oracle_brute_force_covers_edge_lengths():
    # Explicit edge cases: U_b = 0, T_b = 1 < max(durations), T_b = U_b (only durations with 0
    # can align), and an infeasible sample for durations without 0 (T_b <= U_b: cost +inf).
    for durations in ([0, 1], [0, 1, 2, 3, 4], [1, 2], [1, 3]):
        logits, labels, _, _ = _tdt_problem(5, (5, 4, 2, 3), durations, blank=-1)
        logit_lengths = np.array([1, 2, 4, 2, 3], np.int32)
        label_lengths = np.array([0, 0, 2, 2, 1], np.int32)
        costs, grads = oracle.tdt_loss(logits, labels, logit_lengths, label_lengths, durations,
                                       -1, 0.1)
        expected = oracle.tdt_brute_force_costs(logits, labels, logit_lengths, label_lengths,
                                                durations, -1, 0.1)
        np.testing.assert_allclose(costs, expected, rtol=1e-12, err_msg=str(durations))
        if 0 not in durations:
            assert np.isinf(costs[3]) and np.all(grads[3] == 0.0)


@pytest.mark.parametrize("durations,counts", [
    ([1], [1, 1, 1, 1, 1, 1]),
    ([1, 2], [1, 2, 3, 5, 8, 13]),          # compositions of T into 1s and 2s: Fibonacci
    ([1, 2, 3], [1, 2, 4, 7, 13, 24]),      # tribonacci
    ([0, 2], [0, 1, 0, 1, 0, 1]),           # only even T
])
def test_oracle_counts_blank_only_alignments(durations, counts):
    # U = 0 and a zero lattice: exp(-cost) is the number of ways to write T as an ordered sum
    # of the durations >= 1, a closed form independent of any recursion over the lattice.
    for num_frames, count in enumerate(counts, start=1):
        lattice = np.zeros((1, num_frames, 1, 2 + len(durations)))
        costs, _ = oracle.tdt_lattice_loss(lattice, [num_frames], [0], durations)
        np.testing.assert_allclose(np.exp(-costs), [count], rtol=1e-12)


@pytest.mark.parametrize("durations", DURATIONS)
def test_oracle_gradients_match_finite_differences(durations):
    logits, labels, logit_lengths, label_lengths = _tdt_problem(6, (2, 4, 2, 3), durations)
    logit_lengths[:] = [4, 3]
    label_lengths[:] = [2, 1]
    upstream = np.array([0.7, -1.3])
    _, grads = oracle.tdt_loss(logits, labels, logit_lengths, label_lengths, durations, 0, 0.2,
                               upstream=upstream)

    def total(x):
        return np.dot(oracle.tdt_brute_force_costs(x, labels, logit_lengths, label_lengths,
                                                   durations, 0, 0.2), upstream)

    np.testing.assert_allclose(grads, oracle.central_differences(total, logits), rtol=1e-6,
                               atol=1e-8)


def rnnt_as_tdt_lattice(rnnt_lattice, shift):
    """A TDT lattice with durations [0, 1] whose alignments are the RNN-T lattice's, up to
    exp(-shift): channels (blank + shift, label, 0, -shift), so a blank (always duration 1)
    scores blank, a label with duration 0 scores label, and a label with duration 1 scores
    label - shift (negligible). TDT labels may advance t, RNN-T labels never do: with normalized
    durations the two models differ, so this un-normalized lattice is the bridge."""
    blank, label = rnnt_lattice[..., :1], rnnt_lattice[..., 1:]
    return np.concatenate([blank + shift, label, np.zeros_like(blank),
                           np.full_like(blank, -shift)], axis=-1)


def test_oracle_embeds_rnnt():
    # An independent check against the RNN-T oracle: costs equal, and the blank and label
    # channels' gradients equal RNN-T's (FastEmit and clamp included).
    logits, labels, logit_lengths, label_lengths = oracle.random_problem(
        np.random.default_rng(8), 3, 5, 3, 4)
    rnnt_lattice = oracle.lattice_from_logits(logits, labels)
    upstream = np.array([1.0, -0.5, 2.0])
    for fastemit_lambda, clamp in ((0.0, -1.0), (0.4, 0.1)):
        costs, grads = oracle.lattice_loss(rnnt_lattice, logit_lengths, label_lengths,
                                           fastemit_lambda, clamp, upstream)
        tdt_costs, tdt_grads = oracle.tdt_lattice_loss(
            rnnt_as_tdt_lattice(rnnt_lattice, 80.0), logit_lengths, label_lengths, [0, 1],
            fastemit_lambda, clamp, upstream)
        np.testing.assert_allclose(tdt_costs, costs, rtol=1e-12)
        np.testing.assert_allclose(tdt_grads[..., :2], grads, rtol=1e-10, atol=1e-14)


def test_oracle_fastemit_scales_label_channel_and_clamp_clips():
    durations = [0, 1, 2]
    lattice = oracle.tdt_lattice_from_logits(
        *_tdt_problem(7, (2, 4, 2, 3), durations)[:2], durations)
    lengths = ([4, 3], [2, 1])
    _, plain = oracle.tdt_lattice_loss(lattice, *lengths, durations)
    _, fast = oracle.tdt_lattice_loss(lattice, *lengths, durations, fastemit_lambda=0.5)
    np.testing.assert_allclose(fast[..., 1], 1.5 * plain[..., 1], rtol=1e-12)
    np.testing.assert_array_equal(fast[..., [0, 2, 3, 4]], plain[..., [0, 2, 3, 4]])
    _, clamped = oracle.tdt_lattice_loss(lattice, *lengths, durations, clamp=0.1)
    assert np.max(np.abs(plain)) > 0.2
    np.testing.assert_array_equal(clamped, np.clip(plain, -0.1, 0.1))


# ------------------------------------------------------------------------------ the reference

RTOL = 1e-5


def run_tdt(loss_fn, logits, labels, logit_lengths, label_lengths, upstream=None,
            device="/CPU:0", graph_mode="eager", dtype=tf.float32, **options):
    """Costs and d (sum upstream * costs) / d logits of `loss_fn` (op or reference), float64."""
    costs, grad = logits_loss_and_gradient(
        loss_fn, logits, labels, logit_lengths, label_lengths, upstream, device, graph_mode, dtype,
        logits_source=tf.float64,
        upstream_dtype=tf.float64 if dtype == tf.float64 else tf.float32, **options)
    assert costs.dtype == (tf.float64 if dtype == tf.float64 else tf.float32)
    assert grad.dtype == dtype
    return costs.numpy().astype(np.float64), tf.cast(grad, tf.float64).numpy()


REFERENCE_CASES = [
    pytest.param((3, 6, 3, 5), [0, 1, 2, 3, 4], 0, 0.0, id="d01234_blank0"),
    pytest.param((3, 5, 2, 4), [0, 1], -1, 0.05, id="d01_blank_last_sigma"),
    pytest.param((3, 7, 2, 4), [1, 2], 2, 0.0, id="d12_blank_middle"),
    pytest.param((2, 3, 0, 3), [0, 1, 2, 3, 4], 0, 0.5, id="U0_T_lt_maxd"),
]


def _feasible(logit_lengths, label_lengths, durations):
    """Lengths with an alignment: without duration 0 each label takes a frame of its own."""
    if 0 not in durations:
        logit_lengths = np.maximum(logit_lengths, label_lengths + 1)
    return logit_lengths.astype(np.int32)


@pytest.mark.parametrize("dtype,rtol", [(tf.float32, RTOL), (tf.float64, 1e-10)],
                         ids=["float32", "float64"])
@pytest.mark.parametrize("shape,durations,blank,sigma", REFERENCE_CASES)
def test_reference_matches_oracle(shape, durations, blank, sigma, dtype, rtol):
    # The reference computes in float64 for float64 logits: agreement to 1e-10 there.
    logits, labels, logit_lengths, label_lengths = _tdt_problem(10, shape, durations, blank)
    logit_lengths = _feasible(logit_lengths, label_lengths, durations)
    if dtype == tf.float32:
        logits = logits.astype(np.float32)
    upstream = oracle.upstream_weights(shape[0])
    costs, grads = oracle.tdt_loss(logits, labels, logit_lengths, label_lengths, durations,
                                   blank, sigma, upstream=upstream)
    got_costs, got_grads = run_tdt(reference.tdt_loss, logits, labels, logit_lengths,
                                   label_lengths, upstream, dtype=dtype, durations=durations,
                                   blank=blank, sigma=sigma)
    oracle.assert_close(got_costs, costs, rtol)
    oracle.assert_close(got_grads, grads, rtol)


@pytest.mark.parametrize("fastemit_lambda,clamp", [(0.5, -1.0), (0.0, 0.05), (0.3, 0.05)])
def test_reference_fastemit_and_clamp_match_oracle(fastemit_lambda, clamp):
    durations = [0, 1, 2]
    logits, labels, logit_lengths, label_lengths = _tdt_problem(11, (3, 6, 3, 4), durations)
    logits = logits.astype(np.float32)
    upstream = np.array([2.0, 0.5, -3.0])
    costs, grads = oracle.tdt_loss(logits, labels, logit_lengths, label_lengths, durations, 0,
                                   0.1, fastemit_lambda, clamp, upstream)
    got_costs, got_grads = run_tdt(reference.tdt_loss, logits, labels, logit_lengths,
                                   label_lengths, upstream, durations=durations, sigma=0.1,
                                   fastemit_lambda=fastemit_lambda, clamp=clamp)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, RTOL)


def test_reference_float64_lattice_under_tf_function_with_fastemit_and_clamp():
    # Unknown shapes (input_signature of None dims), a float64 lattice computed in float64.
    durations = [0, 1, 2, 3]
    logits, labels, logit_lengths, label_lengths = _tdt_problem(12, (2, 5, 2, 3), durations)
    lattice = oracle.tdt_lattice_from_logits(logits, labels, durations)

    @tf.function(input_signature=[tf.TensorSpec([None] * 4, tf.float64),
                                  tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int32)])
    def step(lat, t_len, u_len):
        with tf.GradientTape() as tape:
            tape.watch(lat)
            c = reference.tdt_lattice_loss(lat, t_len, u_len, durations, fastemit_lambda=0.3,
                                           clamp=0.2)
        return c, tape.gradient(c, lat)

    costs, grads = oracle.tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations,
                                           0.3, 0.2)
    got_costs, got_grads = step(lattice, logit_lengths, label_lengths)
    assert got_costs.dtype == tf.float64
    oracle.assert_close(got_costs.numpy(), costs, 1e-10)
    oracle.assert_close(got_grads.numpy(), grads, 1e-10)


# ------------------------------------------------------------------------------ the compiled op

requires_library = pytest.mark.skipif(not rnnt_ops.library_available(),
                                      reason="op library not built")

# (shape (B, T, U, V), durations, blank, sigma): blank first, last and in the middle; T_b below
# max(durations) (ragged lengths of T = 3 against durations up to 4); U = 0.
OP_CASES = [
    pytest.param((3, 6, 3, 5), [0, 1, 2, 3, 4], 0, 0.0, id="d01234_blank0"),
    pytest.param((3, 3, 2, 4), [0, 1, 2, 3, 4], -1, 0.05, id="d01234_T3_blank_last_sigma"),
    pytest.param((3, 5, 2, 4), [0, 1], -1, 0.0, id="d01_blank_last"),
    pytest.param((3, 7, 3, 6), [1, 2], 3, 0.1, id="d12_blank_middle_sigma"),
    pytest.param((2, 4, 0, 3), [0, 1, 2, 3, 4], 0, 0.5, id="U0"),
]


def _tdt_lattice(seed, shape, durations, blank=0, sigma=0.0):
    logits, labels, logit_lengths, label_lengths = _tdt_problem(seed, shape, durations, blank)
    logit_lengths = _feasible(logit_lengths, label_lengths, durations)
    lattice = oracle.tdt_lattice_from_logits(logits, labels, durations, blank, sigma)
    return lattice.astype(np.float32), logit_lengths, label_lengths


def run_tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations, upstream=None,
                         device="/CPU:0", graph_mode="eager", jit_compile=None, **options):
    """Costs and d (sum upstream * costs) / d lattice from tf_rnnt.tdt_lattice_loss."""
    upstream = np.ones(lattice.shape[0]) if upstream is None else upstream

    def step(lattice, logit_lengths, label_lengths, upstream):
        with tf.GradientTape() as tape:
            tape.watch(lattice)
            costs = tf_rnnt.tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations,
                                             **options)
            total = tf.reduce_sum(costs * upstream)
        return costs, tape.gradient(total, lattice)

    with tf.device(device):
        args = [tf.constant(lattice, tf.float32), tf.constant(logit_lengths),
                tf.constant(label_lengths), tf.constant(upstream, tf.float32)]
        fn = (tf.function(step, jit_compile=True) if jit_compile
              else compile_for(step, graph_mode, args))
        costs, grad = fn(*args)
    return costs.numpy().astype(np.float64), grad.numpy().astype(np.float64)


@requires_library
@pytest.mark.parametrize("shape,durations,blank,sigma", OP_CASES)
@pytest.mark.parametrize("device", DEVICES)
def test_tdt_lattice_loss_matches_oracle(shape, durations, blank, sigma, device):
    lattice, logit_lengths, label_lengths = _tdt_lattice(20, shape, durations, blank, sigma)
    upstream = oracle.upstream_weights(shape[0])
    costs, grads = oracle.tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations,
                                           upstream=upstream)
    got_costs, got_grads = run_tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations,
                                                upstream, device)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, RTOL)


@requires_library
@pytest.mark.parametrize("fastemit_lambda,clamp", [(0.5, -1.0), (0.0, 0.05), (0.3, 0.05),
                                                   (0.0, 0.0)])
@pytest.mark.parametrize("device", DEVICES)
def test_tdt_lattice_loss_fastemit_and_clamp(fastemit_lambda, clamp, device):
    durations = [0, 1, 2, 3]
    lattice, logit_lengths, label_lengths = _tdt_lattice(21, (3, 6, 3, 5), durations)
    upstream = np.array([2.0, 0.5, -3.0])
    costs, grads = oracle.tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations,
                                           fastemit_lambda, clamp, upstream)
    if clamp > 0:  # the clamp must bite for the test to mean anything
        _, raw = oracle.tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations,
                                         fastemit_lambda)
        assert np.max(np.abs(raw)) > 2 * clamp
    got_costs, got_grads = run_tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations,
                                                upstream, device, fastemit_lambda=fastemit_lambda,
                                                clamp=clamp)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, RTOL)


@requires_library
@pytest.mark.parametrize("device", DEVICES)
def test_tdt_lattice_loss_embeds_rnnt(device):
    # Against the RNN-T oracle through an un-normalized [0, 1] TDT lattice (see
    # rnnt_as_tdt_lattice): a check that shares nothing with the TDT oracle.
    logits, labels, logit_lengths, label_lengths = oracle.random_problem(
        np.random.default_rng(22), 3, 6, 3, 5)
    rnnt_lattice = oracle.lattice_from_logits(logits, labels).astype(np.float32)
    costs, grads = oracle.lattice_loss(rnnt_lattice, logit_lengths, label_lengths)
    tdt_lattice = rnnt_as_tdt_lattice(rnnt_lattice.astype(np.float64), 30.0).astype(np.float32)
    got_costs, got_grads = run_tdt_lattice_loss(tdt_lattice, logit_lengths, label_lengths,
                                                [0, 1], device=device)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads[..., :2], grads, RTOL)


@requires_library
@pytest.mark.parametrize("device", DEVICES)
def test_tdt_lattice_loss_padding_is_ignored_and_gets_zero_gradient(device):
    durations = [0, 1, 2]
    shape = (4, 6, 4, 5)
    lattice, logit_lengths, label_lengths = _tdt_lattice(23, shape, durations)
    logit_lengths[:] = [6, 2, 4, 1]
    label_lengths[:] = [0, 4, 2, 3]
    pad = ~oracle.valid_node_mask(shape[1], shape[2] + 1, logit_lengths, label_lengths)
    garbage = np.random.default_rng(24).uniform(-1e4, 50.0, size=lattice.shape)
    lattice = np.where(pad[..., None], garbage, lattice).astype(np.float32)
    costs, grads = oracle.tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations)
    got_costs, got_grads = run_tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations,
                                                device=device, fastemit_lambda=0.5, clamp=0.1)
    oracle.assert_close(got_costs, costs, RTOL)
    assert np.all(got_grads[pad] == 0.0), "gradient leaked into the padded region"
    for b in range(shape[0]):  # the label channel at u = label_length is never used
        assert np.all(got_grads[b, :, label_lengths[b], 1] == 0.0)


@requires_library
@pytest.mark.parametrize("device", DEVICES)
def test_tdt_lattice_loss_without_alignment_is_inf_with_zero_gradient(device):
    # Durations without 0: every label takes a frame, and the final blank another.
    durations = [1, 2]
    lattice, _, _ = _tdt_lattice(25, (2, 3, 3, 4), durations)
    logit_lengths = np.array([3, 3], np.int32)
    label_lengths = np.array([3, 2], np.int32)
    costs, grads = oracle.tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations)
    got_costs, got_grads = run_tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations,
                                                device=device)
    assert np.isinf(got_costs[0]) and got_costs[0] > 0 and np.all(got_grads[0] == 0.0)
    oracle.assert_close(got_costs[1:], costs[1:], RTOL)
    oracle.assert_close(got_grads[1:], grads[1:], RTOL)


@requires_library
@pytest.mark.parametrize("device", DEVICES)
def test_tdt_lattice_loss_graph_modes(graph_mode, device):
    durations = [0, 1, 2, 4]
    lattice, logit_lengths, label_lengths = _tdt_lattice(26, (3, 7, 4, 6), durations)
    costs, grads = oracle.tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations)
    got_costs, got_grads = run_tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations,
                                                None, device, graph_mode)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, RTOL)


@requires_library
@pytest.mark.parametrize("device", DEVICES)
def test_tdt_lattice_loss_jit_compile(device):
    # Under XLA the op lowers to the custom call on the same kernels (or, for a library without
    # XLA kernels, to the reference).
    durations = [0, 1, 2, 3, 4]
    lattice, logit_lengths, label_lengths = _tdt_lattice(27, (3, 5, 3, 4), durations)
    upstream = oracle.upstream_weights(3)
    costs, grads = oracle.tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations, 0.2,
                                           0.3, upstream)
    got_costs, got_grads = run_tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations,
                                                upstream, device, jit_compile=True,
                                                fastemit_lambda=0.2, clamp=0.3)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, RTOL)


# ------------------------------------------------------------------------------ tdt_loss


def _tdt_logits_problem(seed, shape, durations, blank=0):
    logits, labels, logit_lengths, label_lengths = _tdt_problem(seed, shape, durations, blank)
    logit_lengths = _feasible(logit_lengths, label_lengths, durations)
    return logits.astype(np.float32), labels, logit_lengths, label_lengths


@requires_library
@pytest.mark.parametrize("shape,durations,blank,sigma", OP_CASES)
@pytest.mark.parametrize("device", DEVICES)
def test_tdt_loss_matches_oracle(shape, durations, blank, sigma, device):
    logits, labels, logit_lengths, label_lengths = _tdt_logits_problem(30, shape, durations,
                                                                       blank)
    upstream = oracle.upstream_weights(shape[0])
    costs, grads = oracle.tdt_loss(logits, labels, logit_lengths, label_lengths, durations,
                                   blank, sigma, upstream=upstream)
    got_costs, got_grads = run_tdt(tf_rnnt.tdt_loss, logits, labels, logit_lengths,
                                   label_lengths, upstream, device, durations=durations,
                                   blank=blank, sigma=sigma)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, RTOL)
    pad = ~oracle.valid_node_mask(shape[1], shape[2] + 1, logit_lengths, label_lengths)
    assert np.all(got_grads[pad] == 0.0), "gradient leaked into the padded region"


@requires_library
@pytest.mark.parametrize("fastemit_lambda,clamp", [(0.5, -1.0), (0.0, 0.05), (0.3, 0.05)])
@pytest.mark.parametrize("device", DEVICES)
def test_tdt_loss_fastemit_and_clamp(fastemit_lambda, clamp, device):
    durations = [0, 1, 2]
    logits, labels, logit_lengths, label_lengths = _tdt_logits_problem(31, (3, 6, 3, 5),
                                                                       durations, -1)
    upstream = np.array([2.0, 0.5, -3.0])
    costs, grads = oracle.tdt_loss(logits, labels, logit_lengths, label_lengths, durations, -1,
                                   0.05, fastemit_lambda, clamp, upstream)
    got_costs, got_grads = run_tdt(tf_rnnt.tdt_loss, logits, labels, logit_lengths,
                                   label_lengths, upstream, device, durations=durations, blank=-1,
                                   sigma=0.05, fastemit_lambda=fastemit_lambda, clamp=clamp)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, RTOL)


# As tests/test_rnnt_ops.py: half-precision logits, costs within the float32 tolerance of the
# oracle on the rounded inputs, d logits within what one rounding to the dtype allows.
UNIT_ROUNDOFF = {tf.float16: 2.0 ** -11, tf.bfloat16: 2.0 ** -8}


@requires_library
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("device", DEVICES)
def test_tdt_loss_half_precision(dtype, device):
    durations = [0, 1, 2, 3, 4]
    logits, labels, logit_lengths, label_lengths = _tdt_logits_problem(32, (3, 6, 3, 5),
                                                                       durations, -1)
    rounded = tf.cast(tf.cast(tf.constant(logits), dtype), tf.float64).numpy()
    costs, grads = oracle.tdt_loss(rounded, labels, logit_lengths, label_lengths, durations, -1,
                                   0.05)
    got_costs, got_grads = run_tdt(tf_rnnt.tdt_loss, rounded, labels, logit_lengths,
                                   label_lengths, None, device, dtype=dtype, durations=durations,
                                   blank=-1, sigma=0.05)
    oracle.assert_close(got_costs, costs, RTOL)
    u = UNIT_ROUNDOFF[dtype]
    np.testing.assert_allclose(got_grads, grads, rtol=2 * u, atol=u * np.max(np.abs(grads)))


@requires_library
@pytest.mark.parametrize("device", DEVICES)
def test_tdt_loss_graph_modes(graph_mode, device):
    durations = [0, 1, 2, 3, 4]
    logits, labels, logit_lengths, label_lengths = _tdt_logits_problem(33, (3, 6, 4, 7),
                                                                       durations, 3)
    costs, grads = oracle.tdt_loss(logits, labels, logit_lengths, label_lengths, durations, 3,
                                   0.1)
    got_costs, got_grads = run_tdt(tf_rnnt.tdt_loss, logits, labels, logit_lengths,
                                   label_lengths, None, device, graph_mode, durations=durations,
                                   blank=3, sigma=0.1)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, RTOL)


@requires_library
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("device", DEVICES)
def test_tdt_loss_jit_compile(dtype, device):
    durations = [0, 1, 2]
    logits, labels, logit_lengths, label_lengths = _tdt_logits_problem(34, (3, 5, 3, 6),
                                                                       durations, 0)
    rounded = tf.cast(tf.cast(tf.constant(logits), dtype), tf.float64).numpy()
    upstream = oracle.upstream_weights(3)
    costs, grads = oracle.tdt_loss(rounded, labels, logit_lengths, label_lengths, durations, 0,
                                   0.05, 0.1, 0.5, upstream)

    @tf.function(jit_compile=True)
    def step(x, labels, t_len, u_len, upstream):
        with tf.GradientTape() as tape:
            tape.watch(x)
            c = tf_rnnt.tdt_loss(x, labels, t_len, u_len, durations, sigma=0.05,
                                 fastemit_lambda=0.1, clamp=0.5)
            total = tf.reduce_sum(c * upstream)
        return c, tape.gradient(total, x)

    with tf.device(device):
        got_costs, got_grads = step(tf.cast(rounded, dtype), labels, logit_lengths,
                                    label_lengths, tf.constant(upstream, tf.float32))
    oracle.assert_close(got_costs.numpy(), costs, RTOL)
    got_grads = tf.cast(got_grads, tf.float64).numpy()
    if dtype == tf.float32:
        oracle.assert_close(got_grads, grads, RTOL)
    else:
        u = UNIT_ROUNDOFF[dtype]
        np.testing.assert_allclose(got_grads, grads, rtol=2 * u, atol=u * np.max(np.abs(grads)))


@requires_library
@pytest.mark.parametrize("device", DEVICES)
def test_tdt_loss_int64_labels_and_lengths(device):
    durations = [0, 1, 2]
    logits, labels, logit_lengths, label_lengths = _tdt_logits_problem(35, (3, 5, 3, 6),
                                                                       durations)
    run32 = run_tdt(tf_rnnt.tdt_loss, logits, labels, logit_lengths, label_lengths,
                    device=device, durations=durations)
    run64 = run_tdt(tf_rnnt.tdt_loss, logits, labels.astype(np.int64),
                    logit_lengths.astype(np.int64), label_lengths.astype(np.int64),
                    device=device, durations=durations)
    np.testing.assert_array_equal(run64[0], run32[0])
    np.testing.assert_array_equal(run64[1], run32[1])


# ------------------------------------------------------------------------------ omega


@requires_library
@pytest.mark.parametrize("device", DEVICES)
def test_tdt_loss_omega_one_is_rnnt_on_token_logits(device):
    durations = [0, 1, 2, 3, 4]
    vocab = 5
    logits, labels, logit_lengths, label_lengths = _tdt_logits_problem(36, (3, 6, 3, vocab),
                                                                       durations, -1)
    upstream = oracle.upstream_weights(3)
    costs, token_grads = oracle.rnnt_loss(logits[..., :vocab], labels, logit_lengths,
                                          label_lengths, -1, 0.2, 0.5, upstream)
    got_costs, got_grads = run_tdt(tf_rnnt.tdt_loss, logits, labels, logit_lengths,
                                   label_lengths, upstream, device, durations=durations, blank=-1,
                                   sigma=0.3, fastemit_lambda=0.2, clamp=0.5, omega=1.0)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads[..., :vocab], token_grads, RTOL)
    assert np.all(got_grads[..., vocab:] == 0.0), "the RNN-T loss must not train the durations"


def _omega_run(logits, labels, logit_lengths, label_lengths, durations, omega, seed):
    return run_tdt(tf_rnnt.tdt_loss, logits, labels, logit_lengths, label_lengths,
                   graph_mode="function", durations=durations, sigma=0.1, omega=omega,
                   seed=seed)


@requires_library
def test_tdt_loss_omega_draws_repeat_for_a_seed():
    durations = [0, 1, 2]
    vocab = 4
    logits, labels, logit_lengths, label_lengths = _tdt_logits_problem(37, (2, 4, 2, vocab),
                                                                       durations)
    tdt_costs, _ = oracle.tdt_loss(logits, labels, logit_lengths, label_lengths, durations, 0,
                                   0.1)
    rnnt_costs, _ = oracle.rnnt_loss(logits[..., :vocab], labels, logit_lengths, label_lengths)
    got, _ = _omega_run(logits, labels, logit_lengths, label_lengths, durations, 0.0, None)
    oracle.assert_close(got, tdt_costs, RTOL)
    outcomes = []
    for seed in range(12):
        draw = float(tf.random.stateless_uniform([], tf.constant([seed, 7], tf.int64)))
        first = _omega_run(logits, labels, logit_lengths, label_lengths, durations, 0.5,
                           (seed, 7))
        again = _omega_run(logits, labels, logit_lengths, label_lengths, durations, 0.5,
                           (seed, 7))
        np.testing.assert_array_equal(first[0], again[0])
        np.testing.assert_array_equal(first[1], again[1])
        oracle.assert_close(first[0], rnnt_costs if draw < 0.5 else tdt_costs, RTOL)
        outcomes.append(draw < 0.5)
    assert any(outcomes) and not all(outcomes), "12 draws should pick both losses"


# ------------------------------------------------------------------------------ bad inputs


@requires_library
@pytest.mark.parametrize("durations,match", [
    ([0, 2, 1], "strictly increasing"), ([1, 1, 2], "strictly increasing"),
    ([0, 2, 3], "must contain 1"), ([-1, 1], "non-negative"), ([1, 0], "strictly increasing"),
    ([], "non-empty"), ([0, 1.0], "non-empty list of ints"), (3, "list of ints"),
    ([True, 2], "non-empty list of ints"), (list(range(66)), "at most 64"),
])
def test_tdt_loss_rejects_bad_durations(durations, match):
    logits = np.zeros((1, 2, 2, 6), np.float32)
    for fn, args in ((tf_rnnt.tdt_loss, (logits, [[1]], [2], [1])),
                     (tf_rnnt.tdt_lattice_loss, (np.zeros((1, 2, 2, 4), np.float32), [2], [1])),
                     (reference.tdt_loss, (logits, [[1]], [2], [1]))):
        with pytest.raises(ValueError, match=match) as info:
            fn(*args, durations=durations)
        assert "durations" in str(info.value)


@requires_library
def test_tdt_loss_rejects_bad_options_and_shapes():
    logits = np.zeros((1, 3, 2, 6), np.float32)
    args = (logits, [[1]], [3], [1])
    durations = [0, 1, 2]
    cases = [
        (dict(blank=3), "blank must be in \\[-V, V\\) for V = 3"),
        (dict(blank=-4), "blank must be in"),
        (dict(sigma=-0.1), "sigma must be a finite number >= 0"),
        (dict(sigma=float("nan")), "sigma"),
        (dict(omega=1.5), "omega must be a number in \\[0, 1\\]"),
        (dict(omega=0.5, seed=(1, 2, 3)), "seed must be None or a pair of ints"),
        (dict(fastemit_lambda=-1.0), "fastemit_lambda"),
        (dict(clamp=float("nan")), "clamp"),
    ]
    for options, match in cases:
        with pytest.raises(ValueError, match=match):
            tf_rnnt.tdt_loss(*args, durations=durations, **options)
    with pytest.raises(ValueError, match="V >= 1 token logits and D = len\\(durations\\) = 3"):
        tf_rnnt.tdt_loss(np.zeros((1, 3, 2, 3), np.float32), [[1]], [3], [1], durations)
    with pytest.raises(ValueError, match="2 \\+ D\\] with D = len\\(durations\\) = 3"):
        tf_rnnt.tdt_lattice_loss(np.zeros((1, 3, 2, 4), np.float32), [3], [1], durations)
    with pytest.raises(ValueError, match="logits must be one of"):
        tf_rnnt.tdt_loss(np.zeros((1, 3, 2, 6), np.int32), [[1]], [3], [1], durations)


@requires_library
def test_tdt_loss_run_time_errors_name_the_argument():
    durations = [0, 1]
    logits = np.zeros((2, 3, 3, 6), np.float32)
    labels = np.array([[1, 2], [1, 2]], np.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="labels\\[1, 0\\] = 0 is the blank"):
        tf_rnnt.tdt_loss(logits, np.array([[1, 2], [0, 1]], np.int32), [3, 3], [2, 2], durations)
    with pytest.raises(tf.errors.InvalidArgumentError, match="logit_lengths\\[1\\] = 4"):
        tf_rnnt.tdt_loss(logits, labels, [3, 4], [2, 2], durations)
    with pytest.raises(tf.errors.InvalidArgumentError, match="label_lengths\\[0\\] = 3"):
        tf_rnnt.tdt_loss(logits, labels, [3, 3], [3, 2], durations)
    with pytest.raises(tf.errors.InvalidArgumentError, match="logit_lengths\\[0\\] = 0"):
        tf_rnnt.tdt_lattice_loss(np.zeros((2, 3, 3, 4), np.float32), [0, 3], [2, 2], durations)

    # Unknown last axis: the split checks V >= 1 when the graph runs.
    @tf.function(input_signature=[tf.TensorSpec([None] * 4, tf.float32)])
    def dynamic(x):
        return tf_rnnt.tdt_loss(x, labels, [3, 3], [2, 2], [0, 1, 2, 3, 4, 5])

    with pytest.raises(tf.errors.InvalidArgumentError, match="V >= 1 token logits"):
        dynamic(logits)


# ------------------------------------------------------------------------------ more shapes


@requires_library
@pytest.mark.parametrize("device", DEVICES)
def test_tdt_loss_larger_case(device):
    # Enough samples for the CPU kernel to shard them over threads.
    durations = [0, 1, 2, 3, 4]
    shape = (8, 20, 8, 12)
    logits, labels, logit_lengths, label_lengths = _tdt_logits_problem(40, shape, durations, -1)
    upstream = oracle.upstream_weights(shape[0])
    costs, grads = oracle.tdt_loss(logits, labels, logit_lengths, label_lengths, durations, -1,
                                   0.05, upstream=upstream)
    got_costs, got_grads = run_tdt(tf_rnnt.tdt_loss, logits, labels, logit_lengths,
                                   label_lengths, upstream, device, durations=durations,
                                   blank=-1, sigma=0.05)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, RTOL)


@requires_library
@pytest.mark.parametrize("device", DEVICES)
def test_tdt_lattice_loss_more_labels_than_a_block_has_threads(device):
    # U + 1 = 1101 positions on a diagonal, more than the GPU kernel's 1024 threads a block.
    # The alphas reach |log P| ~ 27 over 1100 float32 steps: log P carries ~1e-4 of rounding
    # (the oracle is float64), which every gradient entry inherits relative to its size.
    durations = [0, 1, 2]
    rng = np.random.default_rng(41)
    logit_lengths, label_lengths = np.array([5, 4], np.int32), np.array([1100, 700], np.int32)
    lattice = rng.uniform(-0.05, 0.0, size=(2, 5, 1101, 5)).astype(np.float32)
    upstream = oracle.upstream_weights(2)
    costs, grads = oracle.tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations,
                                           upstream=upstream)
    got_costs, got_grads = run_tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations,
                                                upstream, device)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, 2e-4)


@requires_library
@pytest.mark.parametrize("entry", ["tdt_loss", "tdt_lattice_loss"])
def test_second_order_gradient_raises(entry):
    durations = [0, 1]
    logits, labels, logit_lengths, label_lengths = _tdt_logits_problem(42, (2, 3, 2, 4),
                                                                       durations)
    if entry == "tdt_loss":
        x = tf.constant(logits)
        loss = lambda x: tf_rnnt.tdt_loss(x, labels, logit_lengths, label_lengths,  # noqa: E731
                                          durations)
    else:
        x = tf.constant(oracle.tdt_lattice_from_logits(logits, labels, durations), tf.float32)
        loss = lambda x: tf_rnnt.tdt_lattice_loss(x, logit_lengths, label_lengths,  # noqa: E731
                                                  durations)
    with tf.GradientTape() as outer:
        outer.watch(x)
        with tf.GradientTape() as inner:
            inner.watch(x)
            total = tf.reduce_sum(loss(x))
        grad = inner.gradient(total, x)
        norm = tf.reduce_sum(grad * grad)
    with pytest.raises(tf_rnnt.SecondOrderGradientError, match=entry):
        outer.gradient(norm, x)


@requires_gpu
@pytest.mark.gpu
def test_tdt_cpu_gpu_parity():
    durations = [0, 1, 2, 3, 4]
    shape = (4, 12, 6, 9)
    logits, labels, logit_lengths, label_lengths = _tdt_logits_problem(43, shape, durations, 0)
    upstream = oracle.upstream_weights(shape[0])
    results = [run_tdt(tf_rnnt.tdt_loss, logits, labels, logit_lengths, label_lengths, upstream,
                       device, durations=durations, sigma=0.05, fastemit_lambda=0.1, clamp=0.5)
               for device in ("/CPU:0", "/GPU:0")]
    for cpu, gpu in zip(*results):
        oracle.assert_close(gpu, cpu, RTOL)
