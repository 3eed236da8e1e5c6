"""How many samples the sample-wise loss may hold at once: working-set estimate and choice."""

import tensorflow as tf

from tf_rnnt import _contract as contract

#: Default working-set budget of the joint/output/loss part for parallel_iterations="auto".
DEFAULT_MEMORY_BUDGET = contract.DEFAULT_SAMPLEWISE_MEMORY_BUDGET

#: The prebuilt loops "auto" chooses among.
PARALLEL_ITERATIONS_CHOICES = (1, 2, 4, 8, 16, 32, 64)

# Float32 [T_b * (U_b+1), V] and [T_b * (U_b+1), H] buffers counted per iteration (logits,
# probabilities, their gradient and temporaries; joint values and their gradient); measured
# peaks stay below this count.
_VOCAB_BUFFERS = 3
_HIDDEN_BUFFERS = 2
_FLOAT_BYTES = 4


def sample_working_set_bytes(logit_lengths, label_lengths, hidden_size, vocab_size):
    """Estimated peak memory of one loop iteration, for the batch's largest lattice.

    `4 * max_b(T_b * (U_b + 1)) * (3 * V + 2 * H)` bytes: three float32 `[nodes, V]` buffers
    (logits, probabilities / their gradient, a temporary) and two `[nodes, H]` (joint values
    and their gradient).

    Returns:
      float64 scalar tensor (bytes).
    """
    nodes = tf.cast(logit_lengths, tf.int64) * (tf.cast(label_lengths, tf.int64) + 1)
    # An empty batch has no lattice: count one node.
    max_nodes = tf.cast(tf.maximum(tf.reduce_max(nodes), 1), tf.float64)
    width = (_VOCAB_BUFFERS * tf.cast(vocab_size, tf.float64)
             + _HIDDEN_BUFFERS * tf.cast(hidden_size, tf.float64))
    return _FLOAT_BYTES * max_nodes * width


def auto_parallel_iterations(logit_lengths, label_lengths, hidden_size, vocab_size,
                             memory_budget=None):
    """The `parallel_iterations` that `"auto"` picks for a batch.

    Rule: with `working_set = sample_working_set_bytes(...) = 4 * max_b(T_b * (U_b + 1)) *
    (3 * V + 2 * H)` bytes, the choice is the largest P in `PARALLEL_ITERATIONS_CHOICES`
    with `P * working_set <= memory_budget`; 1 when even one sample exceeds the budget.

    Args:
      logit_lengths: `[B]` int, valid frames per sample.
      label_lengths: `[B]` int, valid labels per sample.
      hidden_size: H, the joint width (int or scalar tensor).
      vocab_size: V (int or scalar tensor).
      memory_budget: bytes; None means `DEFAULT_MEMORY_BUDGET`.

    Returns:
      int32 scalar tensor, one of `PARALLEL_ITERATIONS_CHOICES`.
    """
    index = auto_branch_index(logit_lengths, label_lengths, hidden_size, vocab_size,
                               memory_budget)
    return tf.gather(tf.constant(PARALLEL_ITERATIONS_CHOICES, tf.int32), index)


def auto_branch_index(logit_lengths, label_lengths, hidden_size, vocab_size, memory_budget):
    """Index into `PARALLEL_ITERATIONS_CHOICES` of the choice for this batch (int32 tensor)."""
    budget = float(DEFAULT_MEMORY_BUDGET if memory_budget is None else memory_budget)
    working_set = sample_working_set_bytes(logit_lengths, label_lengths, hidden_size,
                                           vocab_size)
    fits = [tf.cast(p * working_set <= budget, tf.int32) for p in PARALLEL_ITERATIONS_CHOICES[1:]]
    # The choices double, so the number of choices above 1 that fit is the index.
    return tf.add_n(fits)
