"""The RNN-T loss ops: lattice_loss, logits_to_lattice, rnnt_loss.

Every op result is compared with the float64 NumPy oracle (tests/oracle.py), which is itself
checked here against tf_rnnt.reference (pure TF, autodiff) and finite differences.
float32: costs and gradients within 1e-5 relative (oracle.assert_close: relative to each entry
plus the tensor's largest entry).
"""

import numpy as np
import oracle
import pytest
import tensorflow as tf
from rnnt_testing import (
    DEVICES,
    HALF_DTYPES,
    compile_for,
    logits_loss_and_gradient,
    requires_gpu,
)

import tf_rnnt
from tf_rnnt import reference

RTOL = 1e-5

# (batch, max_t, max_u, vocab): ragged lengths are drawn per sample, the max always attained.
SHAPES = [
    pytest.param((3, 6, 3, 5), id="B3_T6_U3_V5"),
    pytest.param((2, 9, 5, 7), id="B2_T9_U5_V7"),
    pytest.param((3, 3, 7, 6), id="U_gt_T"),
    pytest.param((2, 1, 4, 4), id="T1"),
    pytest.param((2, 5, 0, 4), id="U0"),
]
BLANKS = [pytest.param(0, id="blank0"), pytest.param(-1, id="blank_last"),
          pytest.param("middle", id="blank_middle")]


_blank = oracle.blank_id


def _problem(seed, shape, blank=0, ragged=True):
    rng = np.random.default_rng(seed)
    return oracle.random_problem(rng, *shape, blank=blank, ragged=ragged)


_upstream = oracle.upstream_weights


def _padding_mask(shape_btu, logit_lengths, label_lengths):
    return ~oracle.valid_node_mask(shape_btu[1], shape_btu[2], logit_lengths, label_lengths)


# ------------------------------------------------------------------------------ runners

def run_lattice_loss(lattice, logit_lengths, label_lengths, upstream=None, device="/CPU:0",
                     graph_mode="eager", **options):
    """Costs and d (sum upstream * costs) / d lattice from tf_rnnt.lattice_loss, as NumPy."""
    lattice = np.asarray(lattice)
    upstream = np.ones(lattice.shape[0]) if upstream is None else upstream

    def step(lattice, logit_lengths, label_lengths, upstream):
        with tf.GradientTape() as tape:
            tape.watch(lattice)
            costs = tf_rnnt.lattice_loss(lattice, logit_lengths, label_lengths, **options)
            total = tf.reduce_sum(costs * upstream)
        return costs, tape.gradient(total, lattice)

    with tf.device(device):
        args = [tf.constant(lattice, tf.float32), tf.constant(logit_lengths),
                tf.constant(label_lengths), tf.constant(upstream, tf.float32)]
        costs, grad = compile_for(step, graph_mode, args)(*args)
    return costs.numpy(), grad.numpy()


def run_rnnt_loss(loss_fn, logits, labels, logit_lengths, label_lengths, upstream=None,
                  device="/CPU:0", graph_mode="eager", dtype=tf.float32, **options):
    """Costs and d (sum upstream * costs) / d logits of `loss_fn` (op or reference)."""
    costs, grad = logits_loss_and_gradient(loss_fn, logits, labels, logit_lengths,
                                           label_lengths, upstream, device, graph_mode, dtype,
                                           **options)
    assert costs.dtype == tf.float32
    assert grad.dtype == dtype
    return costs.numpy(), tf.cast(grad, tf.float64).numpy()


def run_logits_to_lattice(logits, labels, d_lattice, blank=0, device="/CPU:0",
                          graph_mode="eager", dtype=tf.float32):
    """Lattice and d sum(d_lattice * lattice) / d logits from tf_rnnt.logits_to_lattice."""

    def step(logits, labels, d_lattice):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            lattice = tf_rnnt.logits_to_lattice(logits, labels, blank=blank)
            total = tf.reduce_sum(lattice * d_lattice)
        return lattice, tape.gradient(total, logits)

    with tf.device(device):
        args = [tf.cast(tf.constant(logits, tf.float32), dtype), tf.constant(labels),
                tf.constant(d_lattice, tf.float32)]
        lattice, grad = compile_for(step, graph_mode, args)(*args)
    assert lattice.dtype == tf.float32
    assert grad.dtype == dtype
    return lattice.numpy(), tf.cast(grad, tf.float64).numpy()


def _assert_int64_run_matches(run32, run64):
    """The (values, gradients) of a run given int64 labels or lengths equal the int32 run's."""
    np.testing.assert_allclose(run64[0], run32[0], rtol=1e-6)
    np.testing.assert_allclose(run64[1], run32[1], rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------------ the oracle itself

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("blank", BLANKS)
def test_oracle_matches_reference(shape, blank):
    blank = _blank(blank, shape[3])
    logits, labels, logit_lengths, label_lengths = _problem(0, shape, blank)
    upstream = _upstream(shape[0])
    costs, grads = oracle.rnnt_loss(logits, labels, logit_lengths, label_lengths, blank,
                                    upstream=upstream)
    ref_costs, ref_grads = run_rnnt_loss(reference.rnnt_loss, logits, labels, logit_lengths,
                                         label_lengths, upstream, blank=blank)
    oracle.assert_close(ref_costs, costs, RTOL)
    oracle.assert_close(ref_grads, grads, RTOL)


@pytest.mark.parametrize("fastemit_lambda,clamp", [(0.5, -1.0), (0.0, 0.05), (0.3, 0.05)])
def test_oracle_fastemit_and_clamp_match_reference(fastemit_lambda, clamp):
    logits, labels, logit_lengths, label_lengths = _problem(1, (3, 6, 3, 5))
    upstream = _upstream(3)
    costs, grads = oracle.rnnt_loss(logits, labels, logit_lengths, label_lengths, 0,
                                    fastemit_lambda, clamp, upstream)
    ref_costs, ref_grads = run_rnnt_loss(reference.rnnt_loss, logits, labels, logit_lengths,
                                         label_lengths, upstream, fastemit_lambda=fastemit_lambda,
                                         clamp=clamp)
    oracle.assert_close(ref_costs, costs, RTOL)
    oracle.assert_close(ref_grads, grads, RTOL)


def test_oracle_gradients_match_finite_differences():
    logits, labels, logit_lengths, label_lengths = _problem(2, (2, 4, 3, 4), blank=-1)
    upstream = np.array([0.7, -1.3])
    _, grads = oracle.rnnt_loss(logits, labels, logit_lengths, label_lengths, -1,
                                upstream=upstream)

    def total(x):
        return np.dot(oracle.rnnt_loss(x, labels, logit_lengths, label_lengths, -1)[0], upstream)

    np.testing.assert_allclose(grads, oracle.central_differences(total, logits), rtol=1e-6,
                               atol=1e-8)

    lattice = oracle.lattice_from_logits(logits, labels, -1)
    _, lattice_grads = oracle.lattice_loss(lattice, logit_lengths, label_lengths,
                                           upstream=upstream)

    def lattice_total(x):
        return np.dot(oracle.lattice_loss(x, logit_lengths, label_lengths)[0], upstream)

    np.testing.assert_allclose(lattice_grads, oracle.central_differences(lattice_total, lattice),
                               rtol=1e-6, atol=1e-8)


# ------------------------------------------------------------------------------ lattice_loss

def _random_lattice(seed, shape, blank=0, ragged=True):
    logits, labels, logit_lengths, label_lengths = _problem(seed, shape, blank, ragged)
    return oracle.lattice_from_logits(logits, labels, blank), logit_lengths, label_lengths


def _assert_lattice_loss_matches_oracle(lattice, logit_lengths, label_lengths, upstream, device,
                                        graph_mode="eager"):
    costs, grads = oracle.lattice_loss(lattice, logit_lengths, label_lengths, upstream=upstream)
    got_costs, got_grads = run_lattice_loss(lattice, logit_lengths, label_lengths, upstream,
                                            device, graph_mode)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, RTOL)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("device", DEVICES)
def test_lattice_loss_matches_oracle(shape, device):
    lattice, logit_lengths, label_lengths = _random_lattice(3, shape)
    lattice = lattice.astype(np.float32)  # the oracle sees exactly the op's input
    upstream = _upstream(shape[0])
    _assert_lattice_loss_matches_oracle(lattice, logit_lengths, label_lengths, upstream, device)


@pytest.mark.parametrize("device", DEVICES)
def test_lattice_loss_graph_modes(graph_mode, device):
    lattice, logit_lengths, label_lengths = _random_lattice(4, (3, 7, 4, 6))
    lattice = lattice.astype(np.float32)
    _assert_lattice_loss_matches_oracle(lattice, logit_lengths, label_lengths, None, device,
                                        graph_mode)


@pytest.mark.parametrize("fastemit_lambda,clamp", [(0.5, -1.0), (0.0, 0.05), (0.3, 0.05),
                                                   (0.0, 0.0)])
@pytest.mark.parametrize("device", DEVICES)
def test_lattice_loss_fastemit_and_clamp(fastemit_lambda, clamp, device):
    lattice, logit_lengths, label_lengths = _random_lattice(5, (3, 6, 4, 5))
    lattice = lattice.astype(np.float32)
    upstream = np.array([2.0, 0.5, -3.0])
    costs, grads = oracle.lattice_loss(lattice, logit_lengths, label_lengths, fastemit_lambda,
                                       clamp, upstream)
    if clamp > 0:  # the clamp must actually bite for this test to mean anything
        _, raw = oracle.lattice_loss(lattice, logit_lengths, label_lengths, fastemit_lambda)
        assert np.max(np.abs(raw)) > 2 * clamp
    got_costs, got_grads = run_lattice_loss(lattice, logit_lengths, label_lengths, upstream,
                                            device, fastemit_lambda=fastemit_lambda, clamp=clamp)
    plain_costs, _ = oracle.lattice_loss(lattice, logit_lengths, label_lengths)
    oracle.assert_close(got_costs, plain_costs, RTOL)  # FastEmit and clamp leave the cost alone
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, RTOL)


@pytest.mark.parametrize("device", DEVICES)
def test_lattice_loss_padding_is_ignored_and_gets_zero_gradient(device):
    shape = (4, 6, 4, 5)
    lattice, logit_lengths, label_lengths = _random_lattice(6, shape)
    logit_lengths[:] = [6, 2, 4, 1]
    label_lengths[:] = [0, 4, 2, 3]
    pad = _padding_mask(lattice.shape, logit_lengths, label_lengths)
    garbage = np.random.default_rng(7).uniform(-1e4, 50.0, size=lattice.shape)
    lattice = np.where(pad[..., None], garbage, lattice).astype(np.float32)
    costs, grads = oracle.lattice_loss(lattice, logit_lengths, label_lengths)
    for fastemit_lambda, clamp in [(0.0, -1.0), (0.5, 0.1)]:
        got_costs, got_grads = run_lattice_loss(lattice, logit_lengths, label_lengths, None,
                                                device, fastemit_lambda=fastemit_lambda,
                                                clamp=clamp)
        oracle.assert_close(got_costs, costs, RTOL)
        assert np.all(got_grads[pad] == 0.0), "gradient leaked into the padded region"
        # Also the unused label channel at u = label_length (never taken by a path).
        for b in range(shape[0]):
            assert np.all(got_grads[b, :, label_lengths[b], 1] == 0.0)


@pytest.mark.parametrize("device", DEVICES)
def test_lattice_loss_more_labels_than_a_block_has_threads(device):
    # U + 1 = 1101 positions on a diagonal, more than the 1024 threads of the GPU kernel's block:
    # some threads take two positions. Log-probabilities near 0 keep the costs small: float32
    # sums along 1100 steps of log-softmax picks would lose the precision asked for here.
    rng = np.random.default_rng(9)
    logit_lengths, label_lengths = np.array([5, 4], np.int32), np.array([1100, 700], np.int32)
    lattice = rng.uniform(-0.05, 0.0, size=(2, 5, 1101, 2)).astype(np.float32)
    upstream = _upstream(2)
    _assert_lattice_loss_matches_oracle(lattice, logit_lengths, label_lengths, upstream, device)


@pytest.mark.parametrize("device", DEVICES)
def test_lattice_loss_single_node(device):
    # T = 1, no labels: the only path is one blank, so cost = -lattice[0, 0, 0] and its
    # gradient is -1 there.
    lattice = np.array([[[[-0.25, -3.0]]], [[[-2.5, -1.0]]]], np.float32)
    got_costs, got_grads = run_lattice_loss(lattice, np.array([1, 1], np.int32),
                                            np.array([0, 0], np.int32), None, device)
    oracle.assert_close(got_costs, [0.25, 2.5], RTOL)
    np.testing.assert_array_equal(got_grads, [[[[-1.0, 0.0]]], [[[-1.0, 0.0]]]])


@pytest.mark.parametrize("device", DEVICES)
def test_lattice_loss_int64_lengths(device):
    lattice, logit_lengths, label_lengths = _random_lattice(8, (3, 5, 3, 4))
    lattice = lattice.astype(np.float32)
    _assert_int64_run_matches(
        run_lattice_loss(lattice, logit_lengths, label_lengths, None, device),
        run_lattice_loss(lattice, logit_lengths.astype(np.int64), label_lengths.astype(np.int64),
                         None, device))


# ------------------------------------------------------------------------------ logits_to_lattice

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("blank", BLANKS)
@pytest.mark.parametrize("device", DEVICES)
def test_logits_to_lattice_matches_oracle(shape, blank, device):
    blank = _blank(blank, shape[3])
    logits, labels, _, _ = _problem(9, shape, blank)
    logits = logits.astype(np.float32)
    d_lattice = np.random.default_rng(10).normal(size=shape[:2] + (shape[2] + 1, 2))
    lattice, grads = run_logits_to_lattice(logits, labels, d_lattice, blank, device)
    expected = oracle.lattice_from_logits(logits, labels, blank)
    oracle.assert_close(lattice, expected, RTOL)
    assert np.all(lattice[:, :, -1, 1] == 0.0), "label channel at u = U must be 0"
    oracle.assert_close(grads, oracle.logits_grad_from_lattice_grad(logits, labels, d_lattice,
                                                                    blank), RTOL)


@pytest.mark.parametrize("device", DEVICES)
def test_logits_to_lattice_graph_modes_and_large_logits(graph_mode, device):
    # Logits of magnitude ~100: the log-sum-exp must be max-shifted to stay finite and exact.
    logits, labels, _, _ = _problem(11, (2, 5, 3, 6))
    logits = (100.0 * logits).astype(np.float32)
    d_lattice = np.random.default_rng(12).normal(size=(2, 5, 4, 2))
    lattice, grads = run_logits_to_lattice(logits, labels, d_lattice, -1, device, graph_mode)
    oracle.assert_close(lattice, oracle.lattice_from_logits(logits, labels, -1), RTOL)
    oracle.assert_close(grads, oracle.logits_grad_from_lattice_grad(logits, labels, d_lattice,
                                                                    -1), RTOL)


@pytest.mark.parametrize("device", DEVICES)
def test_logits_to_lattice_out_of_range_padded_labels_give_zero(device):
    logits, labels, _, _ = _problem(13, (2, 3, 4, 5))
    logits = logits.astype(np.float32)
    labels[0, 2:] = -1
    labels[1, 3] = 5  # == V
    d_lattice = np.random.default_rng(14).normal(size=(2, 3, 5, 2))
    lattice, grads = run_logits_to_lattice(logits, labels, d_lattice, 0, device)
    assert np.all(lattice[0, :, 2:4, 1] == 0.0) and np.all(lattice[1, :, 3, 1] == 0.0)
    oracle.assert_close(lattice, oracle.lattice_from_logits(logits, labels, 0), RTOL)
    oracle.assert_close(grads, oracle.logits_grad_from_lattice_grad(logits, labels, d_lattice, 0),
                        RTOL)


@pytest.mark.parametrize("device", DEVICES)
def test_logits_to_lattice_int64_labels(device):
    logits, labels, _, _ = _problem(15, (2, 4, 3, 5))
    d_lattice = np.ones((2, 4, 4, 2))
    _assert_int64_run_matches(
        run_logits_to_lattice(logits, labels, d_lattice, 0, device),
        run_logits_to_lattice(logits, labels.astype(np.int64), d_lattice, 0, device))


# ------------------------------------------------------------------------------ rnnt_loss

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("blank", BLANKS)
@pytest.mark.parametrize("device", DEVICES)
def test_rnnt_loss_matches_oracle(shape, blank, device):
    blank = _blank(blank, shape[3])
    logits, labels, logit_lengths, label_lengths = _problem(16, shape, blank)
    logits = logits.astype(np.float32)
    upstream = _upstream(shape[0])
    costs, grads = oracle.rnnt_loss(logits, labels, logit_lengths, label_lengths, blank,
                                    upstream=upstream)
    got_costs, got_grads = run_rnnt_loss(tf_rnnt.rnnt_loss, logits, labels, logit_lengths,
                                         label_lengths, upstream, device, blank=blank)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, RTOL)
    pad = _padding_mask(logits.shape, logit_lengths, label_lengths)
    assert np.all(got_grads[pad] == 0.0), "gradient leaked into the padded region"


@pytest.mark.parametrize("device", DEVICES)
def test_rnnt_loss_larger_case(device):
    # ~1500 nodes x V=40: large enough for the CPU kernels to shard over threads.
    shape = (4, 30, 12, 40)
    logits, labels, logit_lengths, label_lengths = _problem(33, shape, blank=0)
    logits = logits.astype(np.float32)
    upstream = _upstream(shape[0])
    costs, grads = oracle.rnnt_loss(logits, labels, logit_lengths, label_lengths, 0,
                                    upstream=upstream)
    got_costs, got_grads = run_rnnt_loss(tf_rnnt.rnnt_loss, logits, labels, logit_lengths,
                                         label_lengths, upstream, device)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, RTOL)


@pytest.mark.parametrize("device", DEVICES)
def test_rnnt_loss_graph_modes(graph_mode, device):
    logits, labels, logit_lengths, label_lengths = _problem(17, (3, 6, 4, 7), blank=3)
    logits = logits.astype(np.float32)
    costs, grads = oracle.rnnt_loss(logits, labels, logit_lengths, label_lengths, 3)
    got_costs, got_grads = run_rnnt_loss(tf_rnnt.rnnt_loss, logits, labels, logit_lengths,
                                         label_lengths, None, device, graph_mode, blank=3)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, RTOL)


@pytest.mark.parametrize("device", DEVICES)
def test_rnnt_loss_every_blank_position(device):
    vocab = 4
    for blank in range(-vocab, vocab):
        logits, labels, logit_lengths, label_lengths = _problem(18, (2, 4, 3, vocab), blank)
        logits = logits.astype(np.float32)
        costs, grads = oracle.rnnt_loss(logits, labels, logit_lengths, label_lengths, blank)
        got_costs, got_grads = run_rnnt_loss(tf_rnnt.rnnt_loss, logits, labels, logit_lengths,
                                             label_lengths, None, device, blank=blank)
        oracle.assert_close(got_costs, costs, RTOL, err_msg=f"blank={blank}")
        oracle.assert_close(got_grads, grads, RTOL, err_msg=f"blank={blank}")


@pytest.mark.parametrize("device", DEVICES)
def test_rnnt_loss_edge_lengths(device):
    # label_length 0 beside longer ones, T = 1 beside longer ones, U > T.
    logits, labels, _, _ = _problem(19, (4, 3, 5, 6))
    logits = logits.astype(np.float32)
    logit_lengths = np.array([1, 3, 2, 1], np.int32)
    label_lengths = np.array([0, 0, 5, 3], np.int32)
    costs, grads = oracle.rnnt_loss(logits, labels, logit_lengths, label_lengths, 0)
    got_costs, got_grads = run_rnnt_loss(tf_rnnt.rnnt_loss, logits, labels, logit_lengths,
                                         label_lengths, None, device)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, RTOL)
    pad = _padding_mask(logits.shape, logit_lengths, label_lengths)
    assert np.all(got_grads[pad] == 0.0)


@pytest.mark.parametrize("pad_label", [0, -1, 6])
@pytest.mark.parametrize("device", DEVICES)
def test_rnnt_loss_any_padded_labels(pad_label, device):
    # Padded label entries (beyond label_length) may hold blank, -1 or V: they are never used.
    logits, labels, _, _ = _problem(20, (3, 4, 4, 6))
    logits = logits.astype(np.float32)
    logit_lengths = np.array([4, 3, 4], np.int32)
    label_lengths = np.array([2, 4, 0], np.int32)
    for b in range(3):
        labels[b, label_lengths[b]:] = pad_label
    costs, grads = oracle.rnnt_loss(logits, labels, logit_lengths, label_lengths, 0)
    got_costs, got_grads = run_rnnt_loss(tf_rnnt.rnnt_loss, logits, labels, logit_lengths,
                                         label_lengths, None, device)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, RTOL)


@pytest.mark.parametrize("fastemit_lambda,clamp", [(0.5, -1.0), (0.0, 0.05), (0.3, 0.05)])
@pytest.mark.parametrize("device", DEVICES)
def test_rnnt_loss_fastemit_and_clamp(fastemit_lambda, clamp, device):
    logits, labels, logit_lengths, label_lengths = _problem(21, (3, 6, 4, 5), blank=-1)
    logits = logits.astype(np.float32)
    upstream = np.array([2.0, 0.5, -3.0])
    costs, grads = oracle.rnnt_loss(logits, labels, logit_lengths, label_lengths, -1,
                                    fastemit_lambda, clamp, upstream)
    got_costs, got_grads = run_rnnt_loss(tf_rnnt.rnnt_loss, logits, labels, logit_lengths,
                                         label_lengths, upstream, device, blank=-1,
                                         fastemit_lambda=fastemit_lambda, clamp=clamp)
    oracle.assert_close(got_costs, costs, RTOL)
    oracle.assert_close(got_grads, grads, RTOL)


@pytest.mark.parametrize("device", DEVICES)
def test_rnnt_loss_int64_labels_and_lengths(device):
    logits, labels, logit_lengths, label_lengths = _problem(22, (3, 5, 3, 6))
    _assert_int64_run_matches(
        run_rnnt_loss(tf_rnnt.rnnt_loss, logits, labels, logit_lengths, label_lengths, None,
                      device),
        run_rnnt_loss(tf_rnnt.rnnt_loss, logits, labels.astype(np.int64),
                      logit_lengths.astype(np.int64), label_lengths.astype(np.int64), None,
                      device))


@pytest.mark.parametrize("device", DEVICES)
def test_rnnt_loss_leaves_its_input_intact(device):
    # The backward pass may write d logits into the logits' buffer only when TensorFlow hands
    # the buffer over; a logits tensor that is still used elsewhere must keep its values.
    logits_np, labels, logit_lengths, label_lengths = _problem(23, (2, 4, 3, 5))
    logits_np = logits_np.astype(np.float32)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            logits = x * 2.0
            costs = tf_rnnt.rnnt_loss(logits, labels, logit_lengths, label_lengths)
        return logits, tape.gradient(costs, x)

    with tf.device(device):
        x = tf.constant(logits_np)
        logits, grad = step(x)
    np.testing.assert_array_equal(x.numpy(), logits_np)
    np.testing.assert_array_equal(logits.numpy(), 2.0 * logits_np)
    _, expected = oracle.rnnt_loss(2.0 * logits_np, labels, logit_lengths, label_lengths)
    oracle.assert_close(grad.numpy(), 2.0 * expected, RTOL)


# ------------------------------------------------------------------------------ half precision

# Half-precision logits: both the op and the reference accumulate in float32 from the same
# rounded inputs, so costs keep the float32 tolerance (against the float64 oracle run on the
# rounded inputs). d logits come back in the input type: one rounding to half on top of a
# float32-accurate value, i.e. |error| <= u |g| (u = 2^-11 float16, 2^-8 bfloat16). We allow
# 2u relative plus u of the tensor's largest entry, and check that the reference run in the
# same precision satisfies the very same bound (so the bound is what the precision allows).
UNIT_ROUNDOFF = {tf.float16: 2.0 ** -11, tf.bfloat16: 2.0 ** -8}


def _assert_half_close(actual, expected, dtype, err_msg=""):
    u = UNIT_ROUNDOFF[dtype]
    scale = float(np.max(np.abs(expected)))
    np.testing.assert_allclose(actual, expected, rtol=2 * u, atol=u * scale, err_msg=err_msg)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_rnnt_loss_half_precision(dtype, device):
    logits, labels, logit_lengths, label_lengths = _problem(24, (3, 6, 4, 7), blank=-1)
    rounded = tf.cast(tf.cast(tf.constant(logits, tf.float32), dtype), tf.float64).numpy()
    costs, grads = oracle.rnnt_loss(rounded, labels, logit_lengths, label_lengths, -1)
    got_costs, got_grads = run_rnnt_loss(tf_rnnt.rnnt_loss, rounded, labels, logit_lengths,
                                         label_lengths, None, device, dtype=dtype, blank=-1)
    ref_costs, ref_grads = run_rnnt_loss(reference.rnnt_loss, rounded, labels, logit_lengths,
                                         label_lengths, dtype=dtype, blank=-1)
    oracle.assert_close(ref_costs, costs, RTOL)
    _assert_half_close(ref_grads, grads, dtype, "reference")
    oracle.assert_close(got_costs, costs, RTOL)
    _assert_half_close(got_grads, grads, dtype, "op")


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_logits_to_lattice_half_precision(dtype, device):
    logits, labels, _, _ = _problem(25, (2, 5, 3, 6))
    rounded = tf.cast(tf.cast(tf.constant(logits, tf.float32), dtype), tf.float64).numpy()
    d_lattice = np.random.default_rng(26).normal(size=(2, 5, 4, 2))
    lattice, grads = run_logits_to_lattice(rounded, labels, d_lattice, 0, device, dtype=dtype)
    oracle.assert_close(lattice, oracle.lattice_from_logits(rounded, labels, 0), RTOL)
    _assert_half_close(grads, oracle.logits_grad_from_lattice_grad(rounded, labels, d_lattice, 0),
                       dtype)


# ------------------------------------------------------------------------------ numerical gradients

# Central differences in float32 (the ops have no float64 kernel): step 1e-2 on O(1) inputs
# keeps rounding error (~eps * |cost| / step ~ 1e-4) and truncation error (~step^2) small.
NUMERIC_DELTA = 1e-2
NUMERIC_TOL = 2e-3


def _assert_jacobians_close(theoretical, numerical):
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=NUMERIC_TOL, atol=NUMERIC_TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_lattice_loss_numerical_gradient(device):
    lattice, logit_lengths, label_lengths = _random_lattice(27, (2, 3, 2, 4))
    with tf.device(device):
        theoretical, numerical = tf.test.compute_gradient(
            lambda x: tf_rnnt.lattice_loss(x, logit_lengths, label_lengths),
            [tf.constant(lattice, tf.float32)], delta=NUMERIC_DELTA)
    _assert_jacobians_close(theoretical, numerical)


@pytest.mark.parametrize("device", DEVICES)
def test_logits_to_lattice_numerical_gradient(device):
    logits, labels, _, _ = _problem(28, (1, 3, 2, 4), blank=-1)
    with tf.device(device):
        theoretical, numerical = tf.test.compute_gradient(
            lambda x: tf_rnnt.logits_to_lattice(x, labels, blank=-1),
            [tf.constant(logits, tf.float32)], delta=NUMERIC_DELTA)
    _assert_jacobians_close(theoretical, numerical)


@pytest.mark.parametrize("device", DEVICES)
def test_rnnt_loss_numerical_gradient(device):
    logits, labels, logit_lengths, label_lengths = _problem(29, (2, 3, 2, 4), blank=2)
    with tf.device(device):
        theoretical, numerical = tf.test.compute_gradient(
            lambda x: tf_rnnt.rnnt_loss(x, labels, logit_lengths, label_lengths, blank=2),
            [tf.constant(logits, tf.float32)], delta=NUMERIC_DELTA)
    _assert_jacobians_close(theoretical, numerical)


# ------------------------------------------------------------------------------ CPU vs GPU

@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("blank", BLANKS)
def test_cpu_gpu_parity(blank):
    shape = (4, 12, 6, 9)
    blank = _blank(blank, shape[3])
    logits, labels, logit_lengths, label_lengths = _problem(31, shape, blank)
    logits = logits.astype(np.float32)
    upstream = _upstream(shape[0])
    results = {}
    for device in ("/CPU:0", "/GPU:0"):
        costs, grads = run_rnnt_loss(tf_rnnt.rnnt_loss, logits, labels, logit_lengths,
                                     label_lengths, upstream, device, blank=blank,
                                     fastemit_lambda=0.1, clamp=0.5)
        d_lattice = np.random.default_rng(32).normal(size=shape[:2] + (shape[2] + 1, 2))
        lattice, lattice_grads = run_logits_to_lattice(logits, labels, d_lattice, blank, device)
        loss_costs, loss_grads = run_lattice_loss(lattice, logit_lengths, label_lengths, upstream,
                                                  device)
        results[device] = (costs, grads, lattice, lattice_grads, loss_costs, loss_grads)
    for cpu, gpu in zip(results["/CPU:0"], results["/GPU:0"]):
        oracle.assert_close(gpu, cpu, RTOL)
