"""Costs at logits near the float32 limit (|x| ~ 1e38..3e38) against the float64 oracle.

One ulp of a float32 near 3e38 is about 2e31, so a log-softmax formed as `x - (max + log sum)`
drops `log sum` entirely and gives wrong finite costs (even negative ones). The ops must give
the oracle's cost, or a non-finite cost where float32 arithmetic overflows (the oracle's cost
is then itself beyond the float32 range), never a wrong finite cost.

The cases use values with few significant bits (multiples of 2^124) so that the sums the joint
forms (`z @ kernel + bias`) are exact in float32 as in float64: the op and the oracle then see
the same logits, and the remaining differences are the log-softmax's.
"""

import numpy as np
import oracle
import pytest
import tensorflow as tf
from rnnt_testing import DEVICES

import tf_rnnt

F32_MAX = float(np.finfo(np.float32).max)
P124 = 2.0 ** 124  # 2.1e37; 2^127 = 1.7e38, 2^128 would overflow


def _lengths(batch, max_t, max_u):
    logit_lengths = np.full([batch], max_t, np.int32)
    logit_lengths[-1] = max(1, max_t - 1)
    label_lengths = np.full([batch], max_u, np.int32)
    label_lengths[0] = max(0, max_u - 1)
    return logit_lengths, label_lengths


def _logit_cases():
    """[B, T, U+1, V] float32 logits near the limit, with ties at the maximum."""
    rng = np.random.default_rng(7)
    shape = [3, 4, 3, 5]
    yield "all_equal_3e38", np.full(shape, 3.0e38, np.float32)
    yield "all_equal_minus_3e38", np.full(shape, -3.0e38, np.float32)
    # Entries drawn from three levels: rows with one, or several tied, maxima.
    levels = np.array([1.0e38, 2.0e38, 3.0e38], np.float32)
    yield "levels_1e38_3e38", levels[rng.integers(0, 3, size=shape)]
    # Ties guaranteed on blank and every label column, the rest far below.
    x = np.full(shape, 1.0e38, np.float32)
    x[..., :3] = 3.0e38
    yield "blank_and_labels_tied", x


def _check_costs(costs, expected):
    """Finite costs match the oracle; non-finite ones only where the oracle's cost overflows."""
    costs = np.asarray(costs, np.float64)
    for b, (got, want) in enumerate(zip(costs, expected)):
        if np.isfinite(got):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3,
                                       err_msg=f"sample {b}: wrong finite cost")
        else:
            assert not np.isfinite(want) or abs(want) > 0.5 * F32_MAX, (
                f"sample {b}: cost {got} where the oracle gives {want} (within float32 range)")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [c[0] for c in _logit_cases()])
def test_rnnt_loss_and_logits_to_lattice(device, case):
    logits = dict(_logit_cases())[case]
    batch, max_t, max_u1, vocab = logits.shape
    rng = np.random.default_rng(11)
    labels = rng.integers(1, 3, size=[batch, max_u1 - 1]).astype(np.int32)
    logit_lengths, label_lengths = _lengths(batch, max_t, max_u1 - 1)
    expected_lattice = oracle.lattice_from_logits(logits, labels, blank=0)
    expected_costs, _ = oracle.lattice_loss(expected_lattice, logit_lengths, label_lengths)
    assert np.all(np.isfinite(expected_costs))
    with tf.device(device):
        costs = tf_rnnt.rnnt_loss(logits, labels, logit_lengths, label_lengths, blank=0)
        lattice = tf_rnnt.logits_to_lattice(logits, labels, blank=0)
    _check_costs(costs.numpy(), expected_costs)
    # Every lattice entry is a log-probability within float32 range here: compare them all.
    np.testing.assert_allclose(lattice.numpy(), expected_lattice, rtol=1e-5, atol=1e-4)


def _joint_case(bias_levels):
    """Joint inputs whose float32 logits are exact: z in {0, 1}, kernel and bias multiples of
    2^124 whose sums stay below FLT_MAX, and tied maxima."""
    rng = np.random.default_rng(5)
    batch, max_t, max_u, hidden, vocab = 2, 3, 2, 2, 4
    encoder = rng.integers(0, 2, size=[batch, max_t, hidden]).astype(np.float32)
    predictor = np.zeros([batch, max_u + 1, hidden], np.float32)
    # Columns 0 and 2, and 1 and 3, are equal: with equal biases their logits tie.
    kernel = (rng.integers(0, 2, size=[hidden, 2]) * 2 * P124).astype(np.float32)
    kernel = np.concatenate([kernel, kernel], axis=1)
    bias = (np.asarray(bias_levels, np.float64) * P124).astype(np.float32)
    labels = rng.integers(1, vocab, size=[batch, max_u]).astype(np.int32)
    logit_lengths, label_lengths = _lengths(batch, max_t, max_u)
    return encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths


JOINT_BIASES = {
    "bias_equal": [11, 11, 11, 11],  # 2.3e38, plus at most 4 * 2^124: below 2^128
    "bias_mixed": [10, 11, 4, 11],
    "bias_negative": [-11, -11, -10, -11],
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["tiled", "untiled"])
@pytest.mark.parametrize("case", list(JOINT_BIASES))
def test_flash_rnnt_loss(device, mode, case):
    enc, pred, kernel, bias, labels, t_len, u_len = _joint_case(JOINT_BIASES[case])
    logits64 = oracle.joint_logits(enc, pred, kernel, bias, activation="identity")
    assert np.abs(logits64).max() < F32_MAX
    assert np.array_equal(logits64.astype(np.float32).astype(np.float64), logits64)
    expected_costs = oracle.flash_rnnt_loss(enc, pred, kernel, bias, labels, t_len, u_len,
                                            activation="identity")[0]
    with tf.device(device):
        costs = tf_rnnt.flash_rnnt_loss(enc, pred, kernel, bias, labels, t_len, u_len,
                                        activation="identity", mode=mode, tile_size=4)
    _check_costs(costs.numpy(), expected_costs)
