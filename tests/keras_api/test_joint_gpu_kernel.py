"""RNNTJoint's gpu_kernel option: validated, saved in the config, passed to the joint op.

Each value gives the lattice of the layer's own full logits (`RNNTJoint.logits`, plain
TensorFlow), log-softmaxed in float64 NumPy, at every valid node.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from rnnt_testing import DEVICES

import tf_rnnt

B, T, U, V = 2, 5, 3, 7


def _inputs():
    rng = np.random.default_rng(3)
    encoder_out = rng.normal(size=(B, T, 6)).astype(np.float32)
    predictor_out = rng.normal(size=(B, U + 1, 4)).astype(np.float32)
    labels = np.array([[1, 2, 3], [4, 5, -1]], np.int32)
    frames = np.array([5, 3], np.int32)
    return encoder_out, predictor_out, labels, frames


def _expected_lattice(joint, encoder_out, predictor_out, labels, frames):
    logits = joint.logits(encoder_out, predictor_out).numpy().astype(np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    lattice = np.zeros((B, T, U + 1, 2))
    for b in range(B):
        num_labels = int((labels[b] >= 0).sum())
        for t in range(frames[b]):
            for u in range(num_labels + 1):
                lattice[b, t, u, 0] = log_probs[b, t, u, joint.blank]
                if u < num_labels:
                    lattice[b, t, u, 1] = log_probs[b, t, u, labels[b, u]]
    return lattice


@pytest.mark.parametrize("value", ["Fused", "fused-mma", "", None])
def test_bad_gpu_kernel_names_the_argument(value):
    with pytest.raises(ValueError, match="gpu_kernel"):
        tf_rnnt.keras.RNNTJoint(vocab_size=V, units=8, gpu_kernel=value)


def test_gpu_kernel_in_the_config():
    joint = tf_rnnt.keras.RNNTJoint(vocab_size=V, units=8, gpu_kernel="cublas")
    clone = tf_rnnt.keras.RNNTJoint.from_config(joint.get_config())
    assert clone.gpu_kernel == "cublas"
    assert tf_rnnt.keras.RNNTJoint(vocab_size=V, units=8).gpu_kernel == "auto"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value", ["auto", "cublas", "fused"])
def test_each_gpu_kernel_gives_the_lattice_of_the_layers_logits(device, value):
    if value == "fused" and device != "/CPU:0":
        pytest.skip("the fused kernels take 16-bit dtypes only; float32 here")
    encoder_out, predictor_out, labels, frames = _inputs()
    keras.utils.set_random_seed(0)
    joint = tf_rnnt.keras.RNNTJoint(vocab_size=V, units=8, gpu_kernel=value)
    with tf.device(device):
        lattice = joint([encoder_out, predictor_out, labels, frames]).numpy()
    expected = _expected_lattice(joint, encoder_out, predictor_out, labels, frames)
    for b in range(B):
        num_labels = int((labels[b] >= 0).sum())
        got = lattice[b, :frames[b], :num_labels + 1]
        want = expected[b, :frames[b], :num_labels + 1]
        np.testing.assert_allclose(got[..., 0], want[..., 0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got[:, :num_labels, 1], want[:, :num_labels, 1], rtol=1e-4,
                                   atol=1e-4)
