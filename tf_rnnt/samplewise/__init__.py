"""Sample-wise RNN-T loss in pure TensorFlow (Braun et al., 2022).

The encoder and predictor run batched; the joint network, output layer, loss and their
gradients run one sample at a time with the sample's padding removed, inside one
`tf.while_loop` over the batch, so the memory of that part depends on the longest sample and
on `parallel_iterations`, not on the batch size. No custom op is used on this path: it runs
wherever TensorFlow runs.

Modules: `memory` (working-set estimate and the choice of parallel_iterations), `sample`
(one sample's joint, output layer and gradients), `lattice` (its float64 alpha/beta
recursions), `loop` (the loop over the batch and the custom gradient).
"""

import tensorflow as tf
from tensorflow.python.ops import control_flow_util as _control_flow_util

from tf_rnnt import _contract as contract
from tf_rnnt.samplewise import loop
from tf_rnnt.samplewise.memory import (
    DEFAULT_MEMORY_BUDGET,
    PARALLEL_ITERATIONS_CHOICES,
    auto_parallel_iterations,
    sample_working_set_bytes,
)

__all__ = ["samplewise_rnnt_loss", "auto_parallel_iterations", "sample_working_set_bytes",
           "DEFAULT_MEMORY_BUDGET", "PARALLEL_ITERATIONS_CHOICES", "MAX_PARALLEL_ITERATIONS"]

_OWNER = "tf_rnnt.samplewise_rnnt_loss"
#: The largest int parallel_iterations accepted: TensorFlow reserves memory per potential
#: iteration of a while loop, and no batch this loop runs has more samples in flight.
MAX_PARALLEL_ITERATIONS = 4096


def samplewise_rnnt_loss(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths,
                         blank=0, activation="tanh", parallel_iterations="auto",
                         memory_budget=None, fastemit_lambda=0.0, clamp=-1.0):
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
    gradient), and the choice is the largest P in `PARALLEL_ITERATIONS_CHOICES`
    `(1, 2, 4, 8, 16, 32, 64)` with `P * working_set <= memory_budget` (1 when one sample
    alone exceeds it); `auto_parallel_iterations` returns it. TensorFlow fixes a while
    loop's parallel_iterations when the loop is built, and in a `tf.function` the lengths
    are only known at run time, so all seven loops are built once and a `tf.switch_case`
    runs the chosen one. Only the chosen branch executes; the per-sample work is one shared
    `tf.function`, so the seven loops cost little to build. An int fixes the value and
    builds a single loop. The estimate is an upper bound of what P iterations can hold: on a
    GPU, where kernels are queued ahead, the iterations in flight approach P; on a CPU the
    executor runs about as many at once as it has inter-op threads.

    The default `memory_budget`, 2 GiB (`DEFAULT_MEMORY_BUDGET`), bounds only this loop's
    working set, on top of the inputs and their gradients: long utterances run one sample
    at a time, short batches several. Raise it when memory is plentiful.

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
      parallel_iterations: "auto" or an int in [1, MAX_PARALLEL_ITERATIONS] (4096; larger
        values raise ValueError, as TensorFlow reserves memory for every potential iteration).
        An int above a statically known batch size is lowered to it.
      memory_budget: bytes for "auto"; None means `DEFAULT_MEMORY_BUDGET`.
      fastemit_lambda: FastEmit weight (>= 0): the gradient of the label log-probabilities is
        scaled by `1 + fastemit_lambda`; the cost is unchanged.
      clamp: clamps d cost / d lattice (the gradient of each node's blank and label
        log-probabilities, after FastEmit, before the upstream gradient) to `[-clamp, clamp]`,
        as `tf_rnnt.flash_rnnt_loss`; off when <= 0.

    Returns:
      `[B]` float32 costs. Gradients come back in each input's dtype; half-precision inputs
      are computed in float32 inside the loop.

    Raises:
      ValueError: bad arguments or statically known shapes/dtypes (the message names the
        argument); traced for XLA (`jit_compile=True`), which cannot compile the per-sample
        shapes.
      tf.errors.InvalidArgumentError: at run time, for bad lengths, labels, blank or shapes.
      tf_rnnt.SecondOrderGradientError: when its gradient is differentiated again.
    """
    owner = _OWNER
    if _control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        raise ValueError(
            f"{owner} cannot run under XLA (jit_compile=True): its loop cuts each sample to its "
            f"own lengths, shapes XLA cannot compile. Compile this step without XLA "
            f"(tf.function(jit_compile=False), model.compile(jit_compile=False)), or use "
            f"tf_rnnt.flash_rnnt_loss, which has XLA kernels.")
    contract.check_choice(activation, contract.ACTIVATION_NAMES, "activation", owner)
    if not (isinstance(parallel_iterations, str) and parallel_iterations == "auto"):
        if isinstance(parallel_iterations, str):
            raise ValueError(f"{owner}: parallel_iterations must be 'auto' or a positive int, "
                             f"got {parallel_iterations!r}")
        parallel_iterations = contract.check_positive_int(
            parallel_iterations, "parallel_iterations", owner, "samples",
            maximum=MAX_PARALLEL_ITERATIONS, allow_none=False)
    memory_budget = contract.check_positive_number(memory_budget, "memory_budget", owner,
                                                   "bytes")
    fastemit_lambda = contract.check_fastemit_lambda(fastemit_lambda, owner)
    clamp = contract.check_clamp(clamp, owner)
    encoder, predictor, kernel, bias = (
        contract.float_tensor(x, name, owner) for name, x in
        (("encoder", encoder), ("predictor", predictor), ("kernel", kernel), ("bias", bias)))
    vocab_size = contract.static_dim(kernel, 1)
    contract.check_vocabulary_size(vocab_size, "kernel", owner)
    blank = contract.check_blank(blank, owner, vocab_size)
    labels, logit_lengths, label_lengths = (
        contract.int32_tensor(x, name, owner) for name, x in
        (("labels", labels), ("logit_lengths", logit_lengths), ("label_lengths", label_lengths)))
    contract.check_joint_dims(encoder, predictor, kernel, bias, labels, logit_lengths,
                              label_lengths, owner)
    batch = contract.static_dim(encoder, 0)
    if parallel_iterations != "auto" and batch is not None:
        parallel_iterations = max(1, min(parallel_iterations, batch))
    config = (activation, parallel_iterations, memory_budget, (fastemit_lambda, clamp))
    args = (encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths,
            tf.constant(blank, tf.int32))
    if tf.executing_eagerly():
        return loop.compiled(config)(*args)
    return loop.samplewise(config, *args)

