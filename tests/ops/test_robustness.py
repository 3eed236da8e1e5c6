"""Robustness of every op: the empty batch, non-finite input, numerical extremes,
determinism, concurrency and out-of-memory behaviour (bad input: test_bad_inputs.py).

What the op suites (test_rnnt_ops.py, test_joint_lattice.py, test_samplewise.py) already cover
is not repeated here: this file adds the empty batch, NaN/inf in one sample, -inf logits
(masked vocabulary entries), long lattices, logits of magnitude 1e4 in every dtype, peaked and
flat distributions, determinism of rnnt_loss/lattice_loss/samplewise and of the default tiling,
calls from several threads at once, and what happens when the joint's workspace cannot be
allocated. Results are compared with the float64 NumPy oracle (tests/oracle.py) or, for flat
distributions, with the closed form.

Non-finite input, documented behaviour (asserted below):
- rnnt_loss / lattice_loss: a sample whose valid nodes hold NaN or +inf logits (or lattice
  entries) gets a non-finite cost and an all-zero gradient; every other sample's cost and
  gradient are exactly what they are without the bad sample. Garbage (NaN, inf) in the padding
  beyond a sample's lengths changes nothing.
- A sample with no alignment of non-zero probability (-inf entries cutting every path) costs
  +inf with a zero gradient; -inf entries that leave some path open are ordinary input.
- flash_rnnt_loss / joint_lattice / samplewise_rnnt_loss: NaN in one sample's valid encoder
  frames gives that sample a NaN cost; the other samples' costs and their encoder/predictor
  gradients are unaffected. The kernel and bias gradients are sums over the batch and are not
  asserted: they are NaN in every implementation that multiplies NaN joint values by a zero
  gradient (tf.matmul included).
"""

import json
import math
import os
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import oracle
import pytest
import tensorflow as tf
from rnnt_testing import DEVICES, REPO_ROOT, TESTS_DIR, requires_gpu

import tf_rnnt

RTOL = 1e-5
U32 = 2.0 ** -24
UNIT_ROUNDOFF = {tf.float32: U32, tf.float16: 2.0 ** -11, tf.bfloat16: 2.0 ** -8}
ALL_DTYPES = [pytest.param(tf.float32, id="float32"), pytest.param(tf.float16, id="float16"),
              pytest.param(tf.bfloat16, id="bfloat16")]
GRAD_NAMES = ("encoder", "predictor", "kernel", "bias")


# ------------------------------------------------------------------------------ helpers

def _rnnt_problem(seed, batch, max_t, max_u, vocab, blank=0, scale=1.0, dtype=tf.float32):
    """logits (float64 holding values exactly representable in `dtype`), labels, lengths."""
    rng = np.random.default_rng(seed)
    logits, labels, logit_lengths, label_lengths = oracle.random_problem(
        rng, batch, max_t, max_u, vocab, blank=blank)
    return _round(scale * logits, dtype), labels, logit_lengths, label_lengths


def _joint_problem(seed, batch, max_t, max_u, hidden, vocab, blank=0, dtype=tf.float32):
    rng = np.random.default_rng(seed)
    encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths = \
        oracle.random_joint_problem(rng, batch, max_t, max_u, hidden, vocab, blank=blank)
    params = [_round(x, dtype) for x in (encoder, predictor, kernel, bias)]
    return params, labels, logit_lengths, label_lengths


def _round(x, dtype):
    return tf.cast(tf.cast(tf.constant(np.asarray(x), tf.float64), dtype), tf.float64).numpy()


def _with_gradients(fn, params, upstream=None):
    """(fn(*params), d sum(upstream * fn) / d params) eagerly; outputs as float64 NumPy."""
    with tf.GradientTape() as tape:
        tape.watch(params)
        out = fn(*params)
        total = tf.reduce_sum(out if upstream is None else out * upstream)
    grads = tape.gradient(total, params)
    return tf.cast(out, tf.float64).numpy(), [tf.cast(g, tf.float64).numpy() for g in grads]


def run_rnnt(logits, labels, logit_lengths, label_lengths, device="/CPU:0", dtype=tf.float32,
             upstream=None, loss_fn=None, **options):
    """Costs and d (sum upstream * costs) / d logits of rnnt_loss (or loss_fn)."""
    loss_fn = loss_fn or tf_rnnt.rnnt_loss
    with tf.device(device):
        x = tf.cast(tf.constant(logits, tf.float64), dtype)
        up = None if upstream is None else tf.constant(upstream, tf.float32)
        costs, (grads,) = _with_gradients(
            lambda x: loss_fn(x, labels, logit_lengths, label_lengths, **options), [x], up)
    return costs, grads


def run_joint_loss(loss_fn, params, labels, logit_lengths, label_lengths, device="/CPU:0",
                   dtype=tf.float32, upstream=None, **options):
    """Costs and the four gradients of sum(upstream * loss_fn(...))."""
    with tf.device(device):
        tensors = [tf.cast(tf.constant(x, tf.float64), dtype) for x in params]
        up = None if upstream is None else tf.constant(upstream, tf.float32)
        return _with_gradients(
            lambda *p: loss_fn(*p, labels, logit_lengths, label_lengths, **options), tensors, up)


def _flash(mode, **extra):
    def loss(*args, **options):
        return tf_rnnt.flash_rnnt_loss(*args, mode=mode, **extra, **options)
    return loss


def _samplewise(*args, **options):
    return tf_rnnt.samplewise_rnnt_loss(*args, parallel_iterations=2, **options)


JOINT_LOSSES = [
    pytest.param(_flash("tiled", tile_size=5), id="flash_tiled"),
    pytest.param(_flash("untiled"), id="flash_untiled"),
    pytest.param(_samplewise, id="samplewise"),
]


def _assert_names(error, names, value=None):
    message = str(error)
    assert any(name in message for name in names), f"error names none of {names}: {message}"
    if value is not None:
        assert value in message, f"error does not show the offending value {value}: {message}"


def _dynamic(fn, args):
    """fn wrapped in a tf.function whose input_signature leaves every dimension unknown."""
    specs = [tf.TensorSpec([None] * len(a.shape), a.dtype) for a in args]
    return tf.function(fn, input_signature=specs)


# ------------------------------------------------------------------------------ empty batch

_B0_T, _B0_U, _B0_H, _B0_V = 4, 2, 3, 5


def _empty_case(name):
    """(function of the float inputs, float inputs, expected output shape)."""
    labels = tf.zeros([0, _B0_U], tf.int32)
    lengths = tf.zeros([0], tf.int32)
    lattice_shape = [0, _B0_T, _B0_U + 1, 2]
    if name == "lattice_loss":
        return (lambda lat: tf_rnnt.lattice_loss(lat, lengths, lengths),
                [tf.zeros(lattice_shape)], [0])
    if name in ("logits_to_lattice", "rnnt_loss"):
        logits = [tf.zeros([0, _B0_T, _B0_U + 1, _B0_V])]
        if name == "logits_to_lattice":
            return lambda x: tf_rnnt.logits_to_lattice(x, labels), logits, lattice_shape
        return lambda x: tf_rnnt.rnnt_loss(x, labels, lengths, lengths), logits, [0]
    params = [tf.zeros([0, _B0_T, _B0_H]), tf.zeros([0, _B0_U + 1, _B0_H]),
              tf.ones([_B0_H, _B0_V]), tf.zeros([_B0_V])]
    fn_name, mode = name.rsplit("_", 1)
    fn = getattr(tf_rnnt, fn_name)
    return (lambda *p: fn(*p, labels, lengths, lengths, mode=mode), params,
            lattice_shape if fn_name == "joint_lattice" else [0])


@pytest.mark.parametrize("graph_mode", ["eager", "function_dynamic_shapes"])
@pytest.mark.parametrize("name", ["lattice_loss", "logits_to_lattice", "rnnt_loss",
                                  "joint_lattice_tiled", "joint_lattice_untiled",
                                  "flash_rnnt_loss_tiled", "flash_rnnt_loss_untiled"])
@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(name, graph_mode, device):
    # B = 0 is a valid batch: an empty result, and gradients of the inputs' shapes that are
    # zero (the kernel and bias gradients are not empty: they must be exact zeros).
    fn, inputs, out_shape = _empty_case(name)

    def step(*inputs):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            out = fn(*inputs)
            total = tf.reduce_sum(out)
        return out, tape.gradient(total, list(inputs))

    with tf.device(device):
        if graph_mode != "eager":
            step = _dynamic(step, inputs)
        out, grads = step(*inputs)
    assert out.dtype == tf.float32
    assert out.shape == out_shape
    for x, g in zip(inputs, grads):
        assert g is not None and g.shape == x.shape and g.dtype == x.dtype
        assert not np.any(g.numpy()), "gradient of an empty batch must be zero"


# ------------------------------------------------------------------------------ non-finite input

NON_FINITE = [pytest.param(np.nan, id="nan"), pytest.param(np.inf, id="plus_inf")]


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("loss", ["rnnt_loss", "lattice_loss_of_logits_to_lattice"])
@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_logits_stay_in_their_sample(value, loss, device):
    logits, labels, logit_lengths, label_lengths = _rnnt_problem(41, 3, 5, 3, 6)
    logits_bad = logits.copy()
    # Node (0, 0) of sample 1, which every alignment passes through, token 2 (not blank): NaN
    # poisons the node's log-softmax; +inf takes all its probability, leaving blank and the
    # label none (no alignment left, or inf - inf = NaN if token 2 is the label).
    logits_bad[1, 0, 0, 2] = value
    loss_fn = tf_rnnt.rnnt_loss if loss == "rnnt_loss" else (
        lambda x, y, tl, ul: tf_rnnt.lattice_loss(tf_rnnt.logits_to_lattice(x, y), tl, ul))
    upstream = np.array([1.0, 1.0, -0.5])
    costs, grads = run_rnnt(logits_bad, labels, logit_lengths, label_lengths, device,
                            upstream=upstream, loss_fn=loss_fn)
    clean_costs, clean_grads = oracle.rnnt_loss(logits, labels, logit_lengths, label_lengths,
                                                upstream=upstream)
    assert not np.isfinite(costs[1]), "the bad sample's cost must show it"
    good = [0, 2]
    oracle.assert_close(costs[good], clean_costs[good], RTOL)
    oracle.assert_close(grads[good], clean_grads[good], RTOL)
    # The bad sample: a zero gradient (never NaN), so a training step can go on.
    assert np.all(grads[1] == 0.0), "the bad sample's gradient must be zero"


@pytest.mark.parametrize("value", NON_FINITE + [pytest.param(-np.inf, id="minus_inf")])
@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_padding_changes_nothing(value, device):
    # Padded frames and label positions may hold anything, NaN and inf included.
    logits, labels, _, _ = _rnnt_problem(42, 3, 6, 4, 5)
    logit_lengths = np.array([6, 3, 4], np.int32)
    label_lengths = np.array([2, 4, 0], np.int32)
    pad = ~oracle.valid_node_mask(6, 5, logit_lengths, label_lengths)
    dirty = np.where(pad[..., None], value, logits)
    costs, grads = run_rnnt(dirty, labels, logit_lengths, label_lengths, device)
    expected_costs, expected_grads = oracle.rnnt_loss(logits, labels, logit_lengths,
                                                      label_lengths)
    oracle.assert_close(costs, expected_costs, RTOL)
    oracle.assert_close(grads, expected_grads, RTOL)  # exact zeros in the padding included

    params, labels, _, _ = _joint_problem(43, 3, 6, 4, 3, 5)
    encoder, predictor = params[0].copy(), params[1].copy()
    for b in range(3):
        encoder[b, logit_lengths[b]:] = value
        predictor[b, label_lengths[b] + 1:] = value
    expected = oracle.flash_rnnt_loss(*params, labels, logit_lengths, label_lengths)
    for mode in ("tiled", "untiled"):
        costs, grads = run_joint_loss(_flash(mode), [encoder, predictor] + params[2:], labels,
                                      logit_lengths, label_lengths, device)
        oracle.assert_close(costs, expected[0], RTOL, err_msg=mode)
        for name, g, e in zip(GRAD_NAMES, grads, expected[1:]):
            oracle.assert_close(g, e, RTOL, err_msg=f"{mode} d {name}")


@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_lattice_entries(device):
    lattice = oracle.lattice_from_logits(*_rnnt_problem(44, 4, 5, 3, 6)[:2]).astype(np.float32)
    logit_lengths = np.array([5, 5, 4, 3], np.int32)
    label_lengths = np.array([3, 2, 3, 1], np.int32)
    # Sample 0: NaN at a valid node. Sample 1: -inf blanks in the last frame's first columns
    # (forbidden transitions that leave a path open). Sample 2: every final-frame blank -inf
    # but the last one, and the last label emission forbidden everywhere: no path at all.
    lattice[0, 2, 1, 0] = np.nan
    lattice[1, 4, :2, 0] = -np.inf
    lattice[2, :, 2, 1] = -np.inf
    upstream = np.array([1.0, 2.0, 1.0, -1.0])
    with tf.device(device):
        x = tf.constant(lattice)
        costs, (grads,) = _with_gradients(
            lambda x: tf_rnnt.lattice_loss(x, logit_lengths, label_lengths), [x],
            tf.constant(upstream, tf.float32))
    assert np.isnan(costs[0]) and np.all(grads[0] == 0.0)
    assert costs[2] == np.inf and np.all(grads[2] == 0.0)
    ok = [1, 3]
    expected_costs, expected_grads = oracle.lattice_loss(lattice[ok], logit_lengths[ok],
                                                         label_lengths[ok], upstream=upstream[ok])
    assert np.all(np.isfinite(expected_costs))
    oracle.assert_close(costs[ok], expected_costs, RTOL)
    oracle.assert_close(grads[ok], expected_grads, RTOL)


@pytest.mark.parametrize("where", ["encoder", "predictor"])
@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("loss_fn", JOINT_LOSSES)
@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_joint_input_stays_in_its_sample(loss_fn, value, where, device):
    params, labels, logit_lengths, label_lengths = _joint_problem(45, 3, 5, 3, 4, 6)
    logit_lengths[:] = [5, 4, 5]
    label_lengths[:] = [3, 2, 1]
    bad = [x.copy() for x in params]
    bad[0 if where == "encoder" else 1][1, 1, 2] = value  # a valid frame / step of sample 1
    # identity: +inf reaches the logits (tanh would squash it to 1).
    costs, grads = run_joint_loss(loss_fn, bad, labels, logit_lengths, label_lengths, device,
                                  activation="identity")
    expected = oracle.flash_rnnt_loss(*params, labels, logit_lengths, label_lengths,
                                      activation="identity")
    assert not np.isfinite(costs[1])
    good = [0, 2]
    oracle.assert_close(costs[good], expected[0][good], RTOL)
    good_expected = oracle.flash_rnnt_loss(*[params[0][good], params[1][good]] + params[2:],
                                           labels[good], logit_lengths[good],
                                           label_lengths[good], activation="identity")
    for name, g, e in zip(GRAD_NAMES[:2], grads[:2], good_expected[1:3]):
        oracle.assert_close(g[good], e, RTOL, err_msg=f"d {name} of the good samples")


@pytest.mark.parametrize("masked", ["first", "middle", "last"])
@pytest.mark.parametrize("device", DEVICES)
def test_minus_inf_logit_masks_a_vocabulary_entry(masked, device):
    # A logit of -inf (a vocabulary entry masked out, or a float16 logit that overflowed
    # downwards) has probability 0; it is neither blank nor a label here, so every cost and
    # gradient stays finite and equal to the oracle's, which treats it exactly.
    vocab = 6
    index = {"first": 0, "middle": 3, "last": vocab - 1}[masked]
    blank = vocab - 1 if masked == "first" else 0
    logits, labels, logit_lengths, label_lengths = _rnnt_problem(46, 3, 5, 3, vocab, blank)
    labels[labels == index] = 1 if index != 1 else 2
    logits[..., index] = -np.inf
    expected_costs, expected_grads = oracle.rnnt_loss(logits, labels, logit_lengths,
                                                      label_lengths, blank)
    costs, grads = run_rnnt(logits, labels, logit_lengths, label_lengths, device, blank=blank)
    assert np.all(np.isfinite(costs)) and np.all(np.isfinite(grads)), (costs, grads)
    oracle.assert_close(costs, expected_costs, RTOL)
    oracle.assert_close(grads, expected_grads, RTOL)


@pytest.mark.parametrize("masked", ["first", "middle", "last"])
@pytest.mark.parametrize("loss_fn", JOINT_LOSSES)
@pytest.mark.parametrize("device", DEVICES)
def test_minus_inf_bias_masks_a_vocabulary_entry(loss_fn, masked, device):
    vocab = 6
    index = {"first": 0, "middle": 3, "last": vocab - 1}[masked]
    blank = vocab - 1 if masked == "first" else 0
    params, labels, logit_lengths, label_lengths = _joint_problem(47, 3, 5, 3, 4, vocab, blank)
    labels[labels == index] = 1 if index != 1 else 2
    params[3] = params[3].copy()
    params[3][index] = -np.inf
    expected = oracle.flash_rnnt_loss(*params, labels, logit_lengths, label_lengths, blank)
    costs, grads = run_joint_loss(loss_fn, params, labels, logit_lengths, label_lengths, device,
                                  blank=blank)
    assert np.all(np.isfinite(costs)), costs
    oracle.assert_close(costs, expected[0], RTOL)
    for name, g, e in zip(GRAD_NAMES, grads, expected[1:]):
        assert np.all(np.isfinite(g)), name
        oracle.assert_close(g, e, RTOL, err_msg=f"d {name}")


# ------------------------------------------------------------------------------ numerical extremes

def _long_grad_tolerance(costs, logit_lengths, label_lengths):
    """Relative (to the tensor's largest entry) error allowed for long-lattice gradients.

    The gradients are exp(alpha + beta - log P): float32 log-space values of magnitude up to
    the cost, each of the T + U recursion steps adding a rounding of u32 |cost|; we allow
    4 sqrt(T + U) u32 max(cost) (four standard deviations of a random walk of roundings),
    plus the usual RTOL.
    """
    steps = float(np.max(np.asarray(logit_lengths) + np.asarray(label_lengths)))
    return RTOL + 4.0 * math.sqrt(steps) * U32 * float(np.max(np.abs(costs)))


LONG_SHAPES = [pytest.param((2, 400, 100, 5), id="T400_U100"),
               pytest.param((2, 3, 60, 5), id="U60_gt_T3")]


@pytest.mark.parametrize("shape", LONG_SHAPES)
@pytest.mark.parametrize("device", DEVICES)
def test_long_lattice_rnnt_loss(shape, device):
    logits, labels, logit_lengths, label_lengths = _rnnt_problem(48, *shape)
    logit_lengths[:] = [shape[1], max(1, shape[1] - 37)]
    label_lengths[:] = [shape[2], shape[2] - 13]
    costs, grads = run_rnnt(logits, labels, logit_lengths, label_lengths, device)
    expected_costs, expected_grads = oracle.rnnt_loss(logits, labels, logit_lengths,
                                                      label_lengths)
    assert np.all(np.isfinite(costs)) and np.all(np.isfinite(grads))
    oracle.assert_close(costs, expected_costs, RTOL)
    oracle.assert_close(grads, expected_grads,
                        _long_grad_tolerance(expected_costs, logit_lengths, label_lengths))


@pytest.mark.parametrize("loss_fn", JOINT_LOSSES)
@pytest.mark.parametrize("shape", LONG_SHAPES)
@pytest.mark.parametrize("device", DEVICES)
def test_long_lattice_joint_losses(loss_fn, shape, device):
    batch, max_t, max_u, vocab = shape
    params, labels, logit_lengths, label_lengths = _joint_problem(49, batch, max_t, max_u, 8,
                                                                  vocab)
    logit_lengths[:] = [max_t, max(1, max_t - 37)]
    label_lengths[:] = [max_u, max_u - 13]
    costs, grads = run_joint_loss(loss_fn, params, labels, logit_lengths, label_lengths, device)
    expected = oracle.flash_rnnt_loss(*params, labels, logit_lengths, label_lengths)
    assert np.all(np.isfinite(costs))
    oracle.assert_close(costs, expected[0], RTOL)
    tolerance = _long_grad_tolerance(expected[0], logit_lengths, label_lengths)
    for name, g, e in zip(GRAD_NAMES, grads, expected[1:]):
        assert np.all(np.isfinite(g)), name
        oracle.assert_close(g, e, tolerance, err_msg=f"d {name}")


def _half_rounding_bound(expected, dtype):
    """One rounding of a float32-accurate result into `dtype` (2u relative + u of the max)."""
    if dtype == tf.float32:
        return 0.0
    u = UNIT_ROUNDOFF[dtype]
    return 2 * u * np.abs(expected) + u * float(np.max(np.abs(expected)))


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_rnnt_loss_logits_of_magnitude_1e4(dtype, device):
    # |logits| up to 1e4 (float16 reaches 65504): the log-sum-exp must shift by the maximum.
    # Costs are O(1e5); the op reduces in float32 from the rounded inputs, so log-space values
    # carry an absolute error of about u32 * cost, which is the gradients' relative error.
    logits, labels, logit_lengths, label_lengths = _rnnt_problem(50, 3, 6, 3, 7, blank=-1)
    logits = _round(np.clip(1e4 * logits / 2.0, -1e4, 1e4), dtype)
    assert np.max(np.abs(logits)) > 9e3
    costs, grads = run_rnnt(logits, labels, logit_lengths, label_lengths, device, dtype,
                            blank=-1)
    expected_costs, expected_grads = oracle.rnnt_loss(logits, labels, logit_lengths,
                                                      label_lengths, -1)
    assert np.all(np.isfinite(costs)) and np.all(np.isfinite(grads))
    assert np.min(expected_costs) > 1e3
    oracle.assert_close(costs, expected_costs, RTOL)
    scale = float(np.max(np.abs(expected_grads)))
    bound = (RTOL + 4 * U32 * float(np.max(expected_costs))) * (np.abs(expected_grads) + scale)
    np.testing.assert_array_less(np.abs(grads - expected_grads),
                                 bound + _half_rounding_bound(expected_grads, dtype) + 1e-30)


@pytest.mark.parametrize("mode", ["tiled", "untiled"])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_flash_logits_of_magnitude_1e4(dtype, mode, device):
    # A kernel that drives the logits to about 1e4: everything finite, costs close. In half
    # precision the joint values are rounded to the input dtype before the output layer (as on
    # the GPU), which moves logits of 1e4 by up to u * 1e4 (5 in float16, 40 in bfloat16): the
    # cost of each of the T + U steps moves by twice that at most. The gradient's dominant
    # alignment can change under such a shift, so for half inputs only finiteness and the
    # bound |d logits| <= 2 per node (|d cost / d lattice| <= 1 per channel) are checked.
    params, labels, logit_lengths, label_lengths = _joint_problem(51, 3, 6, 3, 16, 9)
    max_logit = np.max(np.abs(oracle.joint_logits(*params)))
    params[2] = _round(params[2] * (1e4 / max_logit), dtype)
    params[3] = _round(params[3] * 100.0, dtype)
    params = [_round(x, dtype) for x in params]
    logits = oracle.joint_logits(*params)
    assert 5e3 < np.max(np.abs(logits)) < 2e4
    costs, grads = run_joint_loss(_flash(mode), params, labels, logit_lengths, label_lengths,
                                  device, dtype)
    expected = oracle.flash_rnnt_loss(*params, labels, logit_lengths, label_lengths)
    assert np.all(np.isfinite(costs)), costs
    for name, g in zip(GRAD_NAMES, grads):
        assert np.all(np.isfinite(g)), name
    steps = logit_lengths + label_lengths
    u = UNIT_ROUNDOFF[dtype]
    np.testing.assert_array_less(np.abs(costs - expected[0]),
                                 RTOL * expected[0] + 4 * u * np.max(np.abs(logits)) * steps)
    if dtype == tf.float32:
        # float32 joint values: logits off by ~u32 * 1e4, log-space values by u32 * cost.
        tolerance = RTOL + 4 * U32 * float(np.max(expected[0]))
        for name, g, e in zip(GRAD_NAMES, grads, expected[1:]):
            oracle.assert_close(g, e, tolerance, err_msg=f"d {name}")
    else:
        # d bias = sum over nodes of d logits, each |d logits| <= |g_blank| + |g_label| <= 2.
        nodes = float(np.sum(logit_lengths * (label_lengths + 1)))
        assert np.max(np.abs(grads[3])) <= 2 * nodes * (1 + u)


def _flat_cost(num_frames, num_labels, vocab):
    """-log P(y|x) when every token has probability 1/V at every node: each of the
    C(T+U-1, U) alignments (the final blank is fixed) has probability V^-(T+U)."""
    return (num_frames + num_labels) * math.log(vocab) - math.log(
        math.comb(num_frames + num_labels - 1, num_labels))


@pytest.mark.parametrize("level", [0.0, 1e3])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_flat_distribution_matches_closed_form(level, dtype, device):
    batch, max_t, max_u, vocab = 3, 30, 12, 7
    _, labels, logit_lengths, label_lengths = _rnnt_problem(52, batch, max_t, max_u, vocab)
    logits = np.full((batch, max_t, max_u + 1, vocab), level)
    costs, grads = run_rnnt(logits, labels, logit_lengths, label_lengths, device, dtype)
    closed = [_flat_cost(t, u, vocab) for t, u in zip(logit_lengths, label_lengths)]
    oracle.assert_close(costs, closed, RTOL)
    _, expected_grads = oracle.rnnt_loss(logits, labels, logit_lengths, label_lengths)
    scale = float(np.max(np.abs(expected_grads)))
    np.testing.assert_array_less(
        np.abs(grads - expected_grads),
        RTOL * (np.abs(expected_grads) + scale) + _half_rounding_bound(expected_grads, dtype)
        + 1e-30)
    # The joint with a zero kernel and a constant bias gives flat logits too.
    params, labels_j, _, _ = _joint_problem(53, batch, max_t, max_u, 4, vocab)
    params[2] = np.zeros_like(params[2])
    params[3] = np.full_like(params[3], level)
    for loss_fn in (_flash("tiled"), _flash("untiled"), _samplewise):
        costs, _ = run_joint_loss(loss_fn, params, labels_j, logit_lengths, label_lengths,
                                  device, dtype)
        oracle.assert_close(costs, closed, RTOL)


@pytest.mark.parametrize("target", ["alignment", "wrong_token"])
@pytest.mark.parametrize("device", DEVICES)
def test_peaked_distributions(target, device):
    # One-hot-like logits (+60 on one token per node): on the tokens of one alignment the cost
    # is ~0 and the gradient ~-1 along it; on a token the labels never use, the cost is
    # ~60 (T + U). Both must be finite and match the oracle (float32 log-softmax differences
    # of terms of size 60 are exact to ~u32 * 120, hence the absolute tolerance).
    batch, max_t, max_u, vocab = 2, 7, 4, 5
    _, labels, logit_lengths, label_lengths = _rnnt_problem(54, batch, max_t, max_u, vocab)
    labels[labels == vocab - 1] = 1
    logits = np.zeros((batch, max_t, max_u + 1, vocab))
    for b in range(batch):
        if target == "wrong_token":
            logits[b, :, :, vocab - 1] = 60.0
            continue
        # The alignment: emit all labels at frame 0, then blanks.
        for u in range(label_lengths[b]):
            logits[b, 0, u, labels[b, u]] = 60.0
        logits[b, :, label_lengths[b], 0] = 60.0
        logits[b, 1:, :label_lengths[b], 0] = 60.0
    costs, grads = run_rnnt(logits, labels, logit_lengths, label_lengths, device)
    expected_costs, expected_grads = oracle.rnnt_loss(logits, labels, logit_lengths,
                                                      label_lengths)
    assert np.all(np.isfinite(costs)) and np.all(np.isfinite(grads))
    steps = logit_lengths + label_lengths
    np.testing.assert_allclose(costs, expected_costs, rtol=RTOL, atol=4 * U32 * 125 * max(steps))
    np.testing.assert_allclose(grads, expected_grads, rtol=RTOL, atol=4 * U32 * 125 * max(steps))
    if target == "alignment":
        assert np.max(expected_costs) < 1e-20 * 1e6  # essentially certain
    else:
        assert np.min(expected_costs) > 50.0


# ------------------------------------------------------------------------------ determinism

_DETERMINISM_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    import tf_rnnt
    tf.config.experimental.enable_op_determinism()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    device = sys.argv[1]
    rng = np.random.default_rng(0)

    def grads(fn, params):
        with tf.GradientTape() as tape:
            tape.watch(params)
            out = fn(*params)
            total = tf.reduce_sum(out * tf.linspace(0.5, 1.5, tf.shape(out)[0]))
        return [out] + tape.gradient(total, params)

    with tf.device(device):
        # rnnt_loss and lattice_loss on ~5000 nodes x V = 40: the CPU kernels shard over threads.
        B, T, U, V = 4, 60, 20, 40
        logits = tf.constant(rng.normal(size=(B, T, U + 1, V)).astype(np.float32))
        labels = tf.constant(rng.integers(1, V, size=(B, U)).astype(np.int32))
        t_len = tf.constant([T, 51, 37, 60], tf.int32)
        u_len = tf.constant([U, 7, 15, 0], tf.int32)
        lattice = tf_rnnt.logits_to_lattice(logits, labels)
        # The joint at its default tiling, with the kernel and bias gradients summed over tiles.
        H, Vj = 32, 64
        params = [tf.constant(rng.normal(size=s).astype(np.float32) / 4)
                  for s in [(B, T, H), (B, U + 1, H), (H, Vj), (Vj,)]]
        labels_j = tf.constant(rng.integers(1, Vj, size=(B, U)).astype(np.int32))
        cases = {
            "rnnt_loss": lambda: grads(
                lambda x: tf_rnnt.rnnt_loss(x, labels, t_len, u_len, fastemit_lambda=0.1),
                [logits]),
            "lattice_loss": lambda: grads(
                lambda x: tf_rnnt.lattice_loss(x, t_len, u_len), [lattice]),
            "flash_default_tiling": lambda: grads(
                lambda *p: tf_rnnt.flash_rnnt_loss(*p, labels_j, t_len, u_len), params),
            "flash_small_budget": lambda: grads(
                lambda *p: tf_rnnt.flash_rnnt_loss(*p, labels_j, t_len, u_len,
                                                   memory_budget=20000), params),
            "samplewise": lambda: grads(
                lambda *p: tf_rnnt.samplewise_rnnt_loss(*p, labels_j, t_len, u_len,
                                                        parallel_iterations=4), params),
        }
    result = {}
    for name, run in cases.items():
        try:
            with tf.device(device):
                first = [x.numpy() for x in run()]
                second = [x.numpy() for x in run()]
        except Exception as error:  # an op may refuse, saying so clearly
            result[name] = {"error": type(error).__name__ + ": " + str(error)}
            continue
        result[name] = {"bitwise_equal": all(np.array_equal(a, b) for a, b in zip(first, second)),
                        "finite": all(bool(np.all(np.isfinite(a))) for a in first)}
    print("RESULT " + json.dumps(result))
""")


def _run_subprocess(script, *argv, timeout=300, env_extra=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env_extra or {}))
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (REPO_ROOT, TESTS_DIR, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True,
                          timeout=timeout, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, \
        f"subprocess failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_op_determinism(device):
    # test_joint_lattice.py covers flash_rnnt_loss with tile_size=7; this adds rnnt_loss,
    # lattice_loss, the default tiling, a memory budget and samplewise.
    result = _run_subprocess(_DETERMINISM_SCRIPT, device)
    assert set(result) == {"rnnt_loss", "lattice_loss", "flash_default_tiling",
                           "flash_small_budget", "samplewise"}
    for name, outcome in result.items():
        if "error" in outcome:
            assert "determinis" in outcome["error"].lower(), (name, outcome["error"])
        else:
            assert outcome["finite"], name
            assert outcome["bitwise_equal"], f"{name}: two runs differ under op determinism"


# ------------------------------------------------------------------------------ concurrency

def _thread_jobs(thread_index, device):
    """Five calls with shapes of their own: (name, function returning a list of arrays)."""
    seed = 60 + thread_index
    batch, max_t, max_u, vocab = 2 + thread_index % 2, 5 + 3 * thread_index, 2 + thread_index, \
        6 + thread_index
    logits, labels, logit_lengths, label_lengths = _rnnt_problem(seed, batch, max_t, max_u,
                                                                 vocab)
    params, labels_j, _, _ = _joint_problem(seed, batch, max_t, max_u, 4 + thread_index, vocab)
    problem = (labels, logit_lengths, label_lengths)

    def rnnt():
        costs, grads = run_rnnt(logits, *problem, device)
        return [costs, grads]

    def joint(loss_fn, **options):
        def run():
            costs, grads = run_joint_loss(loss_fn, params, labels_j, logit_lengths,
                                          label_lengths, device, **options)
            return [costs] + grads
        return run

    def lattice():
        with tf.device(device):
            return [tf_rnnt.joint_lattice(*[tf.constant(x, tf.float32) for x in params],
                                          labels_j, logit_lengths, label_lengths,
                                          tile_size=3).numpy()]

    jobs = [("rnnt_loss", rnnt), ("flash_tiled", joint(_flash("tiled", tile_size=4))),
            ("flash_untiled", joint(_flash("untiled"))), ("joint_lattice", lattice),
            ("samplewise", joint(_samplewise))]
    expected = {
        "rnnt_loss": oracle.rnnt_loss(logits, *problem)[:1],
        "flash": oracle.flash_rnnt_loss(*params, labels_j, logit_lengths, label_lengths)[:1],
    }
    return jobs, expected


@pytest.mark.parametrize("device", DEVICES)
def test_concurrent_calls_match_sequential_ones(device):
    # 4 threads x 5 calls (rnnt_loss, flash tiled/untiled, joint_lattice, samplewise), every
    # thread with shapes of its own, all at once; the ops keep no shared mutable state, so each
    # result is bitwise the sequential one (the ops are deterministic).
    threads = 4
    jobs = {i: _thread_jobs(i, device) for i in range(threads)}
    sequential = {(i, name): run() for i in range(threads) for name, run in jobs[i][0]}
    barrier = threading.Barrier(threads)

    def worker(i):
        barrier.wait()
        results = {}
        for repeat in range(2):
            for name, run in jobs[i][0]:
                results[(i, name, repeat)] = run()
        return results

    with ThreadPoolExecutor(threads) as pool:
        concurrent = {}
        for results in pool.map(worker, range(threads)):
            concurrent.update(results)
    for (i, name, repeat), got in concurrent.items():
        for a, b in zip(got, sequential[(i, name)]):
            np.testing.assert_array_equal(a, b, err_msg=f"thread {i} {name} call {repeat}")
    # And the sequential results are right.
    for i in range(threads):
        expected = jobs[i][1]
        oracle.assert_close(sequential[(i, "rnnt_loss")][0], expected["rnnt_loss"][0], RTOL)
        for name in ("flash_tiled", "flash_untiled", "samplewise"):
            oracle.assert_close(sequential[(i, name)][0], expected["flash"][0], RTOL)


@pytest.mark.parametrize("device", DEVICES)
def test_concurrent_calls_of_one_tf_function(device):
    # One traced function (unknown shapes) called from 4 threads with different shapes.
    @tf.function(input_signature=[tf.TensorSpec([None, None, None], tf.float32),
                                  tf.TensorSpec([None, None, None], tf.float32),
                                  tf.TensorSpec([None, None], tf.float32),
                                  tf.TensorSpec([None], tf.float32),
                                  tf.TensorSpec([None, None], tf.int32),
                                  tf.TensorSpec([None], tf.int32),
                                  tf.TensorSpec([None], tf.int32)])
    def step(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths):
        params = [encoder, predictor, kernel, bias]
        with tf.GradientTape() as tape:
            tape.watch(params)
            costs = tf_rnnt.flash_rnnt_loss(*params, labels, logit_lengths, label_lengths,
                                            tile_size=6)
            total = tf.reduce_sum(costs)
        return [costs] + tape.gradient(total, params)

    problems = [_joint_problem(70 + i, 2 + i % 2, 4 + 2 * i, 1 + i, 3 + i, 5 + i)
                for i in range(4)]

    def run(i):
        params, labels, logit_lengths, label_lengths = problems[i]
        with tf.device(device):
            out = step(*[tf.constant(x, tf.float32) for x in params], tf.constant(labels),
                       tf.constant(logit_lengths), tf.constant(label_lengths))
        return [x.numpy() for x in out]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, [i for _ in range(5) for i in range(4)]))
    for k, got in enumerate(results):
        params, labels, logit_lengths, label_lengths = problems[k % 4]
        expected = oracle.flash_rnnt_loss(*params, labels, logit_lengths, label_lengths)
        for name, g, e in zip(("costs",) + GRAD_NAMES, got, expected):
            oracle.assert_close(g, e, RTOL, err_msg=f"call {k} {name}")


# ------------------------------------------------------------------------------ out of memory

@pytest.mark.parametrize("mode", ["tiled", "untiled"])
@pytest.mark.parametrize("device", DEVICES)
def test_one_byte_memory_budget(mode, device):
    # A budget smaller than one node's workspace still works (one node per tile when tiled;
    # untiled mode has no tiles and ignores it).
    params, labels, logit_lengths, label_lengths = _joint_problem(80, 3, 5, 3, 6, 9, blank=-1)
    costs, grads = run_joint_loss(_flash(mode, memory_budget=1), params, labels, logit_lengths,
                                  label_lengths, device, blank=-1)
    expected = oracle.flash_rnnt_loss(*params, labels, logit_lengths, label_lengths, -1)
    oracle.assert_close(costs, expected[0], RTOL)
    for name, g, e in zip(GRAD_NAMES, grads, expected[1:]):
        oracle.assert_close(g, e, RTOL, err_msg=f"d {name}")


# The subprocess caps its address space (RLIMIT_AS) a little above what it uses after a warm-up
# call, so the joint's workspace allocation fails for real without touching the machine's
# memory. The cap is far from the process's own needs (error paths, thread arenas): the
# workspace that must fail is 512 MiB or more against 320 MiB or less of headroom.
_OOM_SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    import tensorflow as tf
    import oracle
    import tf_rnnt

    case, out_path = sys.argv[1], sys.argv[2]
    headroom_override = int(sys.argv[3]) if len(sys.argv) > 3 else None
    MiB = 2 ** 20

    def vm_size():
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024

    def problem(seed, B, T, U, H, V, scale=0.1):
        rng = np.random.default_rng(seed)
        return ([rng.normal(size=(B, T, H)).astype(np.float32),
                 rng.normal(size=(B, U + 1, H)).astype(np.float32),
                 (scale * rng.normal(size=(H, V))).astype(np.float32),
                 (scale * rng.normal(size=(V,))).astype(np.float32)],
                rng.integers(1, V, size=(B, U)).astype(np.int32),
                np.full(B, T, np.int32), np.full(B, U, np.int32))

    def run(p, **options):
        params, labels, t_len, u_len = p
        tensors = [tf.constant(x) for x in params]
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            costs = tf_rnnt.flash_rnnt_loss(*tensors, labels, t_len, u_len, **options)
            total = tf.reduce_sum(costs)
        return [costs.numpy()] + [g.numpy() for g in tape.gradient(total, tensors)]

    def small_problem_is_right():
        p = problem(1, 2, 5, 3, 4, 7, scale=1.0)
        got = run(p, tile_size=3)
        expected = oracle.flash_rnnt_loss(*p[0], *p[1:])
        return all(np.allclose(g, e, rtol=1e-4, atol=1e-5 * np.max(np.abs(e)))
                   for g, e in zip(got, expected))

    small = problem(1, 2, 5, 3, 4, 7, scale=1.0)
    for mode in ("tiled", "untiled"):  # warm-up: thread pools, kernels, allocators
        run(small, mode=mode)
    result = {"small_before": small_problem_is_right()}
    if case == "halve":
        # 4096 nodes x V = 32768: 512 MiB of workspace at tile 4096, 256 MiB at 2048.
        big, options, headroom = problem(2, 2, 64, 31, 8, 32768), dict(tile_size=4096), 320
    elif case == "untiled":
        # The saved logits alone: 1024 nodes x V = 262144 floats = 1 GiB.
        big, options, headroom = problem(3, 1, 32, 31, 8, 262144), dict(mode="untiled"), 256
    else:
        # 1024 nodes (the smallest tile the op shrinks to) x V = 262144: 1 GiB of workspace.
        big = problem(3, 1, 32, 31, 8, 262144)
        options = dict(tile_size=1024) if case == "tile_size" else dict(memory_budget=2 ** 40)
        headroom = 256
    headroom = headroom_override or headroom
    base = vm_size()
    resource.setrlimit(resource.RLIMIT_AS, (base + headroom * MiB, resource.RLIM_INFINITY))
    try:
        got = run(big, **options)
        result["outcome"] = "ok"
        np.savez(out_path, *got)
    except tf.errors.ResourceExhaustedError as error:
        result["outcome"] = "ResourceExhaustedError"
        result["message"] = str(error)
    except Exception as error:
        result["outcome"] = type(error).__name__
        result["message"] = str(error)
    result["small_under_limit"] = small_problem_is_right()
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    result["small_after"] = small_problem_is_right()
    print("RESULT " + json.dumps(result))
""")

requires_linux = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="needs Linux (RLIMIT_AS and /proc/self/status)")


def _chunked_flash_oracle(params, labels, logit_lengths, label_lengths):
    """oracle.flash_rnnt_loss one frame at a time (the full float64 logits would be 1 GiB)."""
    encoder, predictor, kernel, bias = [np.asarray(x, np.float64) for x in params]
    batch, max_t, _ = encoder.shape
    lattice = np.zeros((batch, max_t, predictor.shape[1], 2))
    for t in range(max_t):
        lattice[:, t:t + 1] = oracle.lattice_from_logits(
            oracle.joint_logits(encoder[:, t:t + 1], predictor, kernel, bias), labels)
    costs, d_lattice = oracle.lattice_loss(lattice, logit_lengths, label_lengths)
    grads = [np.zeros_like(encoder), np.zeros_like(predictor), np.zeros_like(kernel),
             np.zeros_like(bias)]
    for t in range(max_t):
        frame_lengths = (t < np.asarray(logit_lengths)).astype(np.int32)
        d_enc, d_pred, d_kernel, d_bias = oracle.joint_lattice_backward(
            encoder[:, t:t + 1], predictor, kernel, bias, labels, frame_lengths, label_lengths,
            d_lattice[:, t:t + 1])
        grads[0][:, t:t + 1] = d_enc
        grads[1] += d_pred
        grads[2] += d_kernel
        grads[3] += d_bias
    return [costs] + grads


# TensorFlow's default CPU allocator with oneDNN ("mklcpu") pools memory and, when an allocation
# fails, extends its pool by as much as the address space still allows; TF_ENABLE_ONEDNN_OPTS=0
# selects the plain allocator, which hands freed blocks back, so the cap below means what it
# says. MALLOC_ARENA_MAX keeps glibc from reserving 64 MiB of address space per thread.
_PLAIN_ALLOCATOR = {"TF_ENABLE_ONEDNN_OPTS": "0", "MALLOC_ARENA_MAX": "2"}
# These tests cap the CPU address space; a visible GPU would run the op there instead.
_CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


@requires_linux
@pytest.mark.slow
def test_tile_shrinks_when_the_workspace_cannot_be_allocated(tmp_path):
    # tile_size=4096 asks for 512 MiB; only 320 MiB of address space is left: the op halves
    # the tile until the workspace fits (256 MiB), and the result is still right.
    out = tmp_path / "halve.npz"
    result = _run_subprocess(_OOM_SCRIPT, "halve", str(out),
                             env_extra=dict(_PLAIN_ALLOCATOR, **_CPU_ONLY))
    assert result["outcome"] == "ok", result
    assert result["small_before"] and result["small_under_limit"] and result["small_after"]
    with np.load(out) as data:
        got = [data[f"arr_{i}"] for i in range(5)]
    rng = np.random.default_rng(2)
    B, T, U, H, V = 2, 64, 31, 8, 32768
    params = [rng.normal(size=(B, T, H)).astype(np.float32),
              rng.normal(size=(B, U + 1, H)).astype(np.float32),
              (0.1 * rng.normal(size=(H, V))).astype(np.float32),
              (0.1 * rng.normal(size=(V,))).astype(np.float32)]
    labels = rng.integers(1, V, size=(B, U)).astype(np.int32)
    expected = _chunked_flash_oracle(params, labels, np.full(B, T), np.full(B, U))
    for name, g, e in zip(("costs",) + GRAD_NAMES, got, expected):
        oracle.assert_close(g, e, 1e-4, err_msg=name)


@requires_linux
@pytest.mark.slow
def test_out_of_memory_with_the_default_allocator_never_crashes(tmp_path):
    # The same request (400 MiB left) with TensorFlow's default allocator, whose pool takes the
    # rest of the address space once the 512 MiB workspace fails: whatever the op then cannot
    # allocate, the result must be an answer or a ResourceExhaustedError, never an abort.
    result = _run_subprocess(_OOM_SCRIPT, "halve", str(tmp_path / "halve.npz"), "400",
                             env_extra={"MALLOC_ARENA_MAX": "2", **_CPU_ONLY})
    assert result["outcome"] in ("ok", "ResourceExhaustedError"), result
    assert result["small_after"], result


@requires_linux
@pytest.mark.slow
@pytest.mark.parametrize("case", ["tile_size", "memory_budget"])
def test_workspace_that_cannot_fit_raises_resource_exhausted(case, tmp_path):
    # 1 GiB at the smallest tile the op shrinks to (1024 nodes), 256 MiB available: a
    # ResourceExhaustedError that says which setting to change; the process stays usable.
    result = _run_subprocess(_OOM_SCRIPT, case, str(tmp_path / "unused.npz"),
                             env_extra={"MALLOC_ARENA_MAX": "2", **_CPU_ONLY})
    assert result["outcome"] == "ResourceExhaustedError", result
    _assert_names(result["message"], ["tile_size"])
    _assert_names(result["message"], ["memory_budget"])
    assert result["small_before"] and result["small_under_limit"] and result["small_after"], \
        result


@requires_linux
@pytest.mark.slow
def test_untiled_mode_out_of_memory_says_what_to_change(tmp_path):
    # Untiled mode keeps [N, V] float32 logits: 1 GiB here against 256 MiB available. The
    # error must point at the setting to change (mode="tiled" / tile_size / memory_budget), not
    # only report a failed allocation.
    result = _run_subprocess(_OOM_SCRIPT, "untiled", str(tmp_path / "unused.npz"),
                             env_extra={"MALLOC_ARENA_MAX": "2", **_CPU_ONLY})
    assert result["outcome"] == "ResourceExhaustedError", result
    assert result["small_before"] and result["small_under_limit"] and result["small_after"], \
        result
    _assert_names(result["message"], ["tiled", "tile_size", "memory_budget"])


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["tiled", "untiled"])
def test_gpu_workspace_that_cannot_fit_raises_resource_exhausted(mode):
    # GPU memory cannot be capped per process, so the request is absurd instead: 1024 nodes x
    # V = 48M floats is ~200 GB of workspace (tiled, at the smallest tile) or saved logits
    # (untiled), more than any GPU has. The process must stay usable afterwards.
    rng = np.random.default_rng(90)
    B, T, U, H, V = 1, 32, 31, 2, 48 * 2 ** 20
    with tf.device("/GPU:0"):
        params = [tf.constant(rng.normal(size=(B, T, H)), tf.float32),
                  tf.constant(rng.normal(size=(B, U + 1, H)), tf.float32),
                  tf.random.normal([H, V], stddev=0.01), tf.zeros([V])]
        labels = tf.constant(rng.integers(1, 1000, size=(B, U)), tf.int32)
        options = dict(mode=mode, tile_size=1024 if mode == "tiled" else None)
        with pytest.raises(tf.errors.ResourceExhaustedError) as info:
            tf_rnnt.flash_rnnt_loss(*params, labels, [T], [U], **options).numpy()
        del params
    _assert_names(info.value, ["tile_size", "memory_budget"])
    # Still usable: a normal call on the GPU is right.
    small, labels, logit_lengths, label_lengths = _joint_problem(91, 3, 6, 3, 8, 11)
    costs, grads = run_joint_loss(_flash("tiled"), small, labels, logit_lengths, label_lengths,
                                  "/GPU:0")
    expected = oracle.flash_rnnt_loss(*small, labels, logit_lengths, label_lengths)
    oracle.assert_close(costs, expected[0], RTOL)
    for name, g, e in zip(GRAD_NAMES, grads, expected[1:]):
        oracle.assert_close(g, e, RTOL, err_msg=f"d {name}")

