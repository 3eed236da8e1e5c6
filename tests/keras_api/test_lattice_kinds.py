"""Each loss refuses the other's input: RNNTLoss a lattice marked by RNNTJoint (V = 2 would
score it as logits), FlashRNNTLoss unmarked V = 2 logits (negative costs) unless told it is a
lattice. Oracle: float64 NumPy (tests/oracle.py)."""

import keras
import numpy as np
import oracle
import pytest
import tensorflow as tf

from tf_rnnt.keras import FlashRNNTLoss, RNNTJoint, RNNTLoss

PAD = -1


def _joint_lattice():
    keras.utils.set_random_seed(3)
    joint = RNNTJoint(2, 6, all_frames_valid=True)  # V = 2: RNNTLoss would take it as logits
    rng = np.random.default_rng(0)
    labels = np.array([[1, 1], [1, PAD]], np.int32)
    lattice = joint([rng.normal(size=(2, 4, 3)).astype(np.float32),
                     rng.normal(size=(2, 3, 3)).astype(np.float32), labels])
    return joint, labels, lattice


@pytest.mark.parametrize("mode", ["eager", "tf.function", "jit_compile"])
def test_rnnt_loss_refuses_the_joint_lattice(mode):
    _, labels, lattice = _joint_lattice()
    loss = RNNTLoss(reduction="none", all_frames_valid=True)
    if mode == "eager":
        # The tensor from the layer says where it comes from: refused at the call.
        with pytest.raises(ValueError, match="lattice of RNNTJoint"):
            loss(labels, lattice)
        return
    run = tf.function(lambda y, p: loss(y, p), jit_compile=mode == "jit_compile")
    with pytest.raises(tf.errors.InvalidArgumentError, match="lattice of RNNTJoint"):
        run(tf.constant(labels), tf.identity(lattice))


@pytest.mark.parametrize("mode", ["eager", "tf.function", "jit_compile"])
def test_two_class_logits_go_to_rnnt_loss_not_flash(mode):
    rng = np.random.default_rng(6)
    logits = rng.normal(size=(2, 4, 3, 2)).astype(np.float32)
    labels = np.array([[1, 1], [1, PAD]], np.int32)
    flash = FlashRNNTLoss(reduction="none")
    run = flash if mode == "eager" else tf.function(lambda y, p: flash(y, p),
                                                    jit_compile=mode == "jit_compile")
    with pytest.raises(tf.errors.InvalidArgumentError, match="RNNTLoss"):
        run(tf.constant(labels, tf.float32), tf.constant(logits))
    got = RNNTLoss(reduction="none", all_frames_valid=True)(labels, logits)
    expected, _ = oracle.rnnt_loss(logits, np.where(labels == PAD, 0, labels), [4, 4], [2, 1])
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert np.all(expected > 0)


def test_joint_lattice_still_trains_with_its_loss():
    joint, labels, lattice = _joint_lattice()
    costs = joint.loss(reduction="none")(labels.astype(np.float32), lattice)
    values = lattice.numpy().astype(np.float64)
    expected = oracle.lattice_loss(np.where(values > 0.5, 0.0, values), [4, 4], [2, 1])[0]
    np.testing.assert_allclose(costs, expected, rtol=1e-5)
