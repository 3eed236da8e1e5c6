"""Messages that say what is wrong and the fix: fit without targets, and targets that differ
from the labels input of RNNTJoint (not only a pad_value mismatch)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_rnnt.keras import RNNTJoint

VOCAB = 6


def transducer():
    keras.utils.set_random_seed(0)
    features = keras.Input((None, 4))
    labels = keras.Input((None,), dtype="int32")
    joint = RNNTJoint(VOCAB, 8, all_frames_valid=True)
    predictor = keras.layers.Embedding(VOCAB, 5)(joint.predictor_input()(labels))
    model = keras.Model([features, labels], joint([keras.layers.Dense(5)(features), predictor,
                                                   labels]))
    model.compile(optimizer="sgd", loss=joint.loss())
    return model


def data():
    features = np.random.default_rng(0).normal(size=(2, 5, 4)).astype(np.float32)
    return features, np.array([[1, 2, 3], [4, -1, -1]], np.int32)


def test_fit_without_targets_says_to_pass_the_labels():
    features, labels = data()
    with pytest.raises(ValueError, match=r"no targets.*model.fit\(\[features, \.\.\., labels\], "
                                         r"labels\)"):
        transducer().fit([features, labels], None, epochs=1, verbose=0)


def test_targets_other_than_the_labels_input_are_named():
    features, labels = data()
    other = np.array([[1, 2, -1], [4, 5, -1]], np.int32)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"targets `y` given to fit differ from the labels input"):
        transducer().fit([features, labels], other, epochs=1, verbose=0)
