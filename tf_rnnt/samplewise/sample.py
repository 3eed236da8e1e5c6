"""One sample's cost and gradients: joint, output layer, log-softmax picks and lattice."""

import tensorflow as tf

from tf_rnnt import _contract as contract
from tf_rnnt.samplewise.lattice import lattice_gradients


def sample_gradients(encoder_b, predictor_b, labels_b, kernel, bias, blank, activation,
                      gradient_options, weight, need_input_grads):
    """Cost and gradients of one unpadded sample, all in float32.

    encoder_b `[T_b, H]`, predictor_b `[U_b+1, H]`, labels_b `[U_b]` int32, kernel `[H, V]`,
    bias `[V]`; gradient_options is `(fastemit_lambda, clamp)`; weight is a scalar the lattice
    gradient is multiplied by (or None).
    """
    act, act_grad = contract.ACTIVATIONS[activation]
    num_frames = tf.shape(encoder_b)[0]
    num_states = tf.shape(predictor_b)[0]
    hidden_size = tf.shape(kernel)[0]
    num_nodes = num_frames * num_states
    hidden = act(tf.reshape(encoder_b[:, None, :] + predictor_b[None, :, :],
                            [num_nodes, hidden_size]))
    # [N, V], n = t * (U+1) + u; bias_add lets grappler fuse it into the matmul. The two
    # log-probabilities per node are picked from the logits: no [N, V] log_softmax. With H = 0
    # the logits are the bias (the fused MatMul+BiasAdd of oneDNN mishandles K = 0).
    logits = tf.cond(
        hidden_size > 0, lambda: tf.nn.bias_add(tf.matmul(hidden, kernel), bias),
        lambda: tf.broadcast_to(bias, [num_nodes, tf.shape(kernel)[1]]))
    log_norm = tf.reduce_logsumexp(logits, axis=1)
    # The label of node (t, u) is y_{u+1}; u = U_b has none, blank stands in (its gradient is 0).
    node_labels = tf.tile(tf.concat([labels_b, [blank]], 0), [num_frames])
    node_index = tf.range(num_nodes)
    blank_index = tf.stack([node_index, tf.fill([num_nodes], blank)], 1)
    label_index = tf.stack([node_index, node_labels], 1)
    blank_lp = tf.reshape(tf.gather_nd(logits, blank_index) - log_norm, [num_frames, num_states])
    label_lp = tf.reshape(tf.gather_nd(logits, label_index) - log_norm, [num_frames, num_states])

    fastemit_lambda, clamp = gradient_options
    cost, grad_blank, grad_label = lattice_gradients(blank_lp, label_lp, fastemit_lambda)
    if clamp > 0:  # as the compiled ops: after FastEmit, before the upstream weight
        grad_blank = tf.clip_by_value(grad_blank, -clamp, clamp)
        grad_label = tf.clip_by_value(grad_label, -clamp, clamp)
    if weight is not None:
        grad_blank *= weight
        grad_label *= weight
    grad_blank = tf.reshape(grad_blank, [-1])
    grad_label = tf.reshape(grad_label, [-1])
    # d log_softmax_k / d logits = onehot_k - softmax. After the picks, this is the logits'
    # last reader and may reuse their buffer; so may the product and the scatter.
    with tf.control_dependencies([blank_lp, label_lp]):
        probs = tf.exp(logits - log_norm[:, None])
    grad_logits = probs * -(grad_blank + grad_label)[:, None]
    grad_logits = tf.tensor_scatter_nd_add(grad_logits, tf.concat([blank_index, label_index], 0),
                                           tf.concat([grad_blank, grad_label], 0))
    grad_kernel = tf.matmul(hidden, grad_logits, transpose_a=True)
    grad_bias = tf.reduce_sum(grad_logits, 0)
    if not need_input_grads:
        return cost, grad_kernel, grad_bias, None, None
    grad_pre = act_grad(hidden, tf.matmul(grad_logits, kernel, transpose_b=True))
    grad_pre = tf.reshape(grad_pre, [num_frames, num_states, hidden_size])
    return (cost, grad_kernel, grad_bias, tf.reduce_sum(grad_pre, 1),
            tf.reduce_sum(grad_pre, 0))


# One traced function per configuration, shared by every loop and call with that
# configuration: rebuilding it per loop would trace it 7 (or 14) times per "auto" loss.
_SAMPLE_FUNCTIONS = {}


def sample_function(activation, gradient_options, weighted, encoder_dtype, predictor_dtype):
    """Iteration b's work as a shape-generic tf.function, traced once per configuration.

    It slices sample b out of the padded batch, runs `sample_gradients` and pads the input
    gradients back. Every prebuilt loop calls this one function, so the seven loops of "auto"
    (and the seven of the weighted recomputation) stay cheap to build.
    """
    key = (activation, gradient_options, weighted, encoder_dtype, predictor_dtype)
    if key in _SAMPLE_FUNCTIONS:
        return _SAMPLE_FUNCTIONS[key]
    vector = tf.TensorSpec([None], tf.int32)
    signature = [tf.TensorSpec([], tf.int32), tf.TensorSpec([None, None, None], encoder_dtype),
                 tf.TensorSpec([None, None, None], predictor_dtype),
                 tf.TensorSpec([None, None], tf.int32), vector, vector,
                 tf.TensorSpec([None, None], tf.float32), tf.TensorSpec([None], tf.float32),
                 tf.TensorSpec([], tf.int32), tf.TensorSpec([None], tf.float32)]

    def sample(b, encoder, predictor, labels, logit_lengths, label_lengths, kernel, bias, blank,
               weights):
        num_frames = logit_lengths[b]
        num_labels = label_lengths[b]
        cost, grad_kernel, grad_bias, grad_encoder, grad_predictor = sample_gradients(
            tf.cast(encoder[b, :num_frames], tf.float32),
            tf.cast(predictor[b, :num_labels + 1], tf.float32), labels[b, :num_labels], kernel,
            bias, blank, activation, gradient_options, weights[b] if weighted else None,
            not weighted)
        if weighted:
            return cost, grad_kernel, grad_bias
        grad_encoder = tf.pad(grad_encoder, [[0, tf.shape(encoder)[1] - num_frames], [0, 0]])
        grad_predictor = tf.pad(grad_predictor,
                                [[0, tf.shape(predictor)[1] - num_labels - 1], [0, 0]])
        return (cost, grad_kernel, grad_bias, tf.cast(grad_encoder, encoder_dtype),
                tf.cast(grad_predictor, predictor_dtype))

    _SAMPLE_FUNCTIONS[key] = tf.function(sample, input_signature=signature, autograph=False)
    return _SAMPLE_FUNCTIONS[key]
