"""The padded-node convention of `RNNTJoint`'s lattice (see the `tf_rnnt.keras` docstring):
nodes outside a sample's valid rectangle hold `PAD_NODE_VALUE`, which `FlashRNNTLoss` reads the
lengths back from.

Public through `tf_rnnt.keras`: `PAD_NODE_VALUE`, `mark_lattice_padding`, `lattice_lengths`.
"""

import tensorflow as tf

# Written into lattice nodes outside a sample's rectangle: log-probabilities are <= 0.
PAD_NODE_VALUE = 1.0
# Anything above this is a padded node; NaN compares False and so stays a real node.
PAD_THRESHOLD = 0.5
# The blank code in the label channel at u = U is BLANK_CODE + blank (above any marking).
BLANK_CODE = 2.0


def mark_lattice_padding(lattice, logit_lengths, label_lengths):
    """Writes `PAD_NODE_VALUE` into the nodes outside each sample's valid rectangle.

    Args:
      lattice: `[B, T, U+1, 2]` float32 lattice.
      logit_lengths: `[B]` int, valid frames per sample.
      label_lengths: `[B]` int, valid labels per sample.

    Returns:
      `[B, T, U+1, 2]` float32: `lattice` on nodes `t < logit_lengths[b]`,
      `u <= label_lengths[b]`, `PAD_NODE_VALUE` (with zero gradient) elsewhere.

    Example:

    ```python
    lattice = tf_rnnt.logits_to_lattice(logits, labels)
    y_pred = tf_rnnt.keras.mark_lattice_padding(lattice, logit_lengths, label_lengths)
    costs = tf_rnnt.keras.FlashRNNTLoss(reduction="none")(padded_labels, y_pred)
    ```
    """
    lattice = tf.convert_to_tensor(lattice, tf.float32)
    shape = tf.shape(lattice)
    frame_valid = tf.sequence_mask(tf.cast(logit_lengths, tf.int32), shape[1])
    node_valid = tf.sequence_mask(tf.cast(label_lengths, tf.int32) + 1, shape[2])
    valid = frame_valid[:, :, None, None] & node_valid[:, None, :, None]
    return tf.where(valid, lattice, tf.constant(PAD_NODE_VALUE, tf.float32))


def lattice_lengths(lattice):
    """Reads `(logit_lengths, label_lengths)` back from a lattice marked by `RNNTJoint`.

    Args:
      lattice: `[B, T, U+1, 2]` lattice following the padded-node convention.

    Returns:
      `logit_lengths` `[B]` int32 (frames whose node u = 0 is real) and `label_lengths`
      `[B]` int32 (real nodes of frame 0, minus one; -1 for a sample without frames).
    """
    is_pad = tf.convert_to_tensor(lattice)[..., 0] > PAD_THRESHOLD  # [B, T, U+1]
    logit_lengths = tf.reduce_sum(tf.cast(~is_pad[:, :, 0], tf.int32), axis=1)
    label_lengths = tf.reduce_sum(tf.cast(~is_pad[:, 0, :], tf.int32), axis=1) - 1
    return logit_lengths, label_lengths
