"""NeMo's reduction names with NeMo's meaning (against NumPy on float64 oracle costs), and
conv_output_lengths' default padding against real Keras layers."""

import keras
import numpy as np
import oracle
import pytest
import tensorflow as tf
from rnnt_testing import padded_rnnt_problem

from tf_rnnt.keras import FlashRNNTLoss, RNNTLoss, conv_output_lengths, mark_lattice_padding

VOCAB, PAD = 5, -1


def _problem():
    return padded_rnnt_problem(11, [5, 2, 4], VOCAB, PAD)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("reduction", ["mean_volume", "mean_batch", "mean"])
def test_nemo_reductions(reduction, weighted):
    logits, labels, frame_lengths, label_lengths, costs = _problem()
    weights = np.array([0.5, 2.0, 1.0]) if weighted else np.ones(3)
    weighted_costs = costs * weights
    expected = {
        "mean_volume": weighted_costs.sum() / label_lengths.sum(),  # NeMo: sum / sum of lengths
        "mean_batch": weighted_costs.mean(),  # NeMo: mean over the batch
        "mean": weighted_costs.sum() / 3,  # Keras' mean (not NeMo's length-normalized mean)
    }[reduction]
    masked = tf.identity(logits)
    masked._keras_mask = tf.sequence_mask(frame_lengths, 5)
    sample_weight = weights.astype(np.float32) if weighted else None
    got = RNNTLoss(reduction=reduction)(labels, masked, sample_weight=sample_weight)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    lattice = oracle.lattice_from_logits(logits, np.where(labels == PAD, 0, labels))
    marked = mark_lattice_padding(lattice.astype(np.float32), frame_lengths, label_lengths)
    loss = FlashRNNTLoss(reduction=reduction, lattice="marked")
    np.testing.assert_allclose(loss(labels, marked, sample_weight=sample_weight), expected,
                               rtol=1e-5)
    config = loss.get_config()
    assert config["reduction"] == reduction
    assert FlashRNNTLoss.from_config(config).get_config() == config


def test_unknown_reduction_lists_the_accepted_ones():
    with pytest.raises(ValueError, match="mean_volume.*mean_batch"):
        RNNTLoss(reduction="mean_tokens")


@pytest.mark.parametrize("layer, args", [
    (keras.layers.Conv1D, dict(filters=2, kernel_size=3, strides=2)),
    (keras.layers.Conv1D, dict(filters=2, kernel_size=4, strides=3)),
    (keras.layers.MaxPooling1D, dict(pool_size=3, strides=2)),
    (keras.layers.AveragePooling1D, dict(pool_size=2)),
])
def test_default_padding_is_keras_default(layer, args):
    kernel = args.get("kernel_size", args.get("pool_size"))
    strides = args.get("strides", kernel)
    for length in range(kernel, 15):
        out = layer(**args)(np.zeros((1, length, 2), np.float32))
        got = int(conv_output_lengths(np.array([length]), kernel, strides)[0])
        assert got == out.shape[1], (layer.__name__, length)
