"""Cost and d cost / d lattice of one sample, by column-wise recursions in float64.

The alpha/beta recursions are solved column by column (one column per label position u)
rather than by anti-diagonals: along a column the recursion `alpha[t, u] = logaddexp(
alpha[t-1, u] + blank[t-1, u], alpha[t, u-1] + label[t, u-1])` is a first-order recurrence in t
whose closed form is a cumulative log-sum-exp,

  alpha[:, u] = C[:, u] + cumulative_logsumexp(alpha[:, u-1] + label[:, u-1] - C[:, u]),

with `C` the exclusive cumulative sum of the blank log-probabilities over t (and the mirror
image for beta). Alpha and beta advance together, so that is `U_b` sequential steps of one add
and one cumulative log-sum-exp on a `[2, T_b]` tensor, instead of the `T_b + U_b` steps of an
anti-diagonal recursion (T >> U in speech), which matters on a GPU, where every small op is a
kernel launch. The subtraction of `C` would cost float32 precision at long T, so this part,
which only touches `[T_b, U_b+1]` values, runs in float64 (hence not on TPUs).
"""

import math

import tensorflow as tf

_UNROLL = 8  # lattice recursion steps per while-loop iteration


def lattice_gradients(blank_lp, label_lp, fastemit_lambda):
    """Cost and d cost / d lattice of one sample.

    Args:
      blank_lp: `[T_b, U_b+1]` float32, log P(blank | t, u).
      label_lp: `[T_b, U_b+1]` float32, log P(y_{u+1} | t, u); column U_b is ignored.
      fastemit_lambda: python float; scales the label gradient by (1 + lambda).

    Returns:
      (cost scalar, d cost / d blank_lp `[T_b, U_b+1]`, d cost / d label_lp `[T_b, U_b+1]`),
      float32.
    """
    f64 = tf.float64
    blank = tf.cast(blank_lp, f64)
    label = tf.cast(label_lp, f64)
    num_frames = tf.shape(blank)[0]
    num_labels = tf.shape(blank)[1] - 1
    # blank_prefix[t, u] = sum_{s < t} blank[s, u]
    blank_prefix = tf.cumsum(blank, axis=0, exclusive=True)
    # steps[u] = label[:, u] + blank_prefix[:, u] - blank_prefix[:, u+1] moves column u of
    # z = alpha - blank_prefix to column u+1, and column u+1 of y = beta + blank_prefix to u.
    steps = tf.transpose(blank_prefix[:, :-1] + label[:, :-1] - blank_prefix[:, 1:])  # [U, T]
    # One cumulative_logsumexp per step does both: row 0 carries z forward in u, row 1 carries
    # y backward in u with time reversed (so its reverse cumulative sum is a forward one).
    paired_steps = tf.stack([steps, tf.reverse(steps, [0, 1])], 1)  # [U, 2, T]
    # _UNROLL steps per loop iteration: a loop iteration costs far more executor work than
    # a step. Zero steps pad U up to a multiple; their columns come after both directions'
    # real ones and are cut off below.
    # At least one block: an empty TensorArray with an unknown T cannot be stacked.
    num_blocks = tf.maximum((num_labels + _UNROLL - 1) // _UNROLL, 1)
    blocks = tf.reshape(
        tf.pad(paired_steps, [[0, num_blocks * _UNROLL - num_labels], [0, 0], [0, 0]]),
        [num_blocks, _UNROLL, 2, num_frames])
    first = tf.stack([tf.zeros([num_frames], f64),
                      tf.fill([num_frames], tf.reduce_sum(blank[:, -1]))])
    columns = tf.TensorArray(f64, size=num_blocks, element_shape=[_UNROLL, 2, None])

    def body(block, state, columns):
        states = []
        for step in tf.unstack(blocks[block], num=_UNROLL):
            state = tf.math.cumulative_logsumexp(state + step, axis=1)
            states.append(state)
        return block + 1, state, columns.write(block, tf.stack(states))

    _, _, columns = tf.while_loop(lambda block, *_: block < num_blocks, body,
                                  (tf.constant(0), first, columns), parallel_iterations=2,
                                  name="lattice_recursion")
    columns = tf.concat([first[None], tf.reshape(columns.stack(), [-1, 2, num_frames])], 0)
    columns = columns[:num_labels + 1]  # [U+1, 2, T]: z column u, y column U-u time-reversed
    alpha = tf.transpose(columns[:, 0]) + blank_prefix
    beta = tf.transpose(tf.reverse(columns[:, 1], [0, 1])) - blank_prefix
    log_likelihood = alpha[-1, -1] + blank[-1, -1]

    neg_inf = tf.constant(-math.inf, f64)
    # beta one frame later; past the last frame only (T_b, U_b) is final (log 1 = 0).
    beta_below = tf.concat(
        [beta[1:], tf.concat([tf.fill([num_labels], neg_inf), tf.zeros([1], f64)], 0)[None]], 0)
    beta_right = tf.concat([beta[:, 1:], tf.fill([num_frames, 1], neg_inf)], 1)
    grad_blank = -tf.exp(alpha + blank + beta_below - log_likelihood)
    grad_label = -tf.exp(alpha + label + beta_right - log_likelihood) * (1.0 + fastemit_lambda)
    return (tf.cast(-log_likelihood, tf.float32), tf.cast(grad_blank, tf.float32),
            tf.cast(grad_label, tf.float32))
