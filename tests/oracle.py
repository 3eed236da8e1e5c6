"""Independent float64 NumPy RNN-T oracle for the tests.

Written from the textbook recursions (Graves 2012, "Sequence Transduction with Recurrent
Neural Networks", eq. 16-22), sharing no code with tf_rnnt: explicit loops over the lattice,
alpha and beta both computed, gradients from alpha/beta (not autodiff).

Conventions (the same as tf_rnnt's ops):
  lattice[b, t, u, 0] = log P(blank | t, u), lattice[b, t, u, 1] = log P(y_{u+1} | t, u),
  shape [B, T, U+1, 2]; costs are -log P(y|x) per sample; sample b uses the nodes
  t < logit_lengths[b], u <= label_lengths[b]; every other node gets zero gradient.
"""

import numpy as np

ACTIVATIONS = ("tanh", "relu", "identity")


def log_softmax(logits):
    x = np.asarray(logits, np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


def normalize_blank(blank, vocab_size):
    blank = int(blank)
    return blank + vocab_size if blank < 0 else blank


def lattice_from_logits(logits, labels, blank=0):
    """[B, T, U+1, V] logits, [B, U] labels -> [B, T, U+1, 2] float64 lattice.

    The label channel is 0 at u = U and wherever labels[b, u] is outside [0, V).
    """
    log_probs = log_softmax(logits)
    batch, max_t, max_u1, vocab = log_probs.shape
    blank = normalize_blank(blank, vocab)
    labels = np.asarray(labels, np.int64)
    lattice = np.zeros((batch, max_t, max_u1, 2))
    lattice[..., 0] = log_probs[..., blank]
    for b in range(batch):
        for u in range(max_u1 - 1):
            label = labels[b, u]
            if 0 <= label < vocab:
                lattice[b, :, u, 1] = log_probs[b, :, u, label]
    return lattice


def alpha_beta(lattice_b, num_frames, num_labels):
    """Forward/backward variables of one sample (its valid rectangle only).

    alpha[t, u]: log-prob of reaching node (t, u) having emitted y_1..y_u.
    beta[t, u]: log-prob of finishing from node (t, u), including the final blank.
    """
    blank = lattice_b[:num_frames, :num_labels + 1, 0]
    label = lattice_b[:num_frames, :num_labels + 1, 1]

    def into(alpha, t, u):
        terms = []
        if t > 0:
            terms.append(alpha[t - 1, u] + blank[t - 1, u])
        if u > 0:
            terms.append(alpha[t, u - 1] + label[t, u - 1])
        return terms

    def out_of(beta, t, u):
        if t == num_frames - 1 and u == num_labels:
            return [blank[t, u]]
        terms = []
        if t < num_frames - 1:
            terms.append(beta[t + 1, u] + blank[t, u])
        if u < num_labels:
            terms.append(beta[t, u + 1] + label[t, u])
        return terms

    return (_forward_table(num_frames, num_labels, into),
            _backward_table(num_frames, num_labels, out_of))


def _forward_table(num_frames, num_labels, terms):
    """alpha [T, U+1] from alpha[0, 0] = 0: alpha[t, u] = logsumexp(terms(alpha, t, u)),
    node by node in increasing t, then u."""
    alpha = np.full((num_frames, num_labels + 1), -np.inf)
    alpha[0, 0] = 0.0
    for t in range(num_frames):
        for u in range(num_labels + 1):
            if t == 0 and u == 0:
                continue
            alpha[t, u] = np.logaddexp.reduce(terms(alpha, t, u))
    return alpha


def _backward_table(num_frames, num_labels, terms):
    """beta [T, U+1]: beta[t, u] = logsumexp(terms(beta, t, u)), node by node in decreasing t,
    then u."""
    beta = np.full((num_frames, num_labels + 1), -np.inf)
    for t in reversed(range(num_frames)):
        for u in reversed(range(num_labels + 1)):
            beta[t, u] = np.logaddexp.reduce(terms(beta, t, u))
    return beta


def lattice_loss(lattice, logit_lengths, label_lengths, fastemit_lambda=0.0, clamp=-1.0,
                 upstream=None):
    """Costs [B] and d (sum_b upstream[b] * cost_b) / d lattice [B, T, U+1, 2], float64.

    FastEmit scales the label channel of d cost / d lattice by (1 + fastemit_lambda), leaving
    the cost unchanged; then, when clamp > 0, the gradient is clipped to [-clamp, clamp];
    the upstream gradient multiplies last.
    """

    def sample(lattice_b, num_frames, num_labels):
        alpha, beta = alpha_beta(lattice_b, num_frames, num_labels)
        log_p = beta[0, 0]
        # The two directions must agree: a built-in self-check of the oracle.
        forward_log_p = alpha[-1, -1] + lattice_b[num_frames - 1, num_labels, 0]
        assert np.isclose(log_p, forward_log_p, rtol=1e-9, atol=1e-9), (log_p, forward_log_p)
        blank = lattice_b[:num_frames, :num_labels + 1, 0]
        label = lattice_b[:num_frames, :num_labels + 1, 1]
        # beta at the next node, with the terminal blank leading to "done" (log 1 = 0).
        beta_next_t = np.full_like(beta, -np.inf)
        beta_next_t[:-1] = beta[1:]
        beta_next_t[-1, -1] = 0.0
        g_blank = -np.exp(alpha + blank + beta_next_t - log_p)
        g_label = np.zeros_like(g_blank)
        g_label[:, :-1] = -np.exp(alpha[:, :-1] + label[:, :-1] + beta[:, 1:] - log_p)
        g_label *= 1.0 + fastemit_lambda
        return -log_p, np.stack([g_blank, g_label], axis=-1)

    return _batch_loss(np.asarray(lattice, np.float64), logit_lengths, label_lengths, clamp,
                       upstream, sample)


def _batch_loss(lattice, logit_lengths, label_lengths, clamp, upstream, sample):
    """Costs [B] and d (sum_b upstream[b] * cost_b) / d lattice from the per-sample
    `sample(lattice[b], num_frames, num_labels) -> (cost, d cost / d lattice[b]'s valid
    rectangle, or None for a zero gradient)`, the gradient clipped to [-clamp, clamp] when
    clamp > 0, then times upstream."""
    batch = lattice.shape[0]
    costs = np.zeros(batch)
    grad = np.zeros_like(lattice)
    upstream = np.ones(batch) if upstream is None else np.asarray(upstream, np.float64)
    for b in range(batch):
        num_frames, num_labels = int(logit_lengths[b]), int(label_lengths[b])
        costs[b], g = sample(lattice[b], num_frames, num_labels)
        if g is None:
            continue
        if clamp > 0:
            g = np.clip(g, -clamp, clamp)
        grad[b, :num_frames, :num_labels + 1] = g * upstream[b]
    return costs, grad


def logits_grad_from_lattice_grad(logits, labels, lattice_grad, blank=0):
    """Chain rule from d lattice to d logits (log_softmax picks).

    d_logits[v] = g_blank * (1[v == blank] - p_v) + g_label * (1[v == label] - p_v).
    """
    probs = np.exp(log_softmax(logits))
    batch, max_t, max_u1, vocab = probs.shape
    blank = normalize_blank(blank, vocab)
    labels = np.asarray(labels, np.int64)
    g_blank = np.asarray(lattice_grad[..., 0], np.float64)
    # The label channel is a constant 0 at u = U and for labels outside [0, V): no gradient.
    g_label = np.zeros_like(g_blank)
    d_logits = -g_blank[..., None] * probs
    d_logits[..., blank] += g_blank
    for b in range(batch):
        for u in range(max_u1 - 1):
            label = labels[b, u]
            if 0 <= label < vocab:
                g_label[b, :, u] = lattice_grad[b, :, u, 1]
                d_logits[b, :, u, label] += g_label[b, :, u]
    d_logits -= g_label[..., None] * probs
    return d_logits


def rnnt_loss(logits, labels, logit_lengths, label_lengths, blank=0, fastemit_lambda=0.0,
              clamp=-1.0, upstream=None):
    """Costs [B] and d (sum_b upstream[b] * cost_b) / d logits [B, T, U+1, V], float64."""
    lattice = lattice_from_logits(logits, labels, blank)
    costs, lattice_grad = lattice_loss(lattice, logit_lengths, label_lengths, fastemit_lambda,
                                       clamp, upstream)
    return costs, logits_grad_from_lattice_grad(logits, labels, lattice_grad, blank)


# ----------------------------------------------------------------------------- joint network

def _activation(pre, activation):
    if activation == "tanh":
        return np.tanh(pre)
    if activation == "relu":
        return np.maximum(pre, 0.0)
    if activation == "identity":
        return pre.copy()
    raise ValueError(f"unknown activation {activation!r}")


def _activation_grad(pre, hidden, activation):
    if activation == "tanh":
        return 1.0 - hidden ** 2
    if activation == "relu":
        return (pre > 0).astype(np.float64)
    return np.ones_like(pre)


def joint_logits(encoder, predictor, kernel, bias, activation="tanh"):
    """logits[b, t, u] = act(encoder[b, t] + predictor[b, u]) @ kernel + bias, float64."""
    encoder, predictor = np.asarray(encoder, np.float64), np.asarray(predictor, np.float64)
    pre = encoder[:, :, None, :] + predictor[:, None, :, :]
    hidden = _activation(pre, activation)
    return hidden @ np.asarray(kernel, np.float64) + np.asarray(bias, np.float64)


def joint_backward(encoder, predictor, kernel, bias, d_logits, activation="tanh"):
    """Gradients (encoder, predictor, kernel, bias) of sum(d_logits * joint_logits(...))."""
    encoder, predictor = np.asarray(encoder, np.float64), np.asarray(predictor, np.float64)
    kernel = np.asarray(kernel, np.float64)
    pre = encoder[:, :, None, :] + predictor[:, None, :, :]
    hidden = _activation(pre, activation)
    d_kernel = np.einsum("btuh,btuv->hv", hidden, d_logits)
    d_bias = d_logits.sum(axis=(0, 1, 2))
    d_pre = (d_logits @ kernel.T) * _activation_grad(pre, hidden, activation)
    return d_pre.sum(axis=2), d_pre.sum(axis=1), d_kernel, d_bias


def valid_node_mask(max_t, max_u1, logit_lengths, label_lengths):
    """[B, T, U+1] bool: node (t, u) lies in sample b's (logit_length, label_length+1) rectangle."""
    t = np.arange(max_t)[None, :, None]
    u = np.arange(max_u1)[None, None, :]
    return (t < np.asarray(logit_lengths)[:, None, None]) & (
        u <= np.asarray(label_lengths)[:, None, None])


def joint_lattice(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths, blank=0,
                  activation="tanh"):
    """The [B, T, U+1, 2] lattice of the joint, zero outside each sample's rectangle."""
    logits = joint_logits(encoder, predictor, kernel, bias, activation)
    lattice = lattice_from_logits(logits, labels, blank)
    mask = valid_node_mask(logits.shape[1], logits.shape[2], logit_lengths, label_lengths)
    return lattice * mask[..., None]


def joint_lattice_backward(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths,
                           d_lattice, blank=0, activation="tanh"):
    """Gradients (encoder, predictor, kernel, bias) of sum(d_lattice * joint_lattice(...))."""
    logits = joint_logits(encoder, predictor, kernel, bias, activation)
    mask = valid_node_mask(logits.shape[1], logits.shape[2], logit_lengths, label_lengths)
    d_lattice = np.asarray(d_lattice, np.float64) * mask[..., None]
    d_logits = logits_grad_from_lattice_grad(logits, labels, d_lattice, blank)
    return joint_backward(encoder, predictor, kernel, bias, d_logits, activation)


def flash_rnnt_loss(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths, blank=0,
                    activation="tanh", fastemit_lambda=0.0, clamp=-1.0, upstream=None):
    """Costs [B] and gradients (encoder, predictor, kernel, bias) of sum_b upstream[b] * cost_b."""
    logits = joint_logits(encoder, predictor, kernel, bias, activation)
    costs, d_logits = rnnt_loss(logits, labels, logit_lengths, label_lengths, blank,
                                fastemit_lambda, clamp, upstream)
    return (costs,) + joint_backward(encoder, predictor, kernel, bias, d_logits, activation)


# ----------------------------------------------------------------------------- random problems

def random_problem(rng, batch, max_t, max_u, vocab, blank=0, ragged=True, min_t=1):
    """Random logits, labels (never blank) and (ragged) lengths with max lengths attained."""
    blank_index = normalize_blank(blank, vocab)
    logits = rng.normal(0.0, 1.0, size=(batch, max_t, max_u + 1, vocab))
    non_blank = np.array([v for v in range(vocab) if v != blank_index])
    labels = non_blank[rng.integers(0, len(non_blank), size=(batch, max_u))]
    if ragged:
        logit_lengths = rng.integers(min_t, max_t + 1, size=batch)
        label_lengths = rng.integers(0, max_u + 1, size=batch)
        logit_lengths[0], label_lengths[-1] = max_t, max_u
    else:
        logit_lengths = np.full(batch, max_t)
        label_lengths = np.full(batch, max_u)
    return logits, labels.astype(np.int32), logit_lengths.astype(np.int32), \
        label_lengths.astype(np.int32)


def random_joint_problem(rng, batch, max_t, max_u, hidden, vocab, blank=0, ragged=True):
    """Random encoder [B, T, H], predictor [B, U+1, H], kernel [H, V], bias [V], labels, lengths."""
    _, labels, logit_lengths, label_lengths = random_problem(
        rng, batch, max_t, max_u, vocab, blank, ragged)
    encoder = rng.normal(0.0, 1.0, size=(batch, max_t, hidden))
    predictor = rng.normal(0.0, 1.0, size=(batch, max_u + 1, hidden))
    kernel = rng.normal(0.0, 1.0 / np.sqrt(hidden), size=(hidden, vocab))
    bias = rng.normal(0.0, 0.1, size=(vocab,))
    return encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths


def float32_joint_problem(seed, shape, blank=0, ragged=True):
    """random_joint_problem for `shape` = (B, T, U, H, V) with float32-representable float64
    parameters, so float32 runs see exactly the oracle's inputs."""
    encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths = \
        random_joint_problem(np.random.default_rng(seed), *shape, blank=blank, ragged=ragged)
    params = [x.astype(np.float32).astype(np.float64) for x in (encoder, predictor, kernel, bias)]
    return (*params, labels, logit_lengths, label_lengths)


def blank_id(blank, vocab):
    """A test's blank parameter as an id: an int (negative counts from the end) or "middle"."""
    return vocab // 2 if blank == "middle" else blank


def upstream_weights(batch, seed=1):
    """Per-sample weights of the costs (d total / d cost_b): some negative, the middle one 0."""
    weights = np.random.default_rng(seed).uniform(-2.0, 2.0, size=batch)
    if batch > 1:
        weights[batch // 2] = 0.0
    return weights


# ----------------------------------------------------------------------------- comparisons

def central_differences(fn, x, step=1e-6):
    """d fn / d x of a scalar function of an array, by central differences in float64."""
    x = np.array(x, np.float64)
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        saved = x[index]
        x[index] = saved + step
        plus = fn(x)
        x[index] = saved - step
        minus = fn(x)
        x[index] = saved
        grad[index] = (plus - minus) / (2 * step)
    return grad


def assert_close(actual, expected, rtol=1e-5, err_msg=""):
    """|actual - expected| <= rtol * (|expected| + max|expected|), elementwise.

    The max term is the scale of the whole tensor: float32 results (sums of exponentials,
    gradients with entries near 0) carry an error relative to the largest entry, not each one.
    """
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape, err_msg)
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale, err_msg=err_msg)


# ----------------------------------------------------------------------------- TDT

# Token-and-Duration Transducer (Xu et al. 2023, arXiv 2304.06795), NeMo's convention: a TDT
# lattice is [B, T, U+1, 2 + D]: channel 0 log P(blank | t, u) - sigma, channel 1
# log P(y_{u+1} | t, u) - sigma, channel 2 + i log P(durations[i] | t, u). From (t, u) a blank
# with duration d >= 1 moves to (t + d, u), label y_{u+1} with duration d >= 0 to (t + d, u + 1);
# intermediate nodes need t + d < T_b, and the last emission is a blank landing on t + d == T_b
# at u == U_b.


def tdt_lattice_from_logits(logits, labels, durations, blank=0, sigma=0.0):
    """[B, T, U+1, V + D] logits -> [B, T, U+1, 2 + D] float64 TDT lattice."""
    logits = np.asarray(logits, np.float64)
    num_durations = len(durations)
    vocab = logits.shape[-1] - num_durations
    token = lattice_from_logits(logits[..., :vocab], labels, blank) - sigma
    return np.concatenate([token, log_softmax(logits[..., vocab:])], axis=-1)


def tdt_alpha_beta(lattice_b, num_frames, num_labels, durations):
    """TDT forward/backward variables of one sample, by explicit loops over its nodes.

    alpha[t, u]: log-prob of reaching (t, u) having emitted y_1..y_u.
    beta[t, u]: log-prob of finishing from (t, u), the final blank included.
    Returns alpha, beta and log P(y|x) from the forward direction.
    """
    blank, label = lattice_b[..., 0], lattice_b[..., 1]
    dur = lattice_b[..., 2:]

    def into(alpha, t, u):
        terms = [-np.inf]
        for i, d in enumerate(durations):
            if t - d < 0:
                continue
            if d >= 1:
                terms.append(alpha[t - d, u] + blank[t - d, u] + dur[t - d, u, i])
            if u >= 1:
                terms.append(alpha[t - d, u - 1] + label[t - d, u - 1] + dur[t - d, u - 1, i])
        return terms

    alpha = _forward_table(num_frames, num_labels, into)
    final = [-np.inf]
    for i, d in enumerate(durations):
        t = num_frames - d
        if d >= 1 and t >= 0:
            final.append(alpha[t, num_labels] + blank[t, num_labels] + dur[t, num_labels, i])
    log_p = np.logaddexp.reduce(final)

    def out_of(beta, t, u):
        terms = [-np.inf]
        for i, d in enumerate(durations):
            if d >= 1 and t + d < num_frames:
                terms.append(beta[t + d, u] + blank[t, u] + dur[t, u, i])
            if d >= 1 and t + d == num_frames and u == num_labels:
                terms.append(blank[t, u] + dur[t, u, i])
            if u < num_labels and t + d < num_frames:
                terms.append(beta[t + d, u + 1] + label[t, u] + dur[t, u, i])
        return terms

    return alpha, _backward_table(num_frames, num_labels, out_of), log_p


def tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations, fastemit_lambda=0.0,
                     clamp=-1.0, upstream=None):
    """TDT costs [B] and d (sum_b upstream[b] * cost_b) / d lattice [B, T, U+1, 2 + D], float64.

    The gradient comes from the move posteriors exp(alpha + move score + beta(target) - log P):
    a blank or label channel gets minus the posterior of its moves (all durations), duration
    channel i minus the posterior of the moves with durations[i]. FastEmit scales the label
    channel by (1 + fastemit_lambda) (the duration channels are not scaled, as in NeMo); then,
    when clamp > 0, every channel is clipped to [-clamp, clamp]; the upstream gradient
    multiplies last. A sample without any alignment costs +inf with a zero gradient.
    """
    durations = [int(d) for d in durations]

    def sample(lattice_b, num_frames, num_labels):
        lat = lattice_b[:num_frames, :num_labels + 1]
        alpha, beta, log_p = tdt_alpha_beta(lat, num_frames, num_labels, durations)
        if not np.isfinite(log_p):
            return -log_p, None
        # Both directions must agree: a built-in self-check of the oracle.
        assert np.isclose(beta[0, 0], log_p, rtol=1e-9, atol=1e-9), (beta[0, 0], log_p)
        g = np.zeros_like(lat)
        for t in range(num_frames):
            for u in range(num_labels + 1):
                for i, d in enumerate(durations):
                    dur = lat[t, u, 2 + i]
                    p_blank = 0.0
                    if d >= 1 and t + d < num_frames:
                        p_blank = np.exp(alpha[t, u] + lat[t, u, 0] + dur + beta[t + d, u] - log_p)
                    elif d >= 1 and t + d == num_frames and u == num_labels:
                        p_blank = np.exp(alpha[t, u] + lat[t, u, 0] + dur - log_p)
                    p_label = 0.0
                    if u < num_labels and t + d < num_frames:
                        p_label = np.exp(alpha[t, u] + lat[t, u, 1] + dur + beta[t + d, u + 1]
                                         - log_p)
                    g[t, u, 0] -= p_blank
                    g[t, u, 1] -= (1.0 + fastemit_lambda) * p_label
                    g[t, u, 2 + i] -= p_blank + p_label
        return -log_p, g

    return _batch_loss(np.asarray(lattice, np.float64), logit_lengths, label_lengths, clamp,
                       upstream, sample)


def tdt_logits_grad_from_lattice_grad(logits, labels, lattice_grad, durations, blank=0):
    """Chain rule from d TDT lattice to d logits: the token log-softmax picks over the first V
    logits, the duration log-softmax over the last D."""
    logits = np.asarray(logits, np.float64)
    lattice_grad = np.asarray(lattice_grad, np.float64)
    vocab = logits.shape[-1] - len(durations)
    d_token = logits_grad_from_lattice_grad(logits[..., :vocab], labels, lattice_grad[..., :2],
                                            blank)
    g_dur = lattice_grad[..., 2:]
    probs = np.exp(log_softmax(logits[..., vocab:]))
    d_dur = g_dur - probs * np.sum(g_dur, axis=-1, keepdims=True)
    return np.concatenate([d_token, d_dur], axis=-1)


def tdt_loss(logits, labels, logit_lengths, label_lengths, durations, blank=0, sigma=0.0,
             fastemit_lambda=0.0, clamp=-1.0, upstream=None):
    """TDT costs [B] and d (sum_b upstream[b] * cost_b) / d logits [B, T, U+1, V + D]."""
    lattice = tdt_lattice_from_logits(logits, labels, durations, blank, sigma)
    costs, lattice_grad = tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations,
                                           fastemit_lambda, clamp, upstream)
    return costs, tdt_logits_grad_from_lattice_grad(logits, labels, lattice_grad, durations,
                                                    blank)


def flash_tdt_loss(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths,
                   durations, blank=0, sigma=0.0, activation="tanh", fastemit_lambda=0.0,
                   clamp=-1.0, upstream=None):
    """TDT costs [B] and gradients (encoder, predictor, kernel [H, V + D], bias [V + D]) of
    sum_b upstream[b] * cost_b, through the full joint logits."""
    logits = joint_logits(encoder, predictor, kernel, bias, activation)
    costs, d_logits = tdt_loss(logits, labels, logit_lengths, label_lengths, durations, blank,
                               sigma, fastemit_lambda, clamp, upstream)
    return (costs,) + joint_backward(encoder, predictor, kernel, bias, d_logits, activation)


def float32_tdt_joint_problem(seed, shape, durations, blank=0, ragged=True):
    """float32_joint_problem with a TDT output layer: kernel [H, V + D], bias [V + D]
    (D = len(durations)), labels in [0, V)."""
    batch, max_t, max_u, hidden, vocab = shape
    rng = np.random.default_rng(seed)
    encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths = \
        random_joint_problem(rng, batch, max_t, max_u, hidden, vocab, blank, ragged)
    dur_kernel = rng.normal(0.0, 1.0 / np.sqrt(max(hidden, 1)), size=(hidden, len(durations)))
    dur_bias = rng.normal(0.0, 0.1, size=(len(durations),))
    kernel = np.concatenate([kernel, dur_kernel], axis=1)
    bias = np.concatenate([bias, dur_bias])
    params = [x.astype(np.float32).astype(np.float64) for x in (encoder, predictor, kernel, bias)]
    return (*params, labels, logit_lengths, label_lengths)


def tdt_brute_force_costs(logits, labels, logit_lengths, label_lengths, durations, blank=0,
                          sigma=0.0):
    """TDT costs [B] by enumerating every alignment (tiny cases only).

    Works from probabilities of the logits directly (no lattice, no alpha/beta): each
    alignment is a sequence of (symbol, duration) emissions; its probability is the product of
    P(symbol | t, u) * exp(-sigma) * P(duration | t, u) over its emissions.
    """
    logits = np.asarray(logits, np.float64)
    vocab = logits.shape[-1] - len(durations)
    blank = normalize_blank(blank, vocab)
    token_p = np.exp(log_softmax(logits[..., :vocab]))
    dur_p = np.exp(log_softmax(logits[..., vocab:]))
    costs = np.zeros(logits.shape[0])
    for b in range(logits.shape[0]):
        num_frames, num_labels = int(logit_lengths[b]), int(label_lengths[b])
        total = 0.0
        # Depth-first over partial alignments: (t, u, probability so far).
        stack = [(0, 0, 1.0)]
        while stack:
            t, u, p = stack.pop()
            for i, d in enumerate(durations):
                step = dur_p[b, t, u, i] * np.exp(-sigma)
                if d >= 1:
                    blank_p = p * token_p[b, t, u, blank] * step
                    if t + d == num_frames and u == num_labels:
                        total += blank_p
                    elif t + d < num_frames:
                        stack.append((t + d, u, blank_p))
                if u < num_labels and t + d < num_frames:
                    stack.append((t + d, u + 1, p * token_p[b, t, u, labels[b, u]] * step))
        costs[b] = -np.log(total) if total > 0 else np.inf
    return costs


def random_tdt_problem(rng, batch, max_t, max_u, vocab, durations, blank=0, ragged=True):
    """random_problem with [B, T, U+1, V + D] logits (D = len(durations))."""
    logits, labels, logit_lengths, label_lengths = random_problem(
        rng, batch, max_t, max_u, vocab, blank, ragged)
    dur_logits = rng.normal(0.0, 1.0, size=logits.shape[:3] + (len(durations),))
    return np.concatenate([logits, dur_logits], -1), labels, logit_lengths, label_lengths
