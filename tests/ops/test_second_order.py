"""Second-order gradients.

The compiled ops and samplewise_rnnt_loss compute their gradients in hand-written kernels or
loops that are not themselves differentiable: differentiating such a gradient again must raise
tf_rnnt.SecondOrderGradientError naming the entry point (never return zeros, never a bare
LookupError), eagerly and inside tf.function (where AutoGraph may wrap it in a StagingError
that carries the same message). tf_rnnt.reference is plain autodiff: its Hessian-vector
products are checked against central differences of the float64 NumPy oracle's gradient.
"""

import numpy as np
import oracle
import pytest
import tensorflow as tf

import tf_rnnt
from tf_rnnt import reference

SHAPE = (2, 4, 2, 3, 5)  # B, T, U, H, V


def _problem():
    return oracle.float32_joint_problem(7, SHAPE)


def _joint_args():
    encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths = _problem()
    floats = [tf.constant(x, tf.float32) for x in (encoder, predictor, kernel, bias)]
    return floats, [tf.constant(x) for x in (labels, logit_lengths, label_lengths)]


def _logits_args():
    encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths = _problem()
    logits = oracle.joint_logits(encoder, predictor, kernel, bias)
    return [tf.constant(logits, tf.float32)], [tf.constant(x) for x in
                                               (labels, logit_lengths, label_lengths)]


def _lattice_args():
    encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths = _problem()
    lattice = oracle.lattice_from_logits(oracle.joint_logits(encoder, predictor, kernel, bias),
                                         labels)
    return [tf.constant(lattice, tf.float32)], [tf.constant(x) for x in
                                                (logit_lengths, label_lengths)]


# entry point -> (float inputs, other inputs, costs of them)
CASES = {
    "lattice_loss": (_lattice_args, lambda f, i: tf_rnnt.lattice_loss(*f, *i)),
    "rnnt_loss": (_logits_args, lambda f, i: tf_rnnt.rnnt_loss(*f, *i)),
    "logits_to_lattice": (_logits_args,
                          lambda f, i: tf.reduce_sum(tf_rnnt.logits_to_lattice(f[0], i[0])
                                                     ** 2, [1, 2, 3])),
    "joint_lattice": (_joint_args,
                      lambda f, i: tf.reduce_sum(tf_rnnt.joint_lattice(*f, *i) ** 2, [1, 2, 3])),
    "flash_rnnt_loss": (_joint_args, lambda f, i: tf_rnnt.flash_rnnt_loss(*f, *i)),
    "flash_rnnt_loss_untiled": (_joint_args,
                                lambda f, i: tf_rnnt.flash_rnnt_loss(*f, *i, mode="untiled")),
    "samplewise_rnnt_loss": (_joint_args, lambda f, i: tf_rnnt.samplewise_rnnt_loss(
        *f, *i, parallel_iterations=1)),
}


def _gradient_norm_gradient(loss_fn, floats, others):
    """d/d inputs of sum(grad^2), grad = d sum(costs) / d inputs: a second-order quantity."""
    with tf.GradientTape() as outer:
        outer.watch(floats)
        with tf.GradientTape() as inner:
            inner.watch(floats)
            total = tf.reduce_sum(loss_fn(floats, others))
        grads = inner.gradient(total, floats)
        norm = tf.add_n([tf.reduce_sum(g * g) for g in grads])
    return outer.gradient(norm, floats)


@pytest.mark.parametrize("graph_mode", ["eager", "function"])
@pytest.mark.parametrize("entry", sorted(CASES))
def test_second_order_raises_a_clear_error(entry, graph_mode):
    make_args, loss_fn = CASES[entry]
    floats, others = make_args()
    fn = lambda f, o: _gradient_norm_gradient(loss_fn, f, o)  # noqa: E731
    if graph_mode == "function":
        fn = tf.function(fn)
    expected = (tf_rnnt.SecondOrderGradientError if graph_mode == "eager" else Exception)
    with pytest.raises(expected) as info:
        fn(floats, others)
    message = str(info.value)
    assert "second-order gradients are not supported" in message, message
    assert entry.replace("_untiled", "") in message, message


@pytest.mark.parametrize("entry", sorted(CASES))
def test_first_order_gradient_is_unaffected(entry):
    make_args, loss_fn = CASES[entry]
    floats, others = make_args()
    with tf.GradientTape() as tape:
        tape.watch(floats)
        total = tf.reduce_sum(loss_fn(floats, others))
    grads = tape.gradient(total, floats)
    assert all(g is not None and np.all(np.isfinite(g.numpy())) for g in grads)
    assert any(np.any(g.numpy() != 0) for g in grads)


def test_reference_hessian_vector_product_matches_oracle():
    fastemit_lambda = 0.0
    encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths = _problem()
    logits = oracle.joint_logits(encoder, predictor, kernel, bias)
    direction = np.random.default_rng(3).normal(size=logits.shape)
    eps = 1e-4

    def oracle_grad(x):
        return oracle.rnnt_loss(x, labels, logit_lengths, label_lengths,
                                fastemit_lambda=fastemit_lambda)[1]

    expected = (oracle_grad(logits + eps * direction)
                - oracle_grad(logits - eps * direction)) / (2 * eps)
    x = tf.constant(logits, tf.float32)
    v = tf.constant(direction, tf.float32)
    with tf.GradientTape() as outer:
        outer.watch(x)
        with tf.GradientTape() as inner:
            inner.watch(x)
            total = tf.reduce_sum(reference.rnnt_loss(x, labels, logit_lengths, label_lengths,
                                                      fastemit_lambda=fastemit_lambda))
        directional = tf.reduce_sum(inner.gradient(total, x) * v)
    got = outer.gradient(directional, x).numpy()
    assert np.abs(expected).max() > 1e-2  # a real curvature, not a vacuous zero
    oracle.assert_close(got, expected, rtol=1e-3)
