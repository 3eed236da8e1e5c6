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
from conftest import compile_for

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
    upstream = np.ones(np.shape(logits)[0]) if upstream is None else upstream

    def step(logits, labels, logit_lengths, label_lengths, upstream):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            costs = loss_fn(logits, labels, logit_lengths, label_lengths, **options)
            total = tf.reduce_sum(costs * upstream)
        return costs, tape.gradient(total, logits)

    with tf.device(device):
        args = [tf.cast(tf.constant(logits, tf.float32), dtype), tf.constant(labels),
                tf.constant(logit_lengths), tf.constant(label_lengths),
                tf.constant(upstream, tf.float32)]
        costs, grad = compile_for(step, graph_mode, args)(*args)
    assert costs.dtype == tf.float32
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


@pytest.mark.parametrize("shape,durations,blank,sigma", REFERENCE_CASES)
def test_reference_matches_oracle(shape, durations, blank, sigma):
    logits, labels, logit_lengths, label_lengths = _tdt_problem(10, shape, durations, blank)
    logit_lengths = _feasible(logit_lengths, label_lengths, durations)
    logits = logits.astype(np.float32)
    upstream = oracle.upstream_weights(shape[0])
    costs, grads = oracle.tdt_loss(logits, labels, logit_lengths, label_lengths, durations,
                                   blank, sigma, upstream=upstream)
    got_costs, got_grads = run_tdt(reference.tdt_loss, logits, labels, logit_lengths,
                                   label_lengths, upstream, durations=durations, blank=blank,
                                   sigma=sigma)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, RTOL)


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


def test_reference_float64_lattice_matches_oracle_under_tf_function():
    # Unknown shapes (input_signature of None dims), a float64 lattice input (computed in
    # float32).
    durations = [0, 1, 2, 3]
    logits, labels, logit_lengths, label_lengths = _tdt_problem(12, (2, 5, 2, 3), durations)
    lattice = oracle.tdt_lattice_from_logits(logits, labels, durations)
    costs, grads = oracle.tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations)

    @tf.function(input_signature=[tf.TensorSpec([None] * 4, tf.float64),
                                  tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int32)])
    def step(lat, t_len, u_len):
        with tf.GradientTape() as tape:
            tape.watch(lat)
            c = reference.tdt_lattice_loss(tf.cast(lat, tf.float32), t_len, u_len, durations)
        return c, tape.gradient(c, lat)

    got_costs, got_grads = step(lattice, logit_lengths, label_lengths)
    oracle.assert_close(got_costs.numpy(), costs, RTOL)
    oracle.assert_close(got_grads.numpy(), grads, RTOL)
