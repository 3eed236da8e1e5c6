"""Pure-TensorFlow RNN-T loss: the oracle for every compiled op.

This is what a TensorFlow user writes today: the full `[B, T, U+1, V]`
log-softmax, then the forward (alpha) recursion over the lattice, and
TensorFlow's autodiff for the gradient. It imports nothing from the compiled
ops, so tests can check every hand-written gradient against it.

FastEmit and the gradient clamp change the gradient, not the cost. They are
expressed with autodiff too: an inner tape gives d cost / d lattice, which is
then scaled and clamped exactly as the ops document. That inner tape runs in the
backward pass, so higher-order derivatives are those of the scaled, clamped gradient.

Every function traces with unknown shapes. The losses check their lengths at run time
(`logit_lengths` in `[1, T]`, `label_lengths` in `[0, U]`, one per sample) and raise
InvalidArgumentError; labels are not checked (padded entries may hold any value, and
values outside `[0, V)` are clipped into it).
"""

import tensorflow as tf

from tf_rnnt import _contract as contract

__all__ = ["rnnt_loss", "lattice_from_logits", "lattice_loss", "joint_logits", "joint_lattice",
           "flash_rnnt_loss", "tdt_lattice_from_logits", "tdt_lattice_loss", "tdt_loss",
           "flash_tdt_loss"]

_OWNER = "tf_rnnt.reference"


def lattice_from_logits(logits, labels, blank=0):
    """Picks `[B, T, U+1, 2]` log-probabilities out of a full log_softmax.

    Args:
      logits: `[B, T, U+1, V]` float.
      labels: `[B, U]` int; padded entries may hold any value in `[0, V)`.
      blank: blank index, negative counts from the end.

    Returns:
      `[B, T, U+1, 2]` float32: channel 0 is log P(blank), channel 1 log P(y_{u+1})
      (0 at u = U).
    """
    return _token_picks(tf.cast(logits, tf.float32), labels, blank)


def _token_picks(logits, labels, blank):
    """lattice_from_logits in the logits' dtype."""
    vocab_size = contract.static_dim(logits, -1) if logits.shape.rank else None
    if vocab_size is None:
        vocab_size = tf.shape(logits)[-1]
    blank = contract.normalized_blank(contract.check_blank(blank, _OWNER), vocab_size, _OWNER)
    log_probs = tf.nn.log_softmax(logits, axis=-1)
    labels = contract.int32_tensor(labels, "labels", _OWNER)
    blank_lp = tf.gather(log_probs, blank, axis=-1)
    # Pad labels with one entry for u = U, whose pick is masked to 0 below.
    labels_ext = tf.pad(labels, [[0, 0], [0, 1]])
    labels_ext = tf.clip_by_value(labels_ext, 0, vocab_size - 1)
    labels_bt = tf.broadcast_to(labels_ext[:, None, :], tf.shape(log_probs)[:3])
    label_lp = tf.gather(log_probs, labels_bt, axis=-1, batch_dims=3)
    u_plus_1 = tf.shape(labels)[1] + 1
    not_last = tf.sequence_mask(u_plus_1 - 1, u_plus_1)
    label_lp = tf.where(not_last[None, None, :], label_lp, tf.zeros_like(label_lp))
    return tf.stack([blank_lp, label_lp], axis=-1)


# A large finite stand-in for log(0): unlike -inf it keeps autodiff free of 0 * inf = NaN.
_LOG_ZERO = -1e30


def _skewed_lattice(lattice, logit_lengths, label_lengths):
    """A `[B, T, U+1, C]` lattice laid out by anti-diagonal n = t + u, with checked lengths.

    Returns:
        `(batch, max_u1, logit_lengths, label_lengths, skewed, on_lattice)`: `skewed[n, b, u]`
        is `lattice[b, n - u, u]` (`[N, B, U+1, C]`, `_LOG_ZERO` off the lattice) and
        `on_lattice[n, u]` says whether `(n - u, u)` is a lattice node.
    """
    shape = tf.shape(lattice)
    batch, max_t, max_u1 = shape[0], shape[1], shape[2]
    logit_lengths, label_lengths = _checked_lengths(logit_lengths, label_lengths, batch, max_t,
                                                    max_u1 - 1)
    num_diagonals = max_t + max_u1 - 1
    diag = tf.range(num_diagonals)[:, None]
    u_index = tf.range(max_u1)[None, :]
    t_index = diag - u_index
    on_lattice = (t_index >= 0) & (t_index < max_t)
    gather_index = tf.stack([tf.clip_by_value(t_index, 0, max_t - 1),
                             tf.broadcast_to(u_index, tf.shape(t_index))], axis=-1)
    skewed = tf.gather_nd(
        lattice,
        tf.broadcast_to(gather_index[None], [batch, num_diagonals, max_u1, 2]),
        batch_dims=1,
    )  # [B, N, U+1, C]
    skewed = tf.where(on_lattice[None, :, :, None], skewed, _LOG_ZERO)
    skewed = tf.transpose(skewed, [1, 0, 2, 3])  # [N, B, U+1, C]
    return batch, max_u1, logit_lengths, label_lengths, skewed, on_lattice


def _alpha_cost(lattice, logit_lengths, label_lengths):
    """-log P(y|x) per sample by the alpha recursion (Graves 2012, eq. 16-18).

    The recursion runs over anti-diagonals n = t + u, so each of the T + U steps
    is one vectorized update:
    alpha[t, u] = logaddexp(alpha[t-1, u] + blank[t-1, u], alpha[t, u-1] + label[t, u-1]).
    """
    lattice = tf.convert_to_tensor(lattice, tf.float32)
    batch, max_u1, logit_lengths, label_lengths, skewed, on_lattice = _skewed_lattice(
        lattice, logit_lengths, label_lengths)

    def step(alpha_diag, inputs):
        lattice_diag, on_next = inputs
        from_blank = alpha_diag + lattice_diag[..., 0]
        from_label = alpha_diag + lattice_diag[..., 1]
        from_label = tf.pad(from_label[:, :-1], [[0, 0], [1, 0]], constant_values=_LOG_ZERO)
        next_diag = tf.reduce_logsumexp(tf.stack([from_blank, from_label], 0), 0)
        return tf.where(on_next[None, :], next_diag, _LOG_ZERO)

    alpha0 = tf.tile(tf.concat([[0.0], tf.fill([max_u1 - 1], _LOG_ZERO)], 0)[None], [batch, 1])
    alphas = tf.scan(step, (skewed[:-1], on_lattice[1:]), initializer=alpha0)
    alphas = tf.concat([alpha0[None], alphas], 0)  # [N, B, U+1]
    final_diag = logit_lengths - 1 + label_lengths
    final = tf.stack([final_diag, tf.range(batch), label_lengths], axis=1)
    return -(tf.gather_nd(alphas, final) + tf.gather_nd(skewed[..., 0], final))


def _checked_lengths(logit_lengths, label_lengths, batch, max_t, max_u):
    """int32 lengths with run-time checks: one per sample, in `[1, T]` and `[0, U]`."""
    logit_lengths = contract.int32_tensor(logit_lengths, "logit_lengths", _OWNER)
    label_lengths = contract.int32_tensor(label_lengths, "label_lengths", _OWNER)
    checks = [
        tf.debugging.assert_equal(tf.size(logit_lengths), batch,
                                  message=f"{_OWNER}: logit_lengths needs one entry per sample"),
        tf.debugging.assert_equal(tf.size(label_lengths), batch,
                                  message=f"{_OWNER}: label_lengths needs one entry per sample"),
        tf.debugging.assert_greater_equal(logit_lengths, 1,
                                          message=f"{_OWNER}: logit_lengths must be >= 1"),
        tf.debugging.assert_less_equal(logit_lengths, max_t,
                                       message=f"{_OWNER}: logit_lengths must be <= T"),
        tf.debugging.assert_greater_equal(label_lengths, 0,
                                          message=f"{_OWNER}: label_lengths must be >= 0"),
        tf.debugging.assert_less_equal(label_lengths, max_u,
                                       message=f"{_OWNER}: label_lengths must be <= U"),
    ]
    with tf.control_dependencies(checks):
        return tf.identity(logit_lengths), tf.identity(label_lengths)


def _shaped_gradient_cost(lattice, logit_lengths, label_lengths, fastemit_lambda, clamp):
    """Cost whose gradient is FastEmit-scaled and clamped per sample."""

    @tf.custom_gradient
    def cost_fn(lat):
        def backward(upstream):
            # In the backward pass, so that a tape around it sees how grad depends on lat.
            with tf.GradientTape() as tape:
                tape.watch(lat)
                total = tf.reduce_sum(_alpha_cost(lat, logit_lengths, label_lengths))
            grad = tape.gradient(total, lat)  # per-sample d cost_b / d lattice_b
            grad = tf.where(tf.math.is_nan(grad), tf.zeros_like(grad), grad)
            grad = grad * tf.constant([1.0, 1.0 + fastemit_lambda], tf.float32)
            if clamp > 0:
                grad = tf.clip_by_value(grad, -clamp, clamp)
            return grad * tf.reshape(upstream, [-1, 1, 1, 1])

        return _alpha_cost(lat, logit_lengths, label_lengths), backward

    return cost_fn(lattice)


def lattice_loss(lattice, logit_lengths, label_lengths, fastemit_lambda=0.0, clamp=-1.0):
    """Reference `tf_rnnt.lattice_loss`: costs `[B]` from a `[B, T, U+1, 2]` lattice."""
    lattice = tf.convert_to_tensor(lattice, tf.float32)
    fastemit_lambda = contract.check_fastemit_lambda(fastemit_lambda, _OWNER)
    clamp = contract.check_clamp(clamp, _OWNER)
    if fastemit_lambda == 0.0 and clamp <= 0:
        return _alpha_cost(lattice, logit_lengths, label_lengths)
    return _shaped_gradient_cost(lattice, logit_lengths, label_lengths, fastemit_lambda, clamp)


def rnnt_loss(logits, labels, logit_lengths, label_lengths, blank=0, fastemit_lambda=0.0,
              clamp=-1.0):
    """Reference RNN-T loss on full logits.

    Args:
      logits: `[B, T, U+1, V]` float32/float16/bfloat16 (computed in float32).
      labels: `[B, U]` int32/int64.
      logit_lengths: `[B]` int, valid frames per sample.
      label_lengths: `[B]` int, valid labels per sample.
      blank: blank index; negative counts from the end.
      fastemit_lambda: FastEmit regularization weight.
      clamp: clamp of d cost / d lattice; off when <= 0.

    Returns:
      `[B]` float32 costs, -log P(y|x).
    """
    lattice = lattice_from_logits(logits, labels, blank)
    return lattice_loss(lattice, logit_lengths, label_lengths, fastemit_lambda, clamp)


def joint_logits(encoder, predictor, kernel, bias, activation="tanh"):
    """Full joint: `act(encoder[:, :, None] + predictor[:, None]) @ kernel + bias`.

    Args:
      encoder: `[B, T, H]`.
      predictor: `[B, U+1, H]`.
      kernel: `[H, V]`.
      bias: `[V]`.
      activation: "tanh", "relu" or "identity".

    Returns:
      `[B, T, U+1, V]` logits in the inputs' dtype.
    """
    contract.check_choice(activation, contract.ACTIVATION_NAMES, "activation", _OWNER)
    act, _ = contract.ACTIVATIONS[activation]
    hidden = act(encoder[:, :, None, :] + predictor[:, None, :, :])
    return tf.einsum("btuh,hv->btuv", hidden, kernel) + bias


def joint_lattice(encoder, predictor, kernel, bias, labels, blank=0, activation="tanh"):
    """Reference `tf_rnnt.joint_lattice` (lengths only matter to the loss)."""
    return lattice_from_logits(joint_logits(encoder, predictor, kernel, bias, activation), labels,
                               blank)


def flash_rnnt_loss(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths, blank=0,
                    activation="tanh", fastemit_lambda=0.0, clamp=-1.0):
    """Reference `tf_rnnt.flash_rnnt_loss`: full joint, full logits, autodiff."""
    logits = joint_logits(encoder, predictor, kernel, bias, activation)
    return rnnt_loss(logits, labels, logit_lengths, label_lengths, blank, fastemit_lambda, clamp)


# ------------------------------------------------------------------------------------------
# TDT (Token-and-Duration Transducer, Xu et al. 2023).
# ------------------------------------------------------------------------------------------
def _tdt_dtype(x):
    """The TDT reference computes in float64 for float64 inputs, else in float32."""
    return tf.float64 if x.dtype == tf.float64 else tf.float32


def tdt_lattice_from_logits(logits, labels, durations, blank=0, sigma=0.0):
    """`[B, T, U+1, V + D]` logits -> `[B, T, U+1, 2 + D]` TDT lattice (float64 for float64
    logits, else float32).

    Channels: log P(blank) - sigma and log P(y_{u+1}) - sigma from the log_softmax of the first
    `V` logits (the label channel is -sigma at u = U), then log P(durations[i]) from the
    log_softmax of the last `D = len(durations)` logits.
    """
    durations = contract.check_durations(durations, _OWNER)
    sigma = contract.check_nonnegative_number(sigma, "sigma", _OWNER)
    logits = tf.convert_to_tensor(logits)
    logits = tf.cast(logits, _tdt_dtype(logits))
    num_durations = len(durations)
    vocab_size = tf.shape(logits)[-1] - num_durations
    token = _token_picks(logits[..., :vocab_size], labels, blank) - sigma
    return tf.concat([token, tf.nn.log_softmax(logits[..., vocab_size:], axis=-1)], axis=-1)


def _tdt_alpha_cost(lattice, logit_lengths, label_lengths, durations):
    """-log P(y|x) per sample of a TDT lattice by the alpha recursion over anti-diagonals.

    A move of duration d from (t, u) lands d (blank) or d + 1 (label) diagonals later, so every
    node depends on earlier diagonals only. Each scan step takes the finished diagonal n and
    pushes its moves into a window of the next max(durations) + 1 diagonals' partial sums.
    """
    dtype = lattice.dtype
    batch, max_u1, logit_lengths, label_lengths, skewed, on_lattice = _skewed_lattice(
        lattice, logit_lengths, label_lengths)
    window = durations[-1] + 1
    log_zero = tf.fill([batch, max_u1], tf.constant(_LOG_ZERO, dtype))

    def step(carry, inputs):
        partial, unused_alpha = carry  # partial: [window, B, U+1], diagonals n .. n + window - 1
        lattice_diag, on_diag = inputs
        alpha = tf.where(on_diag[None, :], partial[0], _LOG_ZERO)
        pushed = [[] for _ in range(window + 1)]
        for i, d in enumerate(durations):
            score = alpha + lattice_diag[..., 2 + i]
            if d >= 1:
                pushed[d].append(score + lattice_diag[..., 0])
            label = score + lattice_diag[..., 1]
            pushed[d + 1].append(tf.pad(label[:, :-1], [[0, 0], [1, 0]],
                                        constant_values=_LOG_ZERO))
        rows = []
        for k in range(1, window + 1):
            terms = pushed[k] + [partial[k] if k < window else log_zero]
            rows.append(tf.reduce_logsumexp(tf.stack(terms, 0), 0))
        return tf.stack(rows, 0), alpha

    first = tf.concat([tf.zeros([batch, 1], dtype), log_zero[:, 1:]], 1)
    partial0 = tf.concat([first[None], tf.fill([window - 1, batch, max_u1],
                                                tf.constant(_LOG_ZERO, dtype))], 0)
    _, alphas = tf.scan(step, (skewed, on_lattice), initializer=(partial0, log_zero))
    # alphas: [N, B, U+1]. The last emission is a blank of duration d >= 1 from (T_b - d, U_b).
    batch_index = tf.range(batch)
    finals = []
    for i, d in enumerate(durations):
        if d < 1:
            continue
        t0 = logit_lengths - d
        t_safe = tf.maximum(t0, 0)
        alpha = tf.gather_nd(alphas, tf.stack([t_safe + label_lengths, batch_index,
                                               label_lengths], 1))
        node = tf.gather_nd(lattice, tf.stack([batch_index, t_safe, label_lengths], 1))
        finals.append(tf.where(t0 >= 0, alpha + node[:, 0] + node[:, 2 + i], _LOG_ZERO))
    return -tf.reduce_logsumexp(tf.stack(finals, 0), 0)


def tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations, fastemit_lambda=0.0,
                     clamp=-1.0):
    """Reference `tf_rnnt.tdt_lattice_loss`: costs `[B]` of a `[B, T, U+1, 2 + D]` TDT lattice.

    FastEmit scales d cost / d lattice's label channel by `1 + fastemit_lambda` (not the
    duration channels); clamp clips every channel of it to `[-clamp, clamp]`. The cost is
    unchanged by both. A sample without any alignment gets a cost of about 1e30 here (the
    compiled op returns +inf). Computes in float64 for a float64 lattice, else in float32.
    """
    durations = contract.check_durations(durations, _OWNER)
    fastemit_lambda = contract.check_fastemit_lambda(fastemit_lambda, _OWNER)
    clamp = contract.check_clamp(clamp, _OWNER)
    lattice = tf.convert_to_tensor(lattice)
    lattice = tf.cast(lattice, _tdt_dtype(lattice))

    def cost(lat):
        return _tdt_alpha_cost(lat, logit_lengths, label_lengths, durations)

    if fastemit_lambda == 0.0 and clamp <= 0:
        return cost(lattice)

    @tf.custom_gradient
    def cost_fn(lat):
        def backward(upstream):
            with tf.GradientTape() as tape:
                tape.watch(lat)
                total = tf.reduce_sum(cost(lat))
            grad = tape.gradient(total, lat)
            grad = tf.where(tf.math.is_nan(grad), tf.zeros_like(grad), grad)
            scale = tf.constant([1.0, 1.0 + fastemit_lambda] + [1.0] * len(durations),
                                lat.dtype)
            grad = grad * scale
            if clamp > 0:
                grad = tf.clip_by_value(grad, -clamp, clamp)
            return grad * tf.reshape(upstream, [-1, 1, 1, 1])

        return cost(lat), backward

    return cost_fn(lattice)


def tdt_loss(logits, labels, logit_lengths, label_lengths, durations, blank=0, sigma=0.0,
             fastemit_lambda=0.0, clamp=-1.0):
    """Reference TDT loss on full logits (no `omega`: always the TDT loss).

    Args:
      logits: `[B, T, U+1, V + D]` float64 (computed in float64) or float32/float16/bfloat16
        (computed in float32): `V` token logits, then `D = len(durations)` duration logits.
      labels: `[B, U]` int32/int64.
      logit_lengths: `[B]` int, valid frames per sample.
      label_lengths: `[B]` int, valid labels per sample.
      durations: strictly increasing non-negative ints containing 1, e.g. `[0, 1, 2, 3, 4]`.
      blank: blank index in `[-V, V)`; negative counts from the end of the `V` token logits.
      sigma: logit under-normalization, subtracted from every token log-probability.
      fastemit_lambda: FastEmit weight (label channel of d cost / d lattice).
      clamp: clamp of d cost / d lattice; off when <= 0.

    Returns:
      `[B]` costs, -log P(y|x): float64 for float64 logits, else float32.
    """
    lattice = tdt_lattice_from_logits(logits, labels, durations, blank, sigma)
    return tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations, fastemit_lambda,
                            clamp)


def flash_tdt_loss(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths,
                   durations, blank=0, sigma=0.0, activation="tanh", fastemit_lambda=0.0,
                   clamp=-1.0):
    """Reference `tf_rnnt.flash_tdt_loss`: full joint, full `[B, T, U+1, V + D]` logits,
    autodiff (no `omega`)."""
    logits = joint_logits(encoder, predictor, kernel, bias, activation)
    return tdt_loss(logits, labels, logit_lengths, label_lengths, durations, blank, sigma,
                    fastemit_lambda, clamp)
