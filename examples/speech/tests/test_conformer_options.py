"""examples/speech/conformer.py's speed options against the default model with the same weights:
`attention="dot_product"` (Keras' `dot_product_attention` path) and the predictor's
`lstm_use_cudnn=False` / `lstm_unroll=True` give the default's lattice (and, for the attention,
its gradients) within float tolerance."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from rnnt_testing import load_module

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


conformer = load_module("conformer_options_under_test",
                        os.path.join(REPO, "examples", "speech", "conformer.py"))
_LABELS = 4


def _batch(sizes, seed=0):
    rng = np.random.default_rng(seed)
    bins, vocab = sizes["num_mel_bins"], sizes["vocab_size"]
    feature_lengths = np.array([36, 21, 29], np.int32)
    label_lengths = np.array([4, 1, 3])
    labels = rng.integers(1, vocab, size=(3, _LABELS)).astype(np.int32)
    labels[np.arange(_LABELS)[None, :] >= label_lengths[:, None]] = -1
    features = rng.normal(size=(3, 36, bins)).astype(np.float32)
    return {"features": features, "feature_lengths": feature_lengths, "labels": labels}


def _pair(policy="float32", dropout=0.0, **option):
    """(default model, model with `option`) holding the same weights."""
    keras.mixed_precision.set_global_policy(policy)
    try:
        sizes = dict(conformer.TINY, dropout=dropout, max_labels=_LABELS)
        keras.utils.set_random_seed(5)
        default = conformer.build_conformer_transducer(**sizes)
        other = conformer.build_conformer_transducer(**sizes, **option)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert len(default.weights) == len(other.weights)
    other.set_weights(default.get_weights())
    return default, other


def _valid(lattice, batch):
    """The valid nodes' values (padded nodes hold markers, not log-probabilities)."""
    frames = np.asarray(conformer.output_lengths(batch["feature_lengths"]))
    labels = (batch["labels"] >= 0).sum(1)
    return np.concatenate([lattice[b, :frames[b], :labels[b] + 1].ravel()
                           for b in range(len(frames))])


@pytest.mark.parametrize("option", [
    {"attention": "dot_product"},
    {"lstm_use_cudnn": False},
    {"lstm_unroll": True},
])
def test_option_gives_the_default_lattice(option):
    default, other = _pair(**option)
    batch = _batch(conformer.TINY)
    for training in (False, True):  # dropout 0: training mode differs only in batch norm
        want = _valid(default(batch, training=training).numpy(), batch)
        got = _valid(other(batch, training=training).numpy(), batch)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dot_product_attention_gives_the_default_gradients():
    default, other = _pair(attention="dot_product")
    batch = _batch(conformer.TINY, seed=1)
    grads = []
    for model in (default, other):
        with tf.GradientTape() as tape:
            lattice = model(batch, training=True)
            total = tf.reduce_sum(_valid_mask(lattice, batch) * lattice)
        grads.append(tape.gradient(total, model.trainable_weights))
    for want, got, weight in zip(*grads, default.trainable_weights):
        np.testing.assert_allclose(tf.convert_to_tensor(got), tf.convert_to_tensor(want),
                                   rtol=1e-4, atol=1e-5,
                                   err_msg=weight.path)


def _valid_mask(lattice, batch):
    frames = conformer.output_lengths(batch["feature_lengths"])
    labels = tf.reduce_sum(tf.cast(batch["labels"] >= 0, tf.int32), 1) + 1
    mask = (tf.sequence_mask(frames, tf.shape(lattice)[1])[:, :, None] &
            tf.sequence_mask(labels, tf.shape(lattice)[2])[:, None, :])
    return tf.cast(mask, lattice.dtype)[..., None]


def test_dot_product_attention_under_mixed_bfloat16():
    default, other = _pair("mixed_bfloat16", attention="dot_product")
    batch = _batch(conformer.TINY, seed=2)
    want = _valid(default(batch, training=False).numpy().astype(np.float32), batch)
    got = _valid(other(batch, training=False).numpy().astype(np.float32), batch)
    # bfloat16 keeps 8 bits: both paths round the scores and probabilities differently.
    np.testing.assert_allclose(got, want, rtol=0.05, atol=0.05)
    assert np.mean(np.abs(got - want)) < 0.02


def test_dropout_on_the_attention_probabilities_only_in_the_keras_path():
    block = conformer.ConformerBlock(32, 4, 64, 5, dropout=0.1, attention="dot_product")
    assert block.attention._dropout == 0.0 and block.attention_drop.rate == 0.1
    assert conformer.ConformerBlock(32, 4, 64, 5, dropout=0.1).attention._dropout == 0.1
    with pytest.raises(ValueError, match="attention"):
        conformer.ConformerBlock(32, 4, 64, 5, attention="flash")
    with pytest.raises(ValueError, match="max_labels"):
        conformer.build_conformer_transducer(**conformer.TINY, lstm_unroll=True)
