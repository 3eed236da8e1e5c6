"""Sample-wise RNN-T loss in pure TensorFlow (Braun et al., 2022).

The encoder and predictor run batched; the joint network, output layer, loss and
their gradients run one sample at a time with the sample's padding removed, inside
one `tf.while_loop` over the batch. Each iteration builds only the
`[T_b, U_b+1, V]` logits of its own sample, computes that sample's cost and
gradients on the spot, adds its share of d kernel / d bias to an accumulator and
writes d encoder[b] / d predictor[b] in place into one buffer per input (a fresh
`Empty` tensor updated with `InplaceUpdate`; a TensorArray would need a final stack
that holds the `[B, T, H]` gradient twice). The backward pass then only scales these
saved gradients, so the memory of the joint/output/loss part depends on the
longest sample and on `parallel_iterations`, not on the batch size.

No custom op is used on this path: it runs wherever TensorFlow runs.

Per-sample lattice recursion. The alpha/beta recursions are solved column by
column (one column per label position u) rather than by anti-diagonals: along a
column the recursion `alpha[t, u] = logaddexp(alpha[t-1, u] + blank[t-1, u],
alpha[t, u-1] + label[t, u-1])` is a first-order recurrence in t whose closed form
is a cumulative log-sum-exp,

  alpha[:, u] = C[:, u] + cumulative_logsumexp(alpha[:, u-1] + label[:, u-1] - C[:, u]),

with `C` the exclusive cumulative sum of the blank log-probabilities over t (and
the mirror image for beta). Alpha and beta advance together, so that is `U_b`
sequential steps of one add and one cumulative log-sum-exp on a `[2, T_b]` tensor,
instead of the `T_b + U_b` steps of an anti-diagonal recursion (T >> U in speech),
which matters on a GPU, where every small op is a kernel launch. The subtraction
of `C` would cost float32 precision at long T, so this part, which only touches
`[T_b, U_b+1]` values, runs in float64 (hence not on TPUs, which lack float64).
"""

import math
import numbers

import tensorflow as tf

__all__ = ["samplewise_rnnt_loss", "auto_parallel_iterations", "sample_working_set_bytes",
           "DEFAULT_MEMORY_BUDGET", "PARALLEL_ITERATIONS_CHOICES"]

# Default working-set budget of the joint/output/loss part for parallel_iterations="auto".
DEFAULT_MEMORY_BUDGET = 2 * 1024 ** 3

# The prebuilt loops "auto" chooses among.
PARALLEL_ITERATIONS_CHOICES = (1, 2, 4, 8, 16, 32, 64)

# Float32 [T_b * (U_b+1), V] and [T_b * (U_b+1), H] buffers counted per iteration (logits,
# probabilities, their gradient and temporaries; joint values and their gradient). Measured
# peaks (TensorFlow's allocator, CPU, H/V from 1/4 to 4) stay 5-30% below this count.
_VOCAB_BUFFERS = 3
_HIDDEN_BUFFERS = 2

_FLOAT_BYTES = 4
_UNROLL = 8  # lattice recursion steps per while-loop iteration
_ACTIVATIONS = ("tanh", "relu", "identity")
_FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32)
_INT_DTYPES = (tf.int32, tf.int64)


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
    index = _auto_branch_index(logit_lengths, label_lengths, hidden_size, vocab_size,
                               memory_budget)
    return tf.gather(tf.constant(PARALLEL_ITERATIONS_CHOICES, tf.int32), index)


def _auto_branch_index(logit_lengths, label_lengths, hidden_size, vocab_size, memory_budget):
    budget = float(DEFAULT_MEMORY_BUDGET if memory_budget is None else memory_budget)
    working_set = sample_working_set_bytes(logit_lengths, label_lengths, hidden_size,
                                           vocab_size)
    fits = [tf.cast(p * working_set <= budget, tf.int32) for p in PARALLEL_ITERATIONS_CHOICES[1:]]
    # The choices double, so the number of choices above 1 that fit is the index.
    return tf.add_n(fits)


def _activation_and_grad(activation):
    """(act, d act / d pre as a function of act's output)."""
    # The fused gradient kernels avoid [N, H] temporaries.
    if activation == "tanh":
        return tf.tanh, lambda hidden, grad: tf.raw_ops.TanhGrad(y=hidden, dy=grad)
    if activation == "relu":
        return tf.nn.relu, lambda hidden, grad: tf.raw_ops.ReluGrad(gradients=grad,
                                                                    features=hidden)
    return tf.identity, lambda hidden, grad: grad


def _lattice_gradients(blank_lp, label_lp, fastemit_lambda):
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


def _sample_gradients(encoder_b, predictor_b, labels_b, kernel, bias, blank, activation,
                      fastemit_lambda, weight, need_input_grads):
    """Cost and gradients of one unpadded sample, all in float32.

    encoder_b `[T_b, H]`, predictor_b `[U_b+1, H]`, labels_b `[U_b]` int32, kernel `[H, V]`,
    bias `[V]`; weight is a scalar the lattice gradient is multiplied by (or None).
    """
    act, act_grad = _activation_and_grad(activation)
    num_frames = tf.shape(encoder_b)[0]
    num_states = tf.shape(predictor_b)[0]
    hidden_size = tf.shape(kernel)[0]
    num_nodes = num_frames * num_states
    hidden = act(tf.reshape(encoder_b[:, None, :] + predictor_b[None, :, :],
                            [num_nodes, hidden_size]))
    # [N, V], n = t * (U+1) + u; bias_add lets grappler fuse it into the matmul. The two
    # log-probabilities per node are picked from the logits: no [N, V] log_softmax.
    logits = tf.nn.bias_add(tf.matmul(hidden, kernel), bias)
    log_norm = tf.reduce_logsumexp(logits, axis=1)
    # The label of node (t, u) is y_{u+1}; u = U_b has none, blank stands in (its gradient is 0).
    node_labels = tf.tile(tf.concat([labels_b, [blank]], 0), [num_frames])
    node_index = tf.range(num_nodes)
    blank_index = tf.stack([node_index, tf.fill([num_nodes], blank)], 1)
    label_index = tf.stack([node_index, node_labels], 1)
    blank_lp = tf.reshape(tf.gather_nd(logits, blank_index) - log_norm, [num_frames, num_states])
    label_lp = tf.reshape(tf.gather_nd(logits, label_index) - log_norm, [num_frames, num_states])

    cost, grad_blank, grad_label = _lattice_gradients(blank_lp, label_lp, fastemit_lambda)
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


_SAMPLE_FUNCTIONS = {}


def _sample_function(activation, fastemit_lambda, weighted, encoder_dtype, predictor_dtype):
    """Iteration b's work as a shape-generic tf.function, traced once per configuration.

    It slices sample b out of the padded batch, runs `_sample_gradients` and pads the input
    gradients back. Every prebuilt loop calls this one function, so the seven loops of "auto"
    (and the seven of the weighted recomputation) stay cheap to build.
    """
    key = (activation, fastemit_lambda, weighted, encoder_dtype, predictor_dtype)
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
        cost, grad_kernel, grad_bias, grad_encoder, grad_predictor = _sample_gradients(
            tf.cast(encoder[b, :num_frames], tf.float32),
            tf.cast(predictor[b, :num_labels + 1], tf.float32), labels[b, :num_labels], kernel,
            bias, blank, activation, fastemit_lambda, weights[b] if weighted else None,
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


def _batch_loop(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths, blank,
                activation, fastemit_lambda, parallel_iterations, weights=None):
    """The while_loop over the batch.

    Returns (costs `[B]` f32, d kernel f32, d bias f32, d encoder, d predictor) with the last
    two in the inputs' dtypes; with `weights` (the weighted recomputation) only the first three.
    """
    batch = tf.shape(encoder)[0]
    kernel32 = tf.cast(kernel, tf.float32)
    bias32 = tf.cast(bias, tf.float32)
    weighted = weights is not None
    sample_fn = _sample_function(activation, fastemit_lambda, weighted, encoder.dtype,
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
        return (b + 1, grad_kernel + outputs[1], grad_bias + outputs[2], costs, grad_encoder,
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
    activation, parallel_iterations, memory_budget, fastemit_lambda = config

    def loop(p):
        return lambda: _batch_loop(encoder, predictor, kernel, bias, labels, logit_lengths,
                                   label_lengths, blank, activation, fastemit_lambda, p, weights)

    if parallel_iterations != "auto":
        outputs = loop(parallel_iterations)()
    else:
        index = _auto_branch_index(logit_lengths, label_lengths, tf.shape(kernel)[0],
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
            return (grad_encoder * tf.cast(upstream, grad_encoder.dtype)[:, None, None],
                    grad_predictor * tf.cast(upstream, grad_predictor.dtype)[:, None, None],
                    tf.cast(weighted_kernel, kernel.dtype), tf.cast(weighted_bias, bias.dtype))

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
        tf.debugging.assert_greater_equal(blank, -vocab_size, message="blank must be in "
                                          "[-V, V) for V = kernel.shape[1]"),
        tf.debugging.assert_less(blank, vocab_size, message="blank must be in [-V, V) for "
                                 "V = kernel.shape[1]"),
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
        blank = blank % vocab_size
        bad = valid & ((labels < 0) | (labels >= vocab_size))
        checks.append(tf.debugging.assert_equal(
            tf.reduce_any(bad), False,
            message="labels must be in [0, V) (V = kernel.shape[1]) within label_lengths"))
        # As the compiled joint ops: a label equal to blank is a malformed transcript.
        checks.append(tf.debugging.assert_equal(
            tf.reduce_any(valid & tf.equal(labels, blank)), False,
            message="labels must not contain the blank index within label_lengths"))
    with tf.control_dependencies(checks):
        return [tf.identity(x) for x in (encoder, predictor, kernel, bias, labels,
                                         logit_lengths, label_lengths, blank)]


@tf.autograph.experimental.do_not_convert
def _samplewise(config, encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths,
                blank):
    values = _validated_values(encoder, predictor, kernel, bias, labels, logit_lengths,
                               label_lengths, blank)
    return _loss_with_gradient(config, *values)


_COMPILED = {}


def _compiled(config):
    # Eagerly, tf.while_loop would run as a Python loop (parallel_iterations ignored): run the
    # same graph as a tf.function instead, one per configuration.
    if config not in _COMPILED:
        _COMPILED[config] = tf.function(lambda *args: _samplewise(config, *args),
                                        reduce_retracing=True)
    return _COMPILED[config]


def _check_static(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths):
    for name, x, rank in (("encoder", encoder, 3), ("predictor", predictor, 3),
                          ("kernel", kernel, 2), ("bias", bias, 1), ("labels", labels, 2),
                          ("logit_lengths", logit_lengths, 1), ("label_lengths", label_lengths, 1)):
        if x.shape.rank is not None and x.shape.rank != rank:
            raise ValueError(f"{name} must have rank {rank}, got shape {x.shape}")
    for name, x in (("encoder", encoder), ("predictor", predictor), ("kernel", kernel),
                    ("bias", bias)):
        if x.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32, float16 or bfloat16, got {x.dtype.name}")
    for name, x in (("labels", labels), ("logit_lengths", logit_lengths),
                    ("label_lengths", label_lengths)):
        if x.dtype not in _INT_DTYPES:
            raise ValueError(f"{name} must be int32 or int64, got {x.dtype.name}")

    def dim(x, i):
        return x.shape[i] if x.shape.rank is not None else None

    def same(name, a, what, b):
        if a is not None and b is not None and a != b:
            raise ValueError(f"{name} {what} ({a}) does not match ({b})")

    batch = dim(encoder, 0)
    same("predictor", dim(predictor, 0), "batch size vs encoder", batch)
    same("labels", dim(labels, 0), "batch size vs encoder", batch)
    same("logit_lengths", dim(logit_lengths, 0), "size vs encoder batch", batch)
    same("label_lengths", dim(label_lengths, 0), "size vs encoder batch", batch)
    same("predictor", dim(predictor, 2), "hidden size vs encoder", dim(encoder, 2))
    same("kernel", dim(kernel, 0), "rows vs encoder hidden size", dim(encoder, 2))
    same("bias", dim(bias, 0), "size vs kernel columns", dim(kernel, 1))
    label_steps = dim(labels, 1)
    same("predictor", dim(predictor, 1), "steps vs labels.shape[1] + 1",
         None if label_steps is None else label_steps + 1)
    if dim(kernel, 1) == 0:
        raise ValueError("kernel must have at least one column (the vocabulary)")
    return dim(kernel, 1)


def samplewise_rnnt_loss(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths,
                         blank=0, activation="tanh", parallel_iterations="auto",
                         memory_budget=None, fastemit_lambda=0.0):
    """Sample-wise RNN-T loss with a dense joint, in pure TensorFlow.

    Same inputs and result as `tf_rnnt.flash_rnnt_loss`: per node (t, u) the joint is
    `log_softmax(act(encoder[b, t] + predictor[b, u]) @ kernel + bias)`, and the cost is
    -log P(y|x). A `tf.while_loop` over the batch builds the logits of one sample at a time,
    cut to its own `(logit_lengths[b], label_lengths[b] + 1)` lattice, and computes that
    sample's cost and gradients in the same iteration (analytic alpha/beta, computed in
    float32 with the lattice recursion in float64). The gradient (`tf.custom_gradient`)
    only scales these saved gradients by the upstream gradient. When the upstream
    gradient differs between samples (e.g. sample weights) the kernel and bias gradients,
    which the loop sums over the batch, are recomputed by a second loop with the weights.

    `parallel_iterations` is how many loop iterations (samples) TensorFlow may run at once:
    more means more overlap of the per-sample work and more memory (each iteration in flight
    holds its own `[T_b, U_b+1, V]` logits and gradients). With `"auto"` it is chosen at run
    time from the batch: the per-sample working set is estimated as
    `4 bytes * max_b(T_b * (U_b+1)) * (3 * V + 2 * H)` (`sample_working_set_bytes`: float32
    logits, probabilities or their gradient and a temporary; joint values and their
    gradient; measured peaks stay 5-30% below it), and the choice is the largest P in
    `(1, 2, 4, 8, 16, 32, 64)` with `P * working_set <= memory_budget` (1 when one sample
    alone exceeds it); `auto_parallel_iterations` returns it. TensorFlow fixes a while
    loop's parallel_iterations when the loop is built, and in a `tf.function` the lengths
    are only known at run time, so all seven loops are built once
    and a `tf.switch_case` runs the chosen one (retracing per bucket would need the lengths
    in Python, i.e. a device-to-host sync and a retrace per bucket, and breaks under
    `tf.function` with symbolic lengths). Only the chosen branch executes; the per-sample
    work is one shared `tf.function`, so the seven loops cost little to build. An int fixes
    the value and builds a single loop. The estimate is an upper bound of what P iterations
    can hold: on a GPU, where kernels are queued ahead, the iterations in flight approach P;
    on a CPU the executor runs about as many at once as it has inter-op threads, so memory
    and speed stop changing once P reaches that number (benchmarks/results/samplewise_cpu.md).

    The default `memory_budget`, 2 GiB (`DEFAULT_MEMORY_BUDGET`), bounds only this loop's
    working set, on top of the inputs and their gradients. At the paper's long-utterance
    setting (T=1000, U=150, H=640, V=1024: 2.6 GB estimated per sample, about 2.0 GB from
    the per-node peak measured on a CPU) it runs one sample at a time, which with the 3 GB
    of input gradients keeps the whole loss near the paper's 6 GB; short batches (e.g.
    T=200, U=30: 108 MB per sample) get 16 samples at once. Raise it when memory is
    plentiful.

    Eager calls run the loop inside a `tf.function` (one per configuration), because an
    eager `tf.while_loop` is a Python loop that ignores parallel_iterations.

    Args:
      encoder: `[B, T, H]` float32/float16/bfloat16.
      predictor: `[B, U+1, H]` float32/float16/bfloat16.
      kernel: `[H, V]` float32/float16/bfloat16.
      bias: `[V]` float32/float16/bfloat16.
      labels: `[B, U]` int32/int64, in `[0, V)` and not blank; entries past
        `label_lengths` may hold any value.
      logit_lengths: `[B]` int32/int64, valid frames per sample, in `[1, T]`.
      label_lengths: `[B]` int32/int64, valid labels per sample, in `[0, U]`.
      blank: blank index in `[-V, V)`; negative counts from the end.
      activation: "tanh", "relu" or "identity".
      parallel_iterations: "auto" or a positive int.
      memory_budget: bytes for "auto"; None means `DEFAULT_MEMORY_BUDGET`.
      fastemit_lambda: FastEmit weight (>= 0): the gradient of the label log-probabilities is
        scaled by `1 + fastemit_lambda`; the cost is unchanged.

    Returns:
      `[B]` float32 costs. Gradients come back in each input's dtype; half-precision inputs
      are computed in float32 inside the loop.

    Raises:
      ValueError: bad arguments or statically known shapes/dtypes (the message names the
        argument).
      tf.errors.InvalidArgumentError: at run time, for bad lengths, labels or shapes.
    """
    if not isinstance(activation, str) or activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {activation!r}")
    if isinstance(blank, bool) or not isinstance(blank, numbers.Integral):
        raise ValueError(f"blank must be an int, got {blank!r}")
    blank = int(blank)
    if isinstance(parallel_iterations, str):
        if parallel_iterations != "auto":
            raise ValueError("parallel_iterations must be 'auto' or a positive int, got "
                             f"{parallel_iterations!r}")
    elif (isinstance(parallel_iterations, bool)
          or not isinstance(parallel_iterations, numbers.Integral) or parallel_iterations < 1):
        raise ValueError("parallel_iterations must be 'auto' or a positive int, got "
                         f"{parallel_iterations!r}")
    else:
        parallel_iterations = int(parallel_iterations)
    if memory_budget is not None:
        if (isinstance(memory_budget, bool) or not isinstance(memory_budget, numbers.Real)
                or not math.isfinite(memory_budget) or memory_budget <= 0):
            raise ValueError(f"memory_budget must be a positive number of bytes or None, got "
                             f"{memory_budget!r}")
        memory_budget = float(memory_budget)
    if (isinstance(fastemit_lambda, bool) or not isinstance(fastemit_lambda, numbers.Real)
            or not math.isfinite(fastemit_lambda) or fastemit_lambda < 0):
        raise ValueError(f"fastemit_lambda must be a finite number >= 0, got {fastemit_lambda!r}")
    fastemit_lambda = float(fastemit_lambda)

    encoder = tf.convert_to_tensor(encoder)
    predictor = tf.convert_to_tensor(predictor)
    kernel = tf.convert_to_tensor(kernel)
    bias = tf.convert_to_tensor(bias)
    labels = tf.convert_to_tensor(labels)
    logit_lengths = tf.convert_to_tensor(logit_lengths)
    label_lengths = tf.convert_to_tensor(label_lengths)
    vocab_size = _check_static(encoder, predictor, kernel, bias, labels, logit_lengths,
                               label_lengths)
    if vocab_size is not None and not -vocab_size <= blank < vocab_size:
        raise ValueError(f"blank must be in [-V, V) for V = kernel.shape[1] = {vocab_size}, "
                         f"got {blank}")
    labels = tf.cast(labels, tf.int32)
    logit_lengths = tf.cast(logit_lengths, tf.int32)
    label_lengths = tf.cast(label_lengths, tf.int32)
    config = (activation, parallel_iterations, memory_budget, fastemit_lambda)
    args = (encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths,
            tf.constant(blank, tf.int32))
    if tf.executing_eagerly():
        return _compiled(config)(*args)
    return _samplewise(config, *args)
