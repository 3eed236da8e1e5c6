"""Input checks shared by the tf_rnnt Keras layer and losses (lengths, labels, batch sizes).

Static problems raise ValueError at the call; value problems become run-time checks that raise
InvalidArgumentError naming the argument and its owner (the class). Checks that guard against
silently wrong values go through `guard` (the compiled TfRnntCheck op on a tensor the computation
reads), so they also run under XLA, which drops tf.debugging assertions.
"""

import tensorflow as tf

from tf_rnnt import _contract as contract


def guard(value, ok, message, data=None):
    """`value` once `all(ok)`, else InvalidArgumentError(message); holds under XLA too."""
    from tf_rnnt import ops

    return ops.check(value, tf.reduce_all(ok), message, data)


def check_rank(tensor, rank, argument, owner, layout):
    if tensor.shape.rank is not None and tensor.shape.rank != rank:
        raise ValueError(f"{owner}: `{argument}` must be {layout} (rank {rank}), got shape "
                         f"{tensor.shape}.")


def check_same_batch(owner, *named):
    """Static check where batch sizes are known, runtime asserts for the rest."""
    contract.check_same_dims({f"`{name}`": contract.static_dim(t, 0) for name, t in named},
                             "batch sizes", owner)
    (first_name, first), rest = named[0], named[1:]
    return [tf.debugging.assert_equal(
        tf.shape(first)[0], tf.shape(t)[0],
        message=f"{owner}: mismatched batch sizes of `{first_name}` and `{name}`")
        for name, t in rest]


def check_u_plus_one(labels, tensor, axis, argument, owner):
    """`tensor.shape[axis]` == U + 1 for `[B, U]` labels: a ValueError now when both are static,
    else the returned run-time assertion."""
    num_labels, num_nodes = contract.static_dim(labels, 1), contract.static_dim(tensor, axis)
    what = f"`{argument}` must have U+1 entries on axis {axis} for labels of length U"
    if num_labels is not None and num_nodes is not None and num_nodes != num_labels + 1:
        raise ValueError(f"{owner}: {what}; got U = {num_labels} and shape {tensor.shape}.")
    return tf.debugging.assert_equal(tf.shape(tensor)[axis], tf.shape(labels)[1] + 1,
                                     message=f"{owner}: {what}")


def labels_as_int(labels, argument, owner):
    labels = tf.convert_to_tensor(labels)
    if labels.dtype.is_floating:
        # Keras hands y_true over as floats; label ids are exact in float32 below 2**24.
        return tf.cast(tf.round(labels), tf.int32)
    check_rank(labels, 2, argument, owner, "[B, U] padded labels")
    return contract.int32_tensor(labels, argument, owner, rank=2)


def label_lengths_of(labels, pad_value, blank, vocab_size, argument, owner):
    """Label lengths from padding, labels with padding replaced by 0, and the input checks.

    Args:
      labels: `[B, U]` int32.
      pad_value: the padding id.
      blank: blank id (normalized, >= 0) or None when unknown.
      vocab_size: V or None when unknown.

    Returns:
      `(clean_labels [B, U], label_lengths [B], asserts)`.
    """
    is_label = tf.not_equal(labels, pad_value)
    label_lengths = tf.reduce_sum(tf.cast(is_label, tf.int32), axis=1)
    # Each check gates the lengths, which every later op reads (also under XLA).
    label_lengths = guard(
        label_lengths, tf.equal(is_label, tf.sequence_mask(label_lengths, tf.shape(labels)[1])),
        f"{owner}: `{argument}` must be padded at the end with pad_value={pad_value}, "
        f"with no pad_value before a label")
    # Checked on real labels only; padded entries become 0 (any id in [0, V) would do).
    clean = tf.where(is_label, labels, 0)
    label_lengths = guard(label_lengths, clean >= 0,
                          f"{owner}: `{argument}` holds negative ids other than pad_value="
                          f"{pad_value}")
    if vocab_size is not None:
        label_lengths = guard(label_lengths, clean < vocab_size,
                              f"{owner}: `{argument}` holds ids >= vocab_size={vocab_size}")
    if blank is not None:
        label_lengths = guard(
            label_lengths, ~(is_label & tf.equal(labels, blank)),
            f"{owner}: `{argument}` holds the blank id {blank} as a label (blank is never a "
            f"target; pad with pad_value={pad_value})")
    return clean, label_lengths, []


def frame_lengths_of(lengths, mask, frames, argument, owner):
    """`[B]` frame lengths of `frames` `[B, T, ...]`: explicit `lengths`, else the Keras `mask`,
    else T; and their checks."""
    num_frames = tf.shape(frames)[1]
    if lengths is not None:
        lengths = contract.int32_tensor(lengths, "logit_lengths", owner, rank=1)
        asserts = check_same_batch(owner, (argument, frames), ("logit_lengths", lengths))
        lengths = guard(lengths, lengths >= 0, f"{owner}: negative logit_lengths")
        lengths = guard(lengths, lengths <= num_frames,
                        f"{owner}: logit_lengths exceed the frames of `{argument}`")
        return lengths, asserts
    if mask is not None:
        mask = tf.cast(mask, tf.bool)
        lengths = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)
        return guard(lengths, tf.equal(mask, tf.sequence_mask(lengths, num_frames)),
                     f"{owner}: the Keras mask of `{argument}` must mark a prefix of the frames "
                     f"(padding at the end)"), []
    return tf.fill([tf.shape(frames)[0]], num_frames), []


def missing_lengths_error(argument, owner, how):
    return ValueError(
        f"{owner}: no frame lengths for `{argument}`: {how} Layers that change the number of "
        f"frames (Conv1D, pooling) drop the Keras mask; compute the lengths after them with "
        f"tf_rnnt.keras.conv_output_lengths. If every frame of every sample is valid (no "
        f"padding), pass all_frames_valid=True.")


def check_pad_value(pad_value, blank, vocab_size, owner):
    if int(pad_value) != pad_value:
        raise ValueError(f"{owner}: pad_value must be an integer, got {pad_value!r}.")
    pad_value = int(pad_value)
    if vocab_size is not None and 0 <= pad_value < vocab_size and pad_value != blank:
        raise ValueError(f"{owner}: pad_value={pad_value} is a label id in [0, {vocab_size}); "
                         f"pad with a negative id (default -1) or with the blank ({blank}).")
    return pad_value
