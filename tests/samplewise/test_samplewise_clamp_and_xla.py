"""samplewise_rnnt_loss's clamp against the float64 oracle (tests/oracle.py): d cost / d lattice
clipped to [-clamp, clamp] after FastEmit and before the upstream weights, as the compiled ops;
and a clear error under XLA, which cannot compile its per-sample shapes."""

import numpy as np
import oracle
import pytest
import tensorflow as tf

import tf_rnnt


@pytest.mark.parametrize("clamp, fastemit_lambda, weighted", [
    (0.05, 0.0, False), (0.1, 0.5, True), (-1.0, 0.0, True)])
def test_clamp_matches_oracle(clamp, fastemit_lambda, weighted):
    rng = np.random.default_rng(3)
    encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths = \
        oracle.random_joint_problem(rng, batch=3, max_t=5, max_u=3, hidden=4, vocab=6)
    upstream = np.array([0.5, 2.0, 1.5]) if weighted else np.ones(3)
    expected = oracle.flash_rnnt_loss(encoder, predictor, kernel, bias, labels, logit_lengths,
                                      label_lengths, fastemit_lambda=fastemit_lambda,
                                      clamp=clamp, upstream=upstream)
    variables = [tf.Variable(x.astype(np.float32)) for x in (encoder, predictor, kernel, bias)]
    with tf.GradientTape() as tape:
        costs = tf_rnnt.samplewise_rnnt_loss(*variables, labels, logit_lengths, label_lengths,
                                             fastemit_lambda=fastemit_lambda, clamp=clamp)
        total = tf.reduce_sum(costs * upstream.astype(np.float32))
    np.testing.assert_allclose(costs, expected[0], rtol=1e-5)
    for got, want in zip(tape.gradient(total, variables), expected[1:]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_clamp_changes_the_gradient():
    # The cases above must be able to fail: a small clamp gives another gradient than none.
    rng = np.random.default_rng(3)
    problem = oracle.random_joint_problem(rng, batch=3, max_t=5, max_u=3, hidden=4, vocab=6)
    clamped = oracle.flash_rnnt_loss(*problem, clamp=0.05)[1]
    free = oracle.flash_rnnt_loss(*problem)[1]
    assert not np.allclose(clamped, free, rtol=1e-3)


def test_under_xla_a_clear_error_names_the_fix():
    rng = np.random.default_rng(4)
    problem = [x.astype(np.float32) if x.dtype == np.float64 else x
               for x in oracle.random_joint_problem(rng, batch=2, max_t=3, max_u=2, hidden=3,
                                                    vocab=4)]
    run = tf.function(lambda *args: tf_rnnt.samplewise_rnnt_loss(*args), jit_compile=True)
    with pytest.raises(ValueError, match=r"XLA.*jit_compile=False.*flash_rnnt_loss"):
        run(*problem)
