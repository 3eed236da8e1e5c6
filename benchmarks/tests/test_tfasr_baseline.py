"""benchmarks/tfasr_baseline.py: TensorFlowASR's pure-TF RNN-T loss, loaded from its file under
Keras 3, against tf_rnnt's op (costs) and tf_rnnt.reference's autodiff (gradients) on the CPU.

Skipped where TensorFlowASR is not installed (a `--no-deps --target <venv>/tfasr` install, or
TFASR_PATH): it is a benchmark baseline, not a dependency of the package.
"""

import os
import sys

import numpy as np
import pytest
import tfasr_baseline

_BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_FOUND, _WHY = tfasr_baseline.available()
pytestmark = pytest.mark.skipif(not _FOUND, reason=f"TensorFlowASR not installed: {_WHY}")


def _case(seed, batch=3, frames=7, labels=5, vocab=9):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=2.0, size=(batch, frames, labels + 1, vocab)).astype(np.float32)
    logit_lengths = np.array([frames, frames - 2, 1][:batch], np.int32)
    label_lengths = np.array([labels, 2, 0][:batch], np.int32)
    ids = rng.integers(1, vocab, size=(batch, labels)).astype(np.int32)
    ids[np.arange(labels)[None, :] >= label_lengths[:, None]] = -1
    return logits, ids, logit_lengths, label_lengths


@pytest.mark.parametrize("seed", [0, 1])
def test_costs_and_gradients_match_tf_rnnt(seed):
    import tensorflow as tf

    import tf_rnnt
    from tf_rnnt import reference

    logits, ids, logit_lengths, label_lengths = _case(seed)
    x = tf.constant(logits)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        got = tfasr_baseline.tfasr_rnnt_loss(x, ids, logit_lengths, label_lengths)
        expected_ref = reference.rnnt_loss(x, np.maximum(ids, 0), logit_lengths, label_lengths)
        total, total_ref = tf.reduce_sum(got), tf.reduce_sum(expected_ref)
    expected = tf_rnnt.rnnt_loss(logits, np.maximum(ids, 0), logit_lengths, label_lengths)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)
    grad, grad_ref = tape.gradient(total, x).numpy(), tape.gradient(total_ref, x).numpy()
    # Only the valid nodes carry gradient (the reference's padded nodes are zero as well).
    np.testing.assert_allclose(grad, grad_ref, rtol=1e-4, atol=1e-4)
    assert np.abs(grad).max() > 1e-3


def test_keras_loss_reads_the_frame_mask_and_label_padding():
    import tensorflow as tf

    import tf_rnnt

    logits, ids, logit_lengths, label_lengths = _case(2)
    y_pred = tf.constant(logits)
    y_pred._keras_mask = tf.sequence_mask(logit_lengths, logits.shape[1])
    loss = tfasr_baseline.make_loss_class()(reduction=None)
    got = loss(tf.constant(ids, tf.float32), y_pred)
    expected = tf_rnnt.rnnt_loss(logits, np.maximum(ids, 0), logit_lengths, label_lengths)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)


def test_loading_leaves_keras_and_sys_modules_alone():
    import keras

    build = keras.layers.Layer.build
    module = tfasr_baseline.load()
    assert module.tfasr_version == tfasr_baseline.TFASR_VERSION
    assert keras.layers.Layer.build is build
    assert not [name for name in sys.modules if name.startswith("tensorflow_asr")]
