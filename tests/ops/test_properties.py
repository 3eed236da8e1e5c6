"""Property-based tests (hypothesis): every implementation agrees with the oracle.

Random problems: B <= 3, T <= 8, U <= 5 (0 included), V in [2, 9], H <= 6, ragged lengths
(the padded maxima need not be attained), blank anywhere in [-V, V), padded label entries
holding garbage (-1, V, blank or a random token), logits of scale 0.1 to 4, every activation,
tiled and untiled modes with tile sizes from 1 to past the lattice or a memory budget from
1 byte, FastEmit and the gradient clamp, and per-sample upstream weights (0 and negative
included). Implementations: rnnt_loss, lattice_loss(logits_to_lattice(...)), lattice_loss on
arbitrary (unnormalized) lattices, joint_lattice, flash_rnnt_loss and samplewise_rnnt_loss.
The oracle is tests/oracle.py (float64 NumPy) run on exactly the op's inputs (half-precision
inputs are rounded first).

Tolerances. Random tiny problems reach the corners that fixed cases avoid: probabilities within
1e-8 of 1 (a log-probability or a gradient entry computed as a difference of O(1) terms),
tanh saturation, cancellation in the sums over the lattice. There a float result is accurate
relative to the magnitude of the terms it was computed from, not to its own value, so each
check is the suites' usual relative bound plus a rounding-error term (standard forward error
analysis: a computed sum is off by at most a few unit roundoffs times the sum of the absolute
values of its terms):
- float32 part, every test: RTOL = 1e-5 relative to each entry plus the tensor's largest entry
  (oracle.assert_close, the op suites' bound), plus C * u32 * S, where u32 = 2^-24, S is the
  entry's "absolute scale" (the same computation with every term replaced by its absolute
  value, from the oracle's float64 intermediates) and C = 4 + 2 L, with L = 2 Z + log V the
  size of a log-softmax difference and Z the largest |logit| (for the joint: the largest
  sum_h |hidden_h kernel_hv| + |bias_v|): an error of c ulp(L) in a lattice entry moves the
  probabilities by c L u32 relative, and the results carry a few more roundings.
  Costs: RTOL |cost| + 2 u32 (T_b + U_b) L, the T_b + U_b lattice entries of a path each
  off by about u32 L.
- rnnt_loss / lattice_loss with float16/bfloat16 inputs: the op reduces in float32 from the
  rounded inputs and rounds the gradient once into the input dtype: + 2u relative plus u of the
  tensor's largest entry (u = 2^-11 float16, 2^-8 bfloat16), as in tests/ops/test_rnnt_ops.py,
  plus the smallest subnormal (float16 gradients below 6e-5 lose relative precision).
- joint ops (flash, samplewise) with float16/bfloat16 inputs: the joint values and d logits are
  rounded to the input dtype on the way (on the GPU they feed half-precision GEMMs; the CPU
  rounds at the same points), so the same error model applies with u in place of u32:
  gradients within (4 + 2 L) u S, costs within 2 u (T_b + U_b) L (plus the float32 part).
  Each rounded value may also be off by the dtype's smallest subnormal (float16 ends at 6e-8,
  where a d logit of 1.4e-7 rounds to 1.8e-7): one more term, that subnormal times the same
  sums with |d logits| + 1 and |hidden| + 1.
  Measured over random examples (1500 per implementation, 300 for samplewise), the flash op
  uses at most 0.2 of these bounds, samplewise 0.11, and tf_rnnt.reference run in the same
  precision 0.3: the bounds are what the precision allows, far below the O(1) error of a
  wrong result.

CI runs a fixed set of examples (derandomized). TF_RNNT_PROPERTY_EXAMPLES=N explores N fresh
random examples per test instead.
"""

import os

import numpy as np
import oracle
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rnnt_testing import DEVICES, REPO_ROOT, TESTS_DIR, pythonpath

import tf_rnnt

RTOL = 1e-5
U32 = 2.0 ** -24
UNIT_ROUNDOFF = {tf.float32: U32, tf.float16: 2.0 ** -11, tf.bfloat16: 2.0 ** -8}
# Smallest positive subnormal: the absolute rounding error floor of each dtype.
SMALLEST_SUBNORMAL = {tf.float32: 2.0 ** -149, tf.float16: 2.0 ** -24, tf.bfloat16: 2.0 ** -133}
DTYPES = [tf.float32, tf.float16, tf.bfloat16]
HALF_DTYPES = [pytest.param(tf.float16, id="float16"), pytest.param(tf.bfloat16, id="bfloat16")]
ACTIVATIONS = ["tanh", "relu", "identity"]
GRAD_NAMES = ("encoder", "predictor", "kernel", "bias")

_EXPLORE = int(os.environ.get("TF_RNNT_PROPERTY_EXAMPLES", "0"))


def _settings(examples):
    return settings(max_examples=_EXPLORE or examples, deadline=None, derandomize=not _EXPLORE,
                    database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ------------------------------------------------------------------------------ strategies

@st.composite
def lattice_shapes(draw, max_b=3, max_t=8, max_u=5, max_v=9):
    """Shapes, blank, ragged lengths, labels (padded with garbage) and a seeded generator."""
    batch = draw(st.integers(1, max_b))
    max_frames = draw(st.integers(1, max_t))
    max_labels = draw(st.integers(0, max_u))
    vocab = draw(st.integers(2, max_v))
    blank = draw(st.integers(-vocab, vocab - 1))
    logit_lengths = np.array(draw(st.lists(st.integers(1, max_frames), min_size=batch,
                                           max_size=batch)), np.int32)
    label_lengths = np.array(draw(st.lists(st.integers(0, max_labels), min_size=batch,
                                           max_size=batch)), np.int32)
    pad_label = draw(st.sampled_from(["token", "blank", "negative", "vocab"]))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    rng = np.random.default_rng(seed)
    blank_index = blank % vocab
    non_blank = np.array([v for v in range(vocab) if v != blank_index])
    labels = non_blank[rng.integers(0, len(non_blank), size=(batch, max_labels))]
    pad_value = {"token": None, "blank": blank_index, "negative": -1, "vocab": vocab}[pad_label]
    if pad_value is not None:
        for b in range(batch):
            labels[b, label_lengths[b]:] = pad_value
    return dict(batch=batch, max_t=max_frames, max_u=max_labels, vocab=vocab, blank=blank,
                labels=labels.astype(np.int32), logit_lengths=logit_lengths,
                label_lengths=label_lengths, rng=rng)


@st.composite
def joint_problems(draw):
    shapes = draw(lattice_shapes())
    hidden = draw(st.integers(1, 6))
    scale = draw(st.sampled_from([0.3, 1.0, 2.5]))
    rng = shapes["rng"]
    batch, max_t, max_u, vocab = (shapes[k] for k in ("batch", "max_t", "max_u", "vocab"))
    params = (rng.normal(0.0, 1.0, size=(batch, max_t, hidden)),
              rng.normal(0.0, 1.0, size=(batch, max_u + 1, hidden)),
              rng.normal(0.0, scale / np.sqrt(hidden), size=(hidden, vocab)),
              rng.normal(0.0, 0.5, size=(vocab,)))
    return dict(shapes, params=params, hidden=hidden)


@st.composite
def loss_options(draw):
    return dict(fastemit_lambda=draw(st.sampled_from([0.0, 0.0, 0.4])),
                clamp=draw(st.sampled_from([-1.0, -1.0, 0.1])))


@st.composite
def tilings(draw):
    mode = draw(st.sampled_from(["tiled", "untiled"]))
    which = draw(st.sampled_from(["default", "tile_size", "memory_budget"]))
    if which == "tile_size":
        return dict(mode=mode, tile_size=draw(st.integers(1, 300)))
    if which == "memory_budget":
        return dict(mode=mode, memory_budget=draw(st.integers(1, 8192)))
    return dict(mode=mode)


def _upstream(rng, batch):
    """Per-sample weights of the costs: negative, zero and positive ones."""
    weights = rng.uniform(-2.0, 2.0, size=batch)
    if batch > 1:
        weights[rng.integers(batch)] = 0.0
    return weights


def _round(x, dtype):
    """x rounded to `dtype` and back to float64: the values the op really sees."""
    return tf.cast(tf.cast(tf.constant(np.asarray(x), tf.float64), dtype), tf.float64).numpy()


# ------------------------------------------------------------------------------ error model

def _abs_logits_grad(logits, labels, lattice_grad, blank):
    """Absolute scale of d logits: |g_blank| (1[v = blank] + p_v) + |g_label| (1[v = label] + p_v).

    The same sum as oracle.logits_grad_from_lattice_grad with every term made non-negative; the
    label channel counts only where the label is in [0, V) and u < U, as in the oracle.
    """
    probs = np.exp(oracle.log_softmax(logits))
    batch, _, max_u1, vocab = probs.shape
    blank = oracle.normalize_blank(blank, vocab)
    g_blank = np.abs(lattice_grad[..., 0])
    g_label = np.zeros_like(g_blank)
    scale = np.zeros_like(probs)
    scale[..., blank] += g_blank
    for b in range(batch):
        for u in range(max_u1 - 1):
            if 0 <= labels[b, u] < vocab:
                g_label[b, :, u] = np.abs(lattice_grad[b, :, u, 1])
                scale[b, :, u, labels[b, u]] += g_label[b, :, u]
    return scale + (g_blank + g_label)[..., None] * probs


def _lattice_entry_size(max_logit, vocab):
    """L = 2 Z + log V: the size of the terms of a log-softmax difference z_k - lse."""
    return 2.0 * max_logit + np.log(vocab)


def _assert_within(actual, expected, bound, err_msg=""):
    """|actual - expected| <= bound elementwise (bound broadcast), with a readable failure."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape, err_msg)
    assert np.all(np.isfinite(actual)), f"{err_msg}: non-finite values {actual}"
    excess = np.abs(actual - expected) - np.broadcast_to(bound, expected.shape)
    if np.any(excess > 0):
        index = np.unravel_index(int(np.argmax(excess)), expected.shape)
        raise AssertionError(
            f"{err_msg}: {np.sum(excess > 0)} of {expected.size} entries out of bounds; worst at "
            f"{index}: got {actual[index]!r}, expected {expected[index]!r}, bound "
            f"{np.broadcast_to(bound, expected.shape)[index]!r}")


def _float32_bound(expected, extra=0.0):
    """The op suites' float32 bound RTOL (|e| + max |e|), plus `extra`."""
    expected = np.asarray(expected, np.float64)
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    return RTOL * (np.abs(expected) + scale) + extra


def _cost_bound(costs, logit_lengths, label_lengths, entry_size, unit):
    """RTOL |cost| + 2 unit (T_b + U_b) L: a path's T_b + U_b lattice entries, each off by
    about unit * L."""
    steps = np.asarray(logit_lengths, np.float64) + np.asarray(label_lengths, np.float64)
    return RTOL * np.abs(costs) + 2.0 * unit * steps * entry_size


def _gradients(fn, params, upstream):
    """Values of fn(*params) and d sum(upstream * fn) / d params (eager)."""
    with tf.GradientTape() as tape:
        tape.watch(params)
        costs = fn(*params)
        total = tf.reduce_sum(costs * tf.constant(upstream, tf.float32))
    return costs, tape.gradient(total, params)


# ------------------------------------------------------------------------------ rnnt_loss

def _composed_loss(logits, labels, logit_lengths, label_lengths, blank, **options):
    lattice = tf_rnnt.logits_to_lattice(logits, labels, blank=blank)
    return tf_rnnt.lattice_loss(lattice, logit_lengths, label_lengths, **options)


@pytest.mark.parametrize("loss_fn", [
    pytest.param(tf_rnnt.rnnt_loss, id="rnnt_loss"),
    pytest.param(_composed_loss, id="lattice_loss_of_logits_to_lattice"),
])
@pytest.mark.parametrize("device", DEVICES)
@_settings(150)
@given(shapes=lattice_shapes(), dtype=st.sampled_from(DTYPES),
       scale=st.sampled_from([0.1, 1.0, 4.0]), options=loss_options())
def test_rnnt_loss_matches_oracle(loss_fn, device, shapes, dtype, scale, options):
    rng = shapes["rng"]
    batch, max_t, max_u, vocab = (shapes[k] for k in ("batch", "max_t", "max_u", "vocab"))
    logits = _round(rng.normal(0.0, scale, size=(batch, max_t, max_u + 1, vocab)), dtype)
    labels, logit_lengths, label_lengths, blank = (
        shapes[k] for k in ("labels", "logit_lengths", "label_lengths", "blank"))
    upstream = _upstream(rng, batch)
    costs, grads = oracle.rnnt_loss(logits, labels, logit_lengths, label_lengths, blank,
                                    upstream=upstream, **options)
    with tf.device(device):
        x = tf.cast(tf.constant(logits, tf.float32), dtype)
        got_costs, (got_grads,) = _gradients(
            lambda x: loss_fn(x, labels, logit_lengths, label_lengths, blank=blank, **options),
            [x], upstream)
    assert got_costs.dtype == tf.float32 and got_grads.dtype == dtype
    got_grads = tf.cast(got_grads, tf.float64).numpy()

    entry_size = _lattice_entry_size(np.max(np.abs(logits)), vocab)
    _assert_within(got_costs.numpy(), costs,
                   _cost_bound(costs, logit_lengths, label_lengths, entry_size, U32), "costs")
    lattice = oracle.lattice_from_logits(logits, labels, blank)
    _, lattice_grads = oracle.lattice_loss(lattice, logit_lengths, label_lengths,
                                           upstream=upstream, **options)
    abs_scale = _abs_logits_grad(logits, labels, lattice_grads, blank)
    bound = _float32_bound(grads, (4.0 + 2.0 * entry_size) * U32 * abs_scale)
    if dtype != tf.float32:  # one rounding of the float32 result into the input dtype
        u = UNIT_ROUNDOFF[dtype]
        bound = bound + 2 * u * np.abs(grads) + u * np.max(np.abs(grads)) \
            + SMALLEST_SUBNORMAL[dtype]
    _assert_within(got_grads, grads, bound, "d logits")
    padding = ~oracle.valid_node_mask(max_t, max_u + 1, logit_lengths, label_lengths)
    assert np.all(got_grads[padding] == 0.0), "gradient leaked into the padded nodes"


# ------------------------------------------------------------------------------ lattice_loss

@pytest.mark.parametrize("device", DEVICES)
@_settings(100)
@given(shapes=lattice_shapes(), dtype=st.sampled_from(DTYPES), options=loss_options())
def test_lattice_loss_on_arbitrary_lattices(device, shapes, dtype, options):
    # Any real lattice is a valid input (unnormalized log-probabilities, positive values):
    # the recursions and their gradient must not assume normalization. The entries are the
    # op's inputs, so only the recursions' float32 error (RTOL) and, for half inputs, the
    # rounding of the gradient into the input dtype remain.
    rng = shapes["rng"]
    batch, max_t, max_u = shapes["batch"], shapes["max_t"], shapes["max_u"]
    logit_lengths, label_lengths = shapes["logit_lengths"], shapes["label_lengths"]
    lattice = _round(rng.uniform(-8.0, 1.0, size=(batch, max_t, max_u + 1, 2)), dtype)
    upstream = _upstream(rng, batch)
    costs, grads = oracle.lattice_loss(lattice, logit_lengths, label_lengths, upstream=upstream,
                                       **options)
    with tf.device(device):
        x = tf.cast(tf.constant(lattice, tf.float32), dtype)
        got_costs, (got_grads,) = _gradients(
            lambda x: tf_rnnt.lattice_loss(x, logit_lengths, label_lengths, **options), [x],
            upstream)
    got_grads = tf.cast(got_grads, tf.float64).numpy()
    oracle.assert_close(got_costs.numpy(), costs, RTOL, err_msg="costs")
    bound = _float32_bound(grads)
    if dtype != tf.float32:
        u = UNIT_ROUNDOFF[dtype]
        bound = bound + 2 * u * np.abs(grads) + u * np.max(np.abs(grads)) \
            + SMALLEST_SUBNORMAL[dtype]
    _assert_within(got_grads, grads, bound, "d lattice")


# ------------------------------------------------------------------------------ joint ops

def _joint_error_scales(params, labels, logit_lengths, label_lengths, lattice_grad, blank,
                        activation):
    """(L, absolute scales S, underflow scales) of the four gradients of a joint whose lattice
    gets the gradient lattice_grad.

    S of d encoder[b, t, h] is sum_u sum_v |d logits| |kernel[h, v]|, of d kernel[h, v]
    sum_nodes |hidden_h| |d logits_v|, and so on: the sums the op computes, with every term
    made non-negative. The underflow scales are the same sums with |d logits| + 1 and
    |hidden| + 1 at the valid nodes: each rounded value (joint values, d logits) may also be off
    by half the dtype's smallest subnormal (float16's range ends at 6e-8).
    """
    encoder, predictor, kernel, bias = params
    hidden = oracle._activation(encoder[:, :, None, :] + predictor[:, None, :, :], activation)
    logits = hidden @ kernel + bias
    max_logit = float(np.max(np.abs(hidden) @ np.abs(kernel) + np.abs(bias))) if logits.size \
        else 0.0
    mask = oracle.valid_node_mask(logits.shape[1], logits.shape[2], logit_lengths,
                                  label_lengths)[..., None]
    abs_d_logits = _abs_logits_grad(logits, labels, lattice_grad * mask, blank)

    def sums(abs_hidden, abs_d_logits):
        abs_d_hidden = abs_d_logits @ np.abs(kernel).T
        return (abs_d_hidden.sum(axis=2), abs_d_hidden.sum(axis=1),
                np.einsum("btuh,btuv->hv", abs_hidden, abs_d_logits),
                abs_d_logits.sum(axis=(0, 1, 2)))

    return (_lattice_entry_size(max_logit, kernel.shape[1]), sums(np.abs(hidden), abs_d_logits),
            sums((np.abs(hidden) + 1.0) * mask, abs_d_logits + mask))


def _joint_grad_bounds(expected_grads, scales, underflow_scales, entry_size, dtype):
    """Float32 part + (4 + 2 L) u S + subnormal * S_underflow per entry (module docstring)."""
    unit = U32 + (UNIT_ROUNDOFF[dtype] if dtype != tf.float32 else 0.0)
    return [_float32_bound(e, (4.0 + 2.0 * entry_size) * unit * s
                           + SMALLEST_SUBNORMAL[dtype] * s_under)
            for e, s, s_under in zip(expected_grads, scales, underflow_scales)]


def _run_joint_loss(loss_fn, params, problem, upstream, dtype, device="/CPU:0", **options):
    """Costs and the four gradients (float64 NumPy) of sum(upstream * loss_fn(...))."""
    labels, logit_lengths, label_lengths = (
        problem[k] for k in ("labels", "logit_lengths", "label_lengths"))
    with tf.device(device):
        tensors = [tf.cast(tf.constant(x, tf.float32), dtype) for x in params]
        costs, grads = _gradients(
            lambda *p: loss_fn(*p, labels, logit_lengths, label_lengths, **options), tensors,
            upstream)
    assert costs.dtype == tf.float32
    assert [g.dtype for g in grads] == [dtype] * 4
    return [costs.numpy()] + [tf.cast(g, tf.float64).numpy() for g in grads]


def _check_joint_loss(got, problem, params, upstream, dtype, activation, fastemit_lambda=0.0,
                      clamp=-1.0):
    """got (costs + 4 gradients) against the float64 oracle, within the error model."""
    labels, logit_lengths, label_lengths, blank = (
        problem[k] for k in ("labels", "logit_lengths", "label_lengths", "blank"))
    exact = oracle.flash_rnnt_loss(*params, labels, logit_lengths, label_lengths, blank,
                                   activation, fastemit_lambda, clamp, upstream)
    logits = oracle.joint_logits(*params, activation)
    lattice = oracle.lattice_from_logits(logits, labels, blank)
    _, lattice_grad = oracle.lattice_loss(lattice, logit_lengths, label_lengths, fastemit_lambda,
                                          clamp, upstream)
    entry_size, scales, underflow_scales = _joint_error_scales(
        params, labels, logit_lengths, label_lengths, lattice_grad, blank, activation)
    unit = U32 + (UNIT_ROUNDOFF[dtype] if dtype != tf.float32 else 0.0)
    _assert_within(got[0], exact[0],
                   _cost_bound(exact[0], logit_lengths, label_lengths, entry_size, unit),
                   "costs")
    for name, g, e, bound in zip(GRAD_NAMES, got[1:], exact[1:],
                                 _joint_grad_bounds(exact[1:], scales, underflow_scales,
                                                    entry_size, dtype)):
        _assert_within(g, e, bound, f"d {name}")


@pytest.mark.parametrize("device", DEVICES)
@_settings(250)
@given(problem=joint_problems(), dtype=st.sampled_from(DTYPES),
       activation=st.sampled_from(ACTIVATIONS), tiling=tilings(), options=loss_options())
def test_flash_rnnt_loss_matches_oracle(device, problem, dtype, activation, tiling, options):
    params = tuple(_round(x, dtype) for x in problem["params"])
    upstream = _upstream(problem["rng"], problem["batch"])
    got = _run_joint_loss(tf_rnnt.flash_rnnt_loss, params, problem, upstream, dtype, device,
                          blank=problem["blank"], activation=activation, **tiling, **options)
    _check_joint_loss(got, problem, params, upstream, dtype, activation, **options)
    # Padded frames and predictor steps get exactly zero gradient.
    for b in range(problem["batch"]):
        assert np.all(got[1][b, problem["logit_lengths"][b]:] == 0.0), "d encoder padding"
        assert np.all(got[2][b, problem["label_lengths"][b] + 1:] == 0.0), "d predictor padding"


@pytest.mark.parametrize("device", DEVICES)
@_settings(120)
@given(problem=joint_problems(), activation=st.sampled_from(ACTIVATIONS), tiling=tilings())
def test_joint_lattice_matches_oracle(device, problem, activation, tiling):
    params = tuple(_round(x, tf.float32) for x in problem["params"])
    labels, logit_lengths, label_lengths = (
        problem[k] for k in ("labels", "logit_lengths", "label_lengths"))
    blank = problem["blank"]
    valid = oracle.valid_node_mask(problem["max_t"], problem["max_u"] + 1, logit_lengths,
                                   label_lengths)
    u = np.arange(problem["max_u"] + 1)[None, None, :]
    label_used = valid & (u < label_lengths[:, None, None])
    d_lattice = problem["rng"].normal(size=valid.shape + (2,))
    # The label entry at u = label_length is unspecified and never used by a loss: no gradient
    # goes into it. Padded nodes do get an upstream gradient, which must be ignored.
    d_lattice[..., 1] *= np.where(valid & ~label_used, 0.0, 1.0)
    with tf.device(device):
        tensors = [tf.constant(x, tf.float32) for x in params]
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            lattice = tf_rnnt.joint_lattice(*tensors, labels, logit_lengths, label_lengths,
                                            blank=blank, activation=activation, **tiling)
        grads = tape.gradient(lattice, tensors,
                              output_gradients=tf.constant(d_lattice, tf.float32))
    lattice = lattice.numpy()
    assert np.all(lattice[~valid] == 0.0), "nodes outside the rectangle must be 0"
    expected = oracle.joint_lattice(*params, labels, logit_lengths, label_lengths, blank,
                                    activation)
    entry_size, scales, underflow_scales = _joint_error_scales(
        params, labels, logit_lengths, label_lengths, d_lattice, blank, activation)
    # Each lattice entry z_k - lse is off by a few ulps of its terms (size L).
    for channel, mask in ((0, valid), (1, label_used)):
        e = np.where(mask, expected[..., channel], 0.0)
        _assert_within(np.where(mask, lattice[..., channel], 0.0), e,
                       _float32_bound(e, 4.0 * U32 * entry_size * mask), f"channel {channel}")
    expected_grads = oracle.joint_lattice_backward(*params, labels, logit_lengths, label_lengths,
                                                   d_lattice, blank, activation)
    for name, g, e, bound in zip(GRAD_NAMES, grads, expected_grads,
                                 _joint_grad_bounds(expected_grads, scales, underflow_scales,
                                                    entry_size, tf.float32)):
        _assert_within(g.numpy(), e, bound, f"d {name}")


# Each samplewise configuration (activation, dtype, parallel_iterations, FastEmit) traces its own
# tf.function (~2 s on the CPU), so these properties vary the shapes and values freely but keep
# the configurations few; tests/samplewise/test_samplewise.py covers the other options.
@pytest.mark.parametrize("device", DEVICES)
@_settings(20)
@given(problem=joint_problems(), activation=st.sampled_from(ACTIVATIONS))
def test_samplewise_rnnt_loss_matches_oracle(device, problem, activation):
    params = tuple(_round(x, tf.float32) for x in problem["params"])
    upstream = _upstream(problem["rng"], problem["batch"])
    got = _run_joint_loss(tf_rnnt.samplewise_rnnt_loss, params, problem, upstream, tf.float32,
                          device, blank=problem["blank"], activation=activation,
                          parallel_iterations=2)
    _check_joint_loss(got, problem, params, upstream, tf.float32, activation)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
@_settings(8)
@given(problem=joint_problems())
def test_samplewise_rnnt_loss_half_precision(device, dtype, problem):
    params = tuple(_round(x, dtype) for x in problem["params"])
    upstream = _upstream(problem["rng"], problem["batch"])
    got = _run_joint_loss(tf_rnnt.samplewise_rnnt_loss, params, problem, upstream, dtype, device,
                          blank=problem["blank"], activation="tanh", parallel_iterations=2)
    _check_joint_loss(got, problem, params, upstream, dtype, "tanh")


# ------------------------------------------------------------------------------ degenerate sizes,
# int64 inputs, extreme magnitudes, second order

# Entry points of the joint problem, as functions of (params, ints, blank).
_DEGENERATE_LOSSES = {
    "flash_tiled": lambda p, i, blank: tf_rnnt.flash_rnnt_loss(*p, *i, blank=blank, tile_size=2),
    "flash_untiled": lambda p, i, blank: tf_rnnt.flash_rnnt_loss(*p, *i, blank=blank,
                                                                 mode="untiled"),
    "samplewise": lambda p, i, blank: tf_rnnt.samplewise_rnnt_loss(*p, *i, blank=blank,
                                                                   parallel_iterations=1),
    "reference": lambda p, i, blank: tf_rnnt.reference.flash_rnnt_loss(*p, *i, blank=blank),
}


def _degenerate_problem(batch, max_t, max_u, hidden, vocab, scale, seed):
    """A joint problem of any size (B, T, U, H = 0 and V = 1 included) at logit scale `scale`."""
    rng = np.random.default_rng(seed)
    blank = int(rng.integers(-vocab, vocab))
    blank_index = blank % vocab
    labels = rng.integers(0, vocab, size=(batch, max_u))
    if vocab > 1:  # labels are never blank; with V = 1 every sample has label length 0
        labels = np.where(labels == blank_index, (blank_index + 1) % vocab, labels)
        label_lengths = rng.integers(0, max_u + 1, size=batch)
    else:
        label_lengths = np.zeros(batch, np.int64)
    logit_lengths = rng.integers(1, max_t + 1, size=batch) if max_t else np.zeros(batch, np.int64)
    params = [rng.normal(size=(batch, max_t, hidden)), rng.normal(size=(batch, max_u + 1, hidden)),
              rng.normal(scale=scale / np.sqrt(max(hidden, 1)), size=(hidden, vocab)),
              rng.normal(scale=scale, size=(vocab,))]
    params = [x.astype(np.float32).astype(np.float64) for x in params]
    return params, [labels, logit_lengths, label_lengths], blank


def check_problem(batch, max_t, max_u, hidden, vocab, scale=1.0, overflow=None, seed=0):
    """Every entry point on one problem of any size against the float64 oracle, int64 inputs.

    With `overflow` ("labels", "logit_lengths" or "label_lengths"), that input's first entry is
    first raised by 2**32, which must give InvalidArgumentError naming it.
    """
    if max_t == 0:
        batch = 0  # every sample needs a frame
    params, ints, blank = _degenerate_problem(batch, max_t, max_u, hidden, vocab, scale, seed)
    index = None if overflow is None else ("labels", "logit_lengths", "label_lengths").index(
        overflow)
    if index is not None and ints[index].size:
        bad = [x.copy() for x in ints]
        bad[index].flat[0] += 2**32
        for loss in _DEGENERATE_LOSSES.values():
            with pytest.raises(tf.errors.InvalidArgumentError, match=overflow):
                loss([tf.constant(x, tf.float32) for x in params],
                     [tf.constant(x, tf.int64) for x in bad], blank).numpy()
    expected = oracle.flash_rnnt_loss(*params, *ints, blank=blank)
    rtol = 1e-5 + 1e-6 * scale  # float32 log-softmax differences of size ~scale
    for name, loss in _DEGENERATE_LOSSES.items():
        tensors = [tf.constant(x, tf.float32) for x in params]
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            costs = loss(tensors, [tf.constant(x, tf.int64) for x in ints], blank)
            total = tf.reduce_sum(costs)
        grads = tape.gradient(total, tensors)
        what = f"{name} B={batch} T={max_t} U={max_u} H={hidden} V={vocab} scale={scale}"
        # Float32 log-softmax differences of logits of size `scale` are off by a few roundings
        # of that size (the error model above): an absolute error in each cost term and in each
        # node's probabilities, however small the cost or gradient entry.
        np.testing.assert_allclose(costs.numpy(), expected[0], rtol=rtol,
                                   atol=4 * U32 * (1 + scale) * (max_t + max_u), err_msg=what)
        nodes = max_t * (max_u + 1)
        for grad, want in zip(grads, expected[1:]):
            np.testing.assert_allclose(grad.numpy(), want, rtol=rtol,
                                       atol=4 * U32 * (1 + scale) * (1 + nodes), err_msg=what)


def check_degenerate_sizes(max_examples):
    """Hypothesis loop over `check_problem`, run in a subprocess by the test below."""

    @settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(batch=st.integers(0, 2), max_t=st.integers(0, 3), max_u=st.integers(0, 2),
           hidden=st.integers(0, 3), vocab=st.integers(1, 4),
           scale=st.sampled_from([1.0, 1e2, 1e4]), overflow=st.sampled_from(
               [None, "labels", "logit_lengths", "label_lengths"]), seed=st.integers(0, 2**16))
    def check(batch, max_t, max_u, hidden, vocab, scale, overflow, seed):
        check_problem(batch, max_t, max_u, hidden, vocab, scale, overflow, seed)

    check()


def _run_in_subprocess(code):
    # A crash (e.g. an abort in a kernel) fails the test instead of killing pytest.
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=pythonpath(
        REPO_ROOT, TESTS_DIR, os.path.dirname(os.path.abspath(__file__))))
    # Exact GEMMs on a GPU too (the conftest fixture does not reach the subprocess).
    prelude = ("import tensorflow as tf; "
               "tf.config.experimental.enable_tensor_float_32_execution(False); ")
    result = subprocess.run([sys.executable, "-c", f"{prelude}import test_properties; {code}"],
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, (
        f"exit status {result.returncode} (negative: killed by that signal)\n"
        f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")


# (B, T, U, H, V): each size at zero (T = 0 with B = 0), and V = 1 (blank only).
ZERO_SIZES = [(0, 3, 2, 3, 4), (0, 0, 0, 3, 4), (2, 3, 0, 3, 4), (2, 3, 2, 0, 4),
              (2, 3, 0, 3, 1), (2, 1, 2, 0, 1)]


def test_zero_sizes_in_a_subprocess():
    _run_in_subprocess("; ".join(f"test_properties.check_problem{case}" for case in ZERO_SIZES))


def test_degenerate_sizes_int64_and_extremes_in_a_subprocess():
    _run_in_subprocess(f"test_properties.check_degenerate_sizes({_EXPLORE or 25})")


@_settings(4)
@given(problem=joint_problems())
def test_reference_hessian_vector_products_match_oracle(problem):
    # Second order of tf_rnnt.reference (autodiff) against central differences of the float64
    # oracle's gradient, d/d logits of <d cost / d logits, v>.
    params = problem["params"]
    labels, logit_lengths, label_lengths = (problem[k] for k in ("labels", "logit_lengths",
                                                                 "label_lengths"))
    logits = oracle.joint_logits(*params)
    logits = logits.astype(np.float32).astype(np.float64)
    direction = problem["rng"].normal(size=logits.shape)
    eps = 1e-4

    def oracle_grad(x):
        return oracle.rnnt_loss(x, labels, logit_lengths, label_lengths,
                                blank=problem["blank"])[1]

    expected = (oracle_grad(logits + eps * direction)
                - oracle_grad(logits - eps * direction)) / (2 * eps)
    x = tf.constant(logits, tf.float32)
    with tf.GradientTape() as outer:
        outer.watch(x)
        with tf.GradientTape() as inner:
            inner.watch(x)
            total = tf.reduce_sum(tf_rnnt.reference.rnnt_loss(
                x, labels, logit_lengths, label_lengths, blank=problem["blank"]))
        directional = tf.reduce_sum(inner.gradient(total, x) * direction)
    oracle.assert_close(outer.gradient(directional, x).numpy(), expected, rtol=1e-3)
