"""Input checks that guard against silently wrong values hold with and without XLA.

Each bad input (labels padded in the middle, a Keras mask with a hole, a loss whose blank or
pad_value differs from the layer's) must fail eagerly, in a tf.function, in a
tf.function(jit_compile=True) and in model.fit after model.compile(jit_compile=True), where XLA
drops tf.debugging assertions. Oracle for the good inputs: float64 NumPy (tests/oracle.py).
"""

import keras
import numpy as np
import oracle
import pytest
import tensorflow as tf

from tf_rnnt import ops as rnnt_ops
from tf_rnnt.keras import FlashRNNTLoss, RNNTJoint, mark_lattice_padding

VOCAB, FEATURES, UNITS = 6, 4, 8
pytestmark = pytest.mark.skipif(not rnnt_ops.xla_kernels_available(),
                                reason="the op library has no XLA kernels")


def transducer(joint_kwargs=None):
    keras.utils.set_random_seed(0)
    features = keras.Input((None, FEATURES), name="features")
    labels = keras.Input((None,), dtype="int32", name="labels")
    encoder = keras.layers.Dense(5, activation="tanh")(keras.layers.Masking(0.0)(features))
    joint = RNNTJoint(VOCAB, UNITS, name="joint", **(joint_kwargs or {}))
    predictor = keras.layers.Embedding(VOCAB, 5)(joint.predictor_input()(labels))
    return keras.Model([features, labels], joint([encoder, predictor, labels])), joint


def batch(labels, hole=False):
    rng = np.random.default_rng(1)
    features = rng.uniform(0.5, 1.0, size=(len(labels), 6, FEATURES)).astype(np.float32)
    features[1, 4:] = 0.0  # sample 1 has 4 frames
    if hole:
        features[0, 2] = 0.0  # a masked frame before valid ones
    return features, np.array(labels, np.int32)


GOOD = [[1, 2, 3], [4, -1, -1]]
CASES = {
    "labels padded in the middle": (dict(), dict(), [[1, -1, 3], [4, -1, -1]], False,
                                    r"padded at the end"),
    "mask with a hole": (dict(), dict(), GOOD, True, r"mask.*prefix"),
    "loss blank differs": (dict(blank=0), dict(blank=2), GOOD, False, r"blank"),
    "loss pad_value differs": (dict(pad_value=-2), dict(pad_value=-1), [[1, 2, 3], [4, -2, -2]],
                               False, r"pad_value"),
}


def _step(model, loss, jit):
    @tf.function(jit_compile=jit)
    def step(features, labels):
        return loss(tf.cast(labels, tf.float32), model([features, labels]))
    return step


@pytest.mark.parametrize("mode", ["eager", "tf.function", "jit_compile", "fit_jit"])
@pytest.mark.parametrize("case", list(CASES))
def test_bad_inputs_fail_in_every_mode(case, mode):
    joint_kwargs, loss_kwargs, labels, hole, pattern = CASES[case]
    model, _ = transducer(joint_kwargs)
    loss = FlashRNNTLoss(**loss_kwargs)
    features, labels = batch(labels, hole)
    errors = (tf.errors.InvalidArgumentError, ValueError)
    with pytest.raises(errors, match=pattern):
        if mode == "eager":
            loss(labels.astype(np.float32), model([features, labels]))
        elif mode == "fit_jit":
            model.compile(optimizer="sgd", loss=loss, jit_compile=True)
            model.fit([features, labels], labels, batch_size=2, epochs=1, verbose=0)
        else:
            _step(model, loss, mode == "jit_compile")(features, labels)


@pytest.mark.parametrize("mode", ["tf.function", "jit_compile"])
def test_blank_mismatch_is_caught_at_run_time_when_the_lattice_is_an_argument(mode):
    # Without the layer in the traced function, only the lattice's blank code tells.
    model, _ = transducer(dict(blank=0))
    features, labels = batch(GOOD)
    lattice = model([features, labels])
    loss = FlashRNNTLoss(blank=2)
    run = tf.function(lambda y, p: loss(y, p), jit_compile=mode == "jit_compile")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"blank=2.*blank id.*\b0\b"):
        run(tf.constant(labels, tf.float32), tf.identity(lattice))


def test_good_inputs_match_the_oracle_under_xla():
    model, joint = transducer()
    features, labels = batch(GOOD)
    loss = joint.loss(reduction="none")
    costs = _step(model, loss, True)(features, labels)
    lattice = model([features, labels]).numpy().astype(np.float64)
    logit_lengths, label_lengths = np.array([6, 4]), np.array([3, 1])
    expected = oracle.lattice_loss(
        np.where(lattice > 0.5, 0.0, lattice), logit_lengths, label_lengths)[0]
    np.testing.assert_allclose(costs, expected, rtol=1e-5)


def test_hand_marked_lattice_needs_lattice_marked():
    lattice = tf.math.log(tf.fill([1, 3, 2, 2], 0.5))
    marked = mark_lattice_padding(lattice, [3], [1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="lattice='marked'"):
        FlashRNNTLoss()(np.array([[1.0]]), marked)
    expected = oracle.lattice_loss(np.log(np.full([1, 3, 2, 2], 0.5)), [3], [1])[0]
    got = FlashRNNTLoss(lattice="marked", reduction="none")(np.array([[1.0]]), marked)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
