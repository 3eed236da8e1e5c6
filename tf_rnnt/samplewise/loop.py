"""The while_loop over the batch and the custom gradient that replays its saved gradients.

The encoder and predictor run batched; the joint network, output layer, loss and their
gradients run one sample at a time with the sample's padding removed, inside one
`tf.while_loop` over the batch. Each iteration builds only the `[T_b, U_b+1, V]` logits of its
own sample, computes that sample's cost and gradients on the spot, adds its share of d kernel /
d bias to an accumulator and writes d encoder[b] / d predictor[b] in place into one buffer per
input (a fresh `Empty` tensor updated with `InplaceUpdate`; a TensorArray would need a final
stack that holds the `[B, T, H]` gradient twice). The backward pass then only scales these
saved gradients.
"""

import tensorflow as tf

from tf_rnnt import _contract as contract
from tf_rnnt.samplewise.memory import PARALLEL_ITERATIONS_CHOICES, auto_branch_index
from tf_rnnt.samplewise.sample import sample_function

_OWNER = "tf_rnnt.samplewise_rnnt_loss"


def _batch_loop(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths, blank,
                activation, gradient_options, parallel_iterations, weights=None):
    """The while_loop over the batch.

    Returns (costs `[B]` f32, d kernel f32, d bias f32, d encoder, d predictor) with the last
    two in the inputs' dtypes; with `weights` (the weighted recomputation) only the first three.
    """
    batch = tf.shape(encoder)[0]
    kernel32 = tf.cast(kernel, tf.float32)
    bias32 = tf.cast(bias, tf.float32)
    weighted = weights is not None
    sample_fn = sample_function(activation, gradient_options, weighted, encoder.dtype,
                                 predictor.dtype)
    args = (encoder, predictor, labels, logit_lengths, label_lengths, kernel32, bias32, blank,
            weights if weighted else tf.zeros([0]))
    costs = tf.TensorArray(tf.float32, size=batch, element_shape=[])
    if weighted:
        grad_encoder = grad_predictor = tf.zeros([])  # unused
    else:
        # Each sample's rows are written in place into one fresh buffer (Empty is stateful: a
        # new buffer every run, never a folded constant). A TensorArray would need a stack at
        # the end, holding the [B, T, H] gradient twice.
        grad_encoder = tf.raw_ops.Empty(shape=tf.shape(encoder), dtype=encoder.dtype, init=True)
        grad_predictor = tf.raw_ops.Empty(shape=tf.shape(predictor), dtype=predictor.dtype,
                                          init=True)

    def body(b, grad_kernel, grad_bias, costs, grad_encoder, grad_predictor):
        outputs = sample_fn(b, *args)
        costs = costs.write(b, outputs[0])
        if not weighted:
            # InplaceUpdate aliases its input: the loop carries the same buffer throughout.
            grad_encoder = tf.raw_ops.InplaceUpdate(x=grad_encoder, i=b[None], v=outputs[3][None])
            grad_predictor = tf.raw_ops.InplaceUpdate(x=grad_predictor, i=b[None],
                                                      v=outputs[4][None])
        # The shape-generic function's [None, None] would broadcast a size-1 V to None.
        return (b + 1, grad_kernel + tf.ensure_shape(outputs[1], kernel32.shape),
                grad_bias + tf.ensure_shape(outputs[2], bias32.shape), costs, grad_encoder,
                grad_predictor)

    _, grad_kernel, grad_bias, costs, grad_encoder, grad_predictor = tf.while_loop(
        lambda b, *_: b < batch, body,
        (tf.constant(0), tf.zeros_like(kernel32), tf.zeros_like(bias32), costs, grad_encoder,
         grad_predictor),
        parallel_iterations=parallel_iterations, name="samplewise_batch_loop")
    if weighted:
        return costs.stack(), grad_kernel, grad_bias
    return costs.stack(), grad_kernel, grad_bias, grad_encoder, grad_predictor


@tf.autograph.experimental.do_not_convert
def _run_loop(config, tensors, weights=None):
    """Runs _batch_loop with the configured or automatically chosen parallel_iterations."""
    encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths, blank = tensors
    activation, parallel_iterations, memory_budget, gradient_options = config

    def loop(p):
        return lambda: _batch_loop(encoder, predictor, kernel, bias, labels, logit_lengths,
                                   label_lengths, blank, activation, gradient_options, p, weights)

    if parallel_iterations != "auto":
        outputs = loop(parallel_iterations)()
    else:
        index = auto_branch_index(logit_lengths, label_lengths, tf.shape(kernel)[0],
                                   tf.shape(kernel)[1], memory_budget)
        outputs = tf.switch_case(index, [loop(p) for p in PARALLEL_ITERATIONS_CHOICES],
                                 name="samplewise_parallel_iterations")
    # Autodiff must never walk into the loops (the custom gradient replaces them): a
    # persistent tape differentiates a tf.function's saved outputs too.
    return [tf.stop_gradient(x) for x in outputs]


@tf.autograph.experimental.do_not_convert
def _loss_with_gradient(config, encoder, predictor, kernel, bias, labels, logit_lengths,
                        label_lengths, blank):
    # No gradient may flow into the loops: the custom gradient below replaces them.
    tensors = [tf.stop_gradient(x) for x in (encoder, predictor, kernel, bias)]
    tensors += [labels, logit_lengths, label_lengths, blank]

    @tf.custom_gradient
    def loss(encoder, predictor, kernel, bias):
        costs, grad_kernel, grad_bias, grad_encoder, grad_predictor = _run_loop(config, tensors)

        def backward(upstream):
            upstream = tf.cast(upstream, tf.float32)
            # kernel and bias gradients are summed over the batch in the loop; that sum can be
            # scaled only when every sample has the same upstream weight (a mean or sum of the
            # costs). Otherwise (e.g. sample weights) the loop runs again with the weights.
            uniform = tf.reduce_all(tf.equal(upstream, upstream[:1]))
            scale = tf.reduce_sum(upstream[:1])
            weighted_kernel, weighted_bias = tf.cond(
                uniform, lambda: (grad_kernel * scale, grad_bias * scale),
                lambda: tuple(_run_loop(config, tensors, upstream)[1:]))
            grads = (grad_encoder * tf.cast(upstream, grad_encoder.dtype)[:, None, None],
                     grad_predictor * tf.cast(upstream, grad_predictor.dtype)[:, None, None],
                     tf.cast(weighted_kernel, kernel.dtype), tf.cast(weighted_bias, bias.dtype))
            # The loops run under stop_gradient: differentiating these again would give zeros.
            return contract.first_order_only(grads, _OWNER,
                                             inputs=(encoder, predictor, kernel, bias))

        return costs, backward

    return loss(encoder, predictor, kernel, bias)


def _validated_values(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths,
                      blank):
    """Runtime checks of shapes and values; returns the inputs with the checks attached."""
    shape_enc = tf.shape(encoder)
    shape_pred = tf.shape(predictor)
    shape_kernel = tf.shape(kernel)
    vocab_size = shape_kernel[1]
    batch = shape_enc[0]
    max_frames = shape_enc[1]
    max_labels = tf.shape(labels)[1]
    checks = [
        tf.debugging.assert_equal(shape_pred[0], batch, message="predictor batch size must "
                                  "equal encoder batch size"),
        tf.debugging.assert_equal(tf.shape(labels)[0], batch, message="labels batch size must "
                                  "equal encoder batch size"),
        tf.debugging.assert_equal(tf.size(logit_lengths), batch, message="logit_lengths must "
                                  "have one entry per encoder batch element"),
        tf.debugging.assert_equal(tf.size(label_lengths), batch, message="label_lengths must "
                                  "have one entry per encoder batch element"),
        tf.debugging.assert_equal(shape_pred[2], shape_enc[2], message="predictor hidden size "
                                  "must equal encoder hidden size"),
        tf.debugging.assert_equal(shape_kernel[0], shape_enc[2], message="kernel rows must "
                                  "equal the encoder hidden size"),
        tf.debugging.assert_equal(tf.size(bias), vocab_size, message="bias size must equal "
                                  "the kernel's vocabulary size"),
        tf.debugging.assert_equal(shape_pred[1], max_labels + 1, message="predictor must have "
                                  "labels.shape[1] + 1 steps"),
        tf.debugging.assert_greater(vocab_size, 0, message="kernel must have at least one "
                                    "column (the vocabulary)"),
        tf.debugging.assert_greater_equal(logit_lengths, 1, message="logit_lengths must be "
                                          ">= 1"),
        tf.debugging.assert_less_equal(logit_lengths, max_frames, message="logit_lengths must "
                                       "be <= encoder.shape[1]"),
        tf.debugging.assert_greater_equal(label_lengths, 0, message="label_lengths must be "
                                          ">= 0"),
        tf.debugging.assert_less_equal(label_lengths, max_labels, message="label_lengths must "
                                       "be <= labels.shape[1]"),
    ]
    with tf.control_dependencies(checks):
        valid = tf.sequence_mask(label_lengths, max_labels)
        blank = contract.normalized_blank(blank, vocab_size, _OWNER)
        bad = valid & ((labels < 0) | (labels >= vocab_size))
        checks.append(tf.debugging.Assert(
            tf.logical_not(tf.reduce_any(bad)),
            [f"{_OWNER}: labels must be in [0, V) (V = kernel.shape[1]) within label_lengths; "
             "V and the labels outside it:", vocab_size, tf.boolean_mask(labels, bad)]))
        # As the compiled joint ops: a label equal to blank is a malformed transcript.
        checks.append(tf.debugging.Assert(
            tf.logical_not(tf.reduce_any(valid & tf.equal(labels, blank))),
            [f"{_OWNER}: labels must not contain the blank index within label_lengths; blank:",
             blank]))
    with tf.control_dependencies(checks):
        return [tf.identity(x) for x in (encoder, predictor, kernel, bias, labels,
                                         logit_lengths, label_lengths, blank)]


@tf.autograph.experimental.do_not_convert
def samplewise(config, encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths,
                blank):
    values = _validated_values(encoder, predictor, kernel, bias, labels, logit_lengths,
                               label_lengths, blank)
    return _loss_with_gradient(config, *values)


# One tf.function per configuration, so that eager calls with the same options reuse one
# trace (reduce_retracing keeps it shape-generic).
_COMPILED = {}


def compiled(config):
    # Eagerly, tf.while_loop would run as a Python loop (parallel_iterations ignored): run the
    # same graph as a tf.function instead, one per configuration.
    if config not in _COMPILED:
        _COMPILED[config] = tf.function(lambda *args: samplewise(config, *args),
                                        reduce_retracing=True)
    return _COMPILED[config]
