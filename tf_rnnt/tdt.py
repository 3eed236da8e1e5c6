"""The TDT (Token-and-Duration Transducer) loss, compiled (Xu et al. 2023, arXiv 2304.06795).

Conventions (NeMo's TDT loss): the joint's last axis holds `V` token logits (blank among them)
then `D = len(durations)` duration logits, each normalized by its own log-softmax. From node
`(t, u)` a blank with duration `d >= 1` moves to `(t + d, u)`, label `y_{u+1}` with duration
`d >= 0` to `(t + d, u + 1)`; each move scores `log P(token | t, u) - sigma + log P(d | t, u)`.
Intermediate nodes lie at `t < logit_lengths[b]`; the last emission is a blank landing exactly
on `t + d == logit_lengths[b]` after all labels. A TDT lattice is `[B, T, U+1, 2 + D]` float32:
`log P(blank) - sigma`, `log P(y_{u+1}) - sigma`, then `log P(durations[i])`.
"""

import numbers

import tensorflow as tf

from tf_rnnt import _contract as contract
from tf_rnnt import _loader
from tf_rnnt import ops as _ops
from tf_rnnt import reference as _reference

__all__ = ["flash_tdt_loss", "tdt_lattice_loss", "tdt_loss"]


def tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations, fastemit_lambda=0.0,
                     clamp=-1.0):
    """Exact TDT loss of a `[B, T, U+1, 2 + D]` lattice.

    Alpha/beta recursions in log space; the registered gradient is d cost / d lattice, computed
    in the same op and scaled by the upstream gradient. Nodes outside each sample's
    `(logit_length, label_length + 1)` rectangle are never read and get a zero gradient.

    Args:
      lattice: `[B, T, U+1, 2 + D]` float32 (float16/bfloat16 are cast):
        `log P(blank|t,u) - sigma`, `log P(y_{u+1}|t,u) - sigma`, `log P(durations[i]|t,u)`.
      logit_lengths: `[B]` int32/int64 in `[1, T]`.
      label_lengths: `[B]` int32/int64 in `[0, U]`.
      durations: `D` strictly increasing non-negative ints containing 1 (a 0 comes first),
        e.g. `[0, 1, 2, 3, 4]`; at most 64.
      fastemit_lambda: FastEmit weight: the label channel's gradient is scaled by
        `1 + fastemit_lambda` (the duration channels' are not, as in NeMo); the cost is
        unchanged.
      clamp: clamps every channel of d cost / d lattice to `[-clamp, clamp]`; off when <= 0.

    Returns:
      `[B]` float32 costs, `-log P(y|x)`; `+inf` (with a zero gradient) for a sample without
      any alignment (durations without 0 and `logit_length <= label_length`).
    """
    return _tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations, fastemit_lambda,
                             clamp, "tf_rnnt.tdt_lattice_loss")


def _tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations, fastemit_lambda, clamp,
                      owner):
    durations = contract.check_durations(durations, owner)
    fastemit_lambda = contract.check_fastemit_lambda(fastemit_lambda, owner)
    clamp = contract.check_clamp(clamp, owner)
    lattice = contract.float_tensor(lattice, "lattice", owner)
    lattice = tf.cast(lattice, tf.float32)
    channels = contract.static_dim(lattice, 3)
    if channels is not None and channels != 2 + len(durations):
        raise ValueError(f"{owner}: lattice must have shape [B, T, U+1, 2 + D] with "
                         f"D = len(durations) = {len(durations)}, got {lattice.shape}")
    logit_lengths, label_lengths = contract.lattice_lengths(lattice, logit_lengths, label_lengths,
                                                           owner)
    if _ops._xla_fallback("tdt_lattice_loss", "tf_rnnt.tdt_loss",
                          "Lengths are not validated there."):
        return _reference.tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations,
                                           fastemit_lambda, clamp)
    costs, _ = _loader.load().tf_rnnt_tdt_lattice_loss(
        lattice, logit_lengths, label_lengths, logit_lengths, label_lengths,
        durations=list(durations), fastemit_lambda=fastemit_lambda, clamp=clamp)
    return costs


@tf.RegisterGradient("TfRnntTdtLatticeLoss")
def _tdt_lattice_loss_grad(op, d_costs, unused_d_grads):
    # The op's second output is d cost / d lattice; its own derivative is not computed, so
    # differentiating it again must fail rather than give zeros.
    grads, = contract.first_order_only([op.outputs[1]],
                                       "tf_rnnt.tdt_lattice_loss (and tdt_loss)")
    return [grads * d_costs[:, None, None, None], None, None, None, None]


def _check_seed(seed, owner):
    if seed is None or tf.is_tensor(seed):
        return seed
    values = list(seed) if hasattr(seed, "__iter__") else None
    if (values is None or len(values) != 2
            or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in values)):
        raise ValueError(f"{owner}: seed must be None or a pair of ints (a stateless seed), "
                         f"got {seed!r}")
    return tf.constant(values, tf.int64)


def _tdt_options(durations, sigma, fastemit_lambda, clamp, omega, seed, owner):
    """The TDT losses' options, checked: `(durations, sigma, fastemit_lambda, clamp, omega,
    seed)`."""
    return (contract.check_durations(durations, owner),
            contract.check_nonnegative_number(sigma, "sigma", owner),
            contract.check_fastemit_lambda(fastemit_lambda, owner),
            contract.check_clamp(clamp, owner),
            contract.check_probability(omega, "omega", owner), _check_seed(seed, owner))


def with_omega(omega, seed, tdt, rnnt):
    """`tdt()`, or with probability `omega` `rnnt()` (NeMo's omega): one draw per call,
    `tf.random.stateless_uniform([], seed)` for a seed pair, else `tf.random.uniform([])`."""
    if omega == 0.0:
        return tdt()
    if omega == 1.0:
        return rnnt()
    draw = tf.random.uniform([]) if seed is None else tf.random.stateless_uniform([], seed)
    return tf.cond(draw < omega, rnnt, tdt)


def subtract_sigma(lattice, sigma, num_durations):
    """A `[B, T, U+1, 2 + D]` joint lattice with `sigma` taken off its two token channels (the
    duration channels unchanged), as `tdt_lattice_loss` reads it."""
    if not sigma:
        return lattice
    return lattice - tf.constant([sigma, sigma] + [0.0] * num_durations, tf.float32)


def tdt_loss(logits, labels, logit_lengths, label_lengths, durations, blank=0, sigma=0.0,
             fastemit_lambda=0.0, clamp=-1.0, omega=0.0, seed=None):
    """TDT loss on full logits `[B, T, U+1, V + D]`, costs `[B]`.

    The token log-softmax picks (blank and the next label) run in the compiled
    `logits_to_lattice` kernels on the first `V = logits.shape[-1] - len(durations)` logits;
    the duration log-softmax over the last `D` logits is plain TensorFlow (float32); both feed
    the compiled TDT lattice loss (`tdt_lattice_loss`). The logits are split once (a copy of
    the token logits), and their gradient is one `[B, T, U+1, V + D]` tensor in their dtype.

    Args:
      logits: `[B, T, U+1, V + D]` float32/float16/bfloat16 (reduced in float32): `V` token
        logits then `D` duration logits.
      labels: `[B, U]` int32/int64 in `[0, V)` and not blank within label_lengths.
      logit_lengths: `[B]` int in `[1, T]`.
      label_lengths: `[B]` int in `[0, U]`.
      durations: strictly increasing non-negative ints containing 1 (a 0 comes first), e.g.
        `[0, 1, 2, 3, 4]`, `[0, 1]` or `[1, 2]`; at most 64.
      blank: blank index among the `V` token logits, in `[-V, V)`; negative counts from the end
        of the token logits (so -1 is the last token logit, not a duration logit).
      sigma: logit under-normalization (>= 0), subtracted from every token log-probability the
        loss uses (NeMo's `sigma`, 0.05 in the paper).
      fastemit_lambda: FastEmit weight (label channel of d cost / d lattice; see
        `tdt_lattice_loss`).
      clamp: clamp of d cost / d lattice (every channel); off when <= 0.
      omega: probability (in `[0, 1]`) that a call computes the plain RNN-T loss
        (`tf_rnnt.rnnt_loss`, without sigma, with fastemit_lambda and clamp) on the token logits
        instead, for the whole batch; the duration logits then get a zero gradient (NeMo's
        `omega`). 0 always computes the TDT loss, 1 always the RNN-T loss.
      seed: with `0 < omega < 1`, the draw is `tf.random.stateless_uniform([], seed)` when
        `seed` is a pair of ints (or an int tensor of shape `[2]`), so a run repeats exactly
        for the same seed; with None it is `tf.random.uniform([])`, an op-level random draw
        that follows `tf.random.set_seed` (a new draw at each call or step).

    Returns:
      `[B]` float32 costs, `-log P(y|x)`.

    Example:
      >>> costs = tf_rnnt.tdt_loss(logits, labels, t_len, u_len, durations=[0, 1, 2, 3, 4],
      ...                          blank=-1, sigma=0.05)
    """
    owner = "tf_rnnt.tdt_loss"
    durations, sigma, fastemit_lambda, clamp, omega, seed = _tdt_options(
        durations, sigma, fastemit_lambda, clamp, omega, seed, owner)
    logits = contract.float_tensor(logits, "logits", owner)
    num_durations = len(durations)
    last = contract.static_dim(logits, 3)
    if last is not None and last <= num_durations:
        raise ValueError(f"{owner}: logits must have shape [B, T, U+1, V + D] with V >= 1 token "
                         f"logits and D = len(durations) = {num_durations} duration logits, "
                         f"got {logits.shape}")
    vocab_size = None if last is None else last - num_durations
    blank = contract.check_blank(blank, owner, vocab_size)
    label_lengths = contract.int32_tensor(label_lengths, "label_lengths", owner)
    if vocab_size is None:
        vocab = tf.shape(logits)[-1] - num_durations
        check = tf.debugging.assert_positive(
            vocab, message=f"{owner}: logits must have V + D = V + {num_durations} entries on "
                           "the last axis with V >= 1 token logits")
        with tf.control_dependencies([check]):
            sizes = tf.stack([tf.identity(vocab), num_durations])
    else:
        sizes = [vocab_size, num_durations]
    token_logits, duration_logits = tf.split(logits, sizes, axis=-1, num=2)

    def tdt():
        token = _ops._logits_to_lattice(token_logits, labels, blank, label_lengths, owner)
        duration = tf.nn.log_softmax(tf.cast(duration_logits, tf.float32), axis=-1)
        lattice = tf.concat([token - sigma, duration], axis=-1)
        return _tdt_lattice_loss(lattice, logit_lengths, label_lengths, durations,
                                 fastemit_lambda, clamp, owner)

    def rnnt():
        return _ops.rnnt_loss(token_logits, labels, logit_lengths, label_lengths, blank,
                              fastemit_lambda, clamp)

    return with_omega(omega, seed, tdt, rnnt)


def flash_tdt_loss(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths,
                   durations, blank=0, sigma=0.0, activation="tanh", mode="tiled", tile_size=None,
                   memory_budget=None, fastemit_lambda=0.0, clamp=-1.0, omega=0.0, seed=None,
                   gpu_kernel="auto"):
    """Flash TDT loss: the fused, tiled TDT joint and the TDT lattice loss, costs `[B]`.

    The output layer `kernel [H, V + D]`, `bias [V + D]` gives `V` token logits (blank among
    them) and `D = len(durations)` duration logits of `h = act(encoder[b, t] + predictor[b, u])`.
    `joint_lattice` computes them tile by tile with the log-sum-exp over the token logits and a
    separate log-softmax over the duration logits, keeping per node only the `2 + D` lattice
    channels (blank, next label, durations) and the token log-sum-exp; the backward pass
    recomputes each tile. Neither the `[B, T, U+1, V + D]` logits nor their gradient exist at
    once. The lattice feeds `tdt_lattice_loss`, with `sigma` subtracted from its two token
    channels. On Hopper the duration head runs in the cuBLAS path (`gpu_kernel="auto"` picks
    it; "fused" raises InvalidArgumentError).

    Args:
      encoder: `[B, T, H]` projected encoder output (float32/float16/bfloat16).
      predictor: `[B, U+1, H]` projected predictor output, same dtype.
      kernel: `[H, V + D]` output layer: `V` token columns, then `D` duration columns.
      bias: `[V + D]`.
      labels: `[B, U]` int, in `[0, V)` and != blank within label_lengths.
      logit_lengths: `[B]` int in `[1, T]`.
      label_lengths: `[B]` int in `[0, U]`.
      durations: strictly increasing non-negative ints containing 1 (a 0 comes first), e.g.
        `[0, 1, 2, 3, 4]`; at most 64.
      blank: blank index among the `V` token columns, in `[-V, V)`.
      sigma: logit under-normalization (>= 0), as in `tdt_loss`.
      activation, mode, tile_size, memory_budget, gpu_kernel: as in `tf_rnnt.joint_lattice`.
      fastemit_lambda, clamp: as in `tdt_lattice_loss`.
      omega, seed: as in `tdt_loss`; the RNN-T branch is `flash_rnnt_loss` on the token columns.

    Returns:
      `[B]` float32 costs, `-log P(y|x)`.

    Example:
      >>> costs = tf_rnnt.flash_tdt_loss(enc, pred, kernel, bias, labels, t_len, u_len,
      ...                                durations=[0, 1, 2, 3, 4], sigma=0.05)
    """
    owner = "tf_rnnt.flash_tdt_loss"
    durations, sigma, fastemit_lambda, clamp, omega, seed = _tdt_options(
        durations, sigma, fastemit_lambda, clamp, omega, seed, owner)
    kernel = contract.float_tensor(kernel, "kernel", owner)
    bias = contract.float_tensor(bias, "bias", owner)
    joint = dict(blank=blank, activation=activation, mode=mode, tile_size=tile_size,
                 memory_budget=memory_budget, gpu_kernel=gpu_kernel, owner=owner)

    def tdt():
        lattice = _ops._joint_lattice(encoder, predictor, kernel, bias, labels, logit_lengths,
                                      label_lengths, durations=durations, **joint)
        return _tdt_lattice_loss(subtract_sigma(lattice, sigma, len(durations)), logit_lengths,
                                 label_lengths, durations, fastemit_lambda, clamp, owner)

    def rnnt():  # the token columns alone
        num_durations = len(durations)
        lattice = _ops._joint_lattice(encoder, predictor, kernel[:, :-num_durations],
                                      bias[:-num_durations], labels, logit_lengths,
                                      label_lengths, **joint)
        return _ops._lattice_loss(lattice, logit_lengths, label_lengths, fastemit_lambda, clamp,
                                  owner)

    return with_omega(omega, seed, tdt, rnnt)
