"""tf_rnnt.keras with a TDT joint: RNNTJoint(durations=...) and FlashTDTLoss.

Oracle: the float64 NumPy TDT recursions of tests/oracle.py on the layer's own weights.
"""

import os

import keras
import numpy as np
import oracle
import pytest
import tensorflow as tf
from test_keras import (
    ENCODER_DIM,
    FEATURES,
    PAD,
    PREDICTOR_DIM,
    UNITS,
    VOCAB,
    _oracle_joint,
    _random_joint_inputs,
    make_dataset,
    make_examples,
)

from tf_rnnt.keras import FlashRNNTLoss, FlashTDTLoss, PredictorInput, RNNTJoint

DURATIONS = [0, 1, 2, 3]


def _joint(**kwargs):
    joint = RNNTJoint(VOCAB, UNITS, durations=DURATIONS, **kwargs)
    joint.build([(None, None, ENCODER_DIM), (None, None, PREDICTOR_DIM), (None, None)])
    rng = np.random.default_rng(3)
    for v in joint.weights:  # non-zero biases, so every column matters
        v.assign(rng.normal(0.0, 0.5, size=v.shape).astype(np.float32))
    return joint


def _oracle_costs(joint, encoder_out, predictor_out, labels, frame_lengths, label_lengths,
                  sigma=0.0, upstream=None):
    logits = _oracle_joint(joint, encoder_out, predictor_out)
    clean = np.where(labels == PAD, 1, labels)
    return oracle.tdt_loss(logits, clean, frame_lengths, label_lengths, DURATIONS, 0, sigma,
                           upstream=upstream)


@pytest.mark.parametrize("mode", ["tiled", "untiled"])
def test_tdt_joint_lattice_and_loss_match_oracle(device, mode):
    joint = _joint(mode=mode, tile_size=5)
    assert joint.kernel.shape == (UNITS, VOCAB + len(DURATIONS))
    encoder_out, predictor_out, labels, _, frame_lengths, label_lengths = \
        _random_joint_inputs(np.random.default_rng(1))
    with tf.device(device):
        lattice = joint([encoder_out, predictor_out, labels, frame_lengths])
        assert lattice.shape == (3, 6, 5, 2 + len(DURATIONS))
        loss = joint.loss(sigma=0.05, reduction="none")
        assert isinstance(loss, FlashTDTLoss)
        costs = loss(labels, lattice).numpy()
    expected, _ = _oracle_costs(joint, encoder_out, predictor_out, labels, frame_lengths,
                                label_lengths, sigma=0.05)
    np.testing.assert_allclose(costs, expected, rtol=1e-5)
    # The duration channels of real nodes are a log-softmax over D entries.
    real = lattice.numpy()[0, :, :, 2:]
    np.testing.assert_allclose(np.exp(real).sum(-1), 1.0, rtol=1e-5)


def test_tdt_loss_gradients_match_oracle():
    joint = _joint()
    encoder_out, predictor_out, labels, _, frame_lengths, label_lengths = \
        _random_joint_inputs(np.random.default_rng(2))
    encoder_out = tf.constant(encoder_out)
    with tf.GradientTape() as tape:
        tape.watch(encoder_out)
        lattice = joint([encoder_out, predictor_out, labels, frame_lengths])
        total = joint.loss(sigma=0.1, reduction="sum")(labels, lattice)
    grads = tape.gradient(total, [joint.kernel, joint.bias])
    w = {v.path.split("/")[-1]: np.asarray(v.numpy(), np.float64) for v in joint.weights}
    encoder = encoder_out.numpy().astype(np.float64) @ w["encoder_kernel"] + w["encoder_bias"]
    predictor = predictor_out.astype(np.float64) @ w["predictor_kernel"]
    clean = np.where(labels == PAD, 1, labels)
    expected = oracle.flash_tdt_loss(encoder, predictor, w["kernel"], w["bias"], clean,
                                     frame_lengths, label_lengths, DURATIONS, 0, 0.1)
    np.testing.assert_allclose(total.numpy(), expected[0].sum(), rtol=1e-5)
    oracle.assert_close(grads[0].numpy(), expected[3], 1e-5, err_msg="d kernel")
    oracle.assert_close(grads[1].numpy(), expected[4], 1e-5, err_msg="d bias")


def test_tdt_loss_omega_one_is_the_rnnt_loss_of_the_token_channels():
    joint = _joint()
    encoder_out, predictor_out, labels, _, frame_lengths, _ = \
        _random_joint_inputs(np.random.default_rng(4))
    lattice = joint([encoder_out, predictor_out, labels, frame_lengths])
    rnnt = joint.loss(omega=1.0, sigma=0.3, reduction="none")(labels, lattice)
    on_tokens = FlashRNNTLoss(reduction="none", lattice="marked")(labels, lattice[..., :2])
    np.testing.assert_allclose(rnnt.numpy(), on_tokens.numpy(), rtol=1e-6)
    seeded = joint.loss(omega=0.5, seed=(3, 4), reduction="none")
    np.testing.assert_array_equal(seeded(labels, lattice).numpy(),
                                  seeded(labels, lattice).numpy())


def test_losses_reject_the_other_lattice():
    joint = _joint()
    encoder_out, predictor_out, labels, _, frame_lengths, _ = \
        _random_joint_inputs(np.random.default_rng(5))
    lattice = joint([encoder_out, predictor_out, labels, frame_lengths])
    with pytest.raises(ValueError, match="FlashTDTLoss"):
        FlashRNNTLoss()(labels, lattice)
    with pytest.raises(ValueError, match="TDT"):
        FlashTDTLoss(durations=[0, 1])(labels, lattice)
    with pytest.raises(ValueError, match="durations"):
        RNNTJoint(VOCAB, UNITS, durations=[0, 2])
    with pytest.raises(ValueError, match="omega"):
        FlashTDTLoss(durations=DURATIONS, omega=1.5)


def _tdt_transducer(seed=0):
    keras.utils.set_random_seed(seed)
    features = keras.Input((None, FEATURES), name="features")
    labels = keras.Input((None,), dtype="int32", name="labels")
    encoder = keras.layers.Masking(mask_value=0.0)(features)
    encoder = keras.layers.LSTM(ENCODER_DIM, return_sequences=True)(encoder)
    predictor = PredictorInput()(labels)
    predictor = keras.layers.Embedding(VOCAB, PREDICTOR_DIM)(predictor)
    predictor = keras.layers.LSTM(PREDICTOR_DIM, return_sequences=True)(predictor)
    joint = RNNTJoint(VOCAB, UNITS, name="joint", durations=DURATIONS)
    model = keras.Model([features, labels], joint([encoder, predictor, labels]))
    return model, joint


def test_tdt_model_fits_and_round_trips_through_keras_saving(tmp_path):
    model, joint = _tdt_transducer()
    model.compile(optimizer=keras.optimizers.Adam(0.02), loss=joint.loss(sigma=0.05, omega=0.1))
    dataset = make_dataset(make_examples(16, seed=21), batch_size=4)
    history = model.fit(dataset, epochs=6, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    path = os.path.join(tmp_path, "tdt.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.loss, FlashTDTLoss)
    assert loaded.loss.get_config() == model.loss.get_config()
    loaded_joint = loaded.get_layer("joint")
    assert loaded_joint.get_config() == joint.get_config()
    assert loaded_joint.durations == DURATIONS
    (features, labels), _ = next(iter(dataset))
    np.testing.assert_array_equal(model([features, labels]), loaded([features, labels]))
