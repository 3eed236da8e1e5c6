"""tf_rnnt.keras lengths and settings: conv_output_lengths, LengthMask, PredictorInput, the frame
lengths of RNNTJoint, blank and pad_value set once, the per_token reduction, V = 2 logits, and
.keras files loaded after `import tf_rnnt`.

Oracles: the real Keras layers run on each unpadded sample alone (lengths), and for costs each
sample run alone, unpadded, through the same encoder and predictor, scored by
tf_rnnt.reference on the full logits of `joint.logits`; tests/oracle.py for losses on logits.
"""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import oracle
import pytest
import tensorflow as tf
from rnnt_testing import REPO_ROOT, padded_rnnt_problem, pythonpath

from tf_rnnt import reference
from tf_rnnt.keras import (
    FlashRNNTLoss,
    LengthMask,
    PredictorInput,
    RNNTJoint,
    RNNTLoss,
    conv_output_lengths,
    lattice_lengths,
)

VOCAB = 6
FEATURES = 3
PAD = -1


# ----------------------------------------------------------------------------------------------
# conv_output_lengths against the real Keras layers.
# ----------------------------------------------------------------------------------------------
def _keras_frames(layer, length, channels=1):
    """Output frames of `layer` on one unpadded sample of `length` frames (0 if Keras refuses).

    Keras' shape check refuses an empty output first: run on one, TensorFlow's oneDNN pooling
    fails or crashes, depending on the CPU.
    """
    try:
        layer.compute_output_shape((1, length, channels))
        return int(layer(np.ones((1, length, channels), np.float32)).shape[1])
    except (ValueError, tf.errors.InvalidArgumentError):
        return 0


@pytest.mark.parametrize("padding", ["valid", "same", "causal"])
@pytest.mark.parametrize("kernel_size, strides, dilation_rate",
                         [(1, 1, 1), (3, 1, 1), (3, 2, 1), (2, 2, 1), (5, 3, 1), (4, 1, 3),
                          (3, 1, 2)])  # Keras Conv1D takes no strides > 1 with dilation > 1
def test_conv_output_lengths_match_conv1d(padding, kernel_size, strides, dilation_rate):
    conv = keras.layers.Conv1D(1, kernel_size, strides=strides, padding=padding,
                               dilation_rate=dilation_rate)
    lengths = np.arange(1, 14, dtype=np.int32)
    expected = [_keras_frames(conv, int(n)) for n in lengths]
    got = conv_output_lengths(lengths, kernel_size, strides, padding, dilation_rate)
    np.testing.assert_array_equal(got, expected)
    assert int(conv_output_lengths(np.int32(0), kernel_size, strides, padding,
                                   dilation_rate)) == 0


@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize("pool_size, strides", [(2, 2), (3, 2), (2, 1), (4, 3)])
def test_conv_output_lengths_match_pooling(padding, pool_size, strides):
    pool = keras.layers.MaxPooling1D(pool_size, strides=strides, padding=padding)
    lengths = np.arange(1, 12, dtype=np.int32)
    expected = [_keras_frames(pool, int(n)) for n in lengths]
    np.testing.assert_array_equal(conv_output_lengths(lengths, pool_size, strides, padding),
                                  expected)


def test_conv_output_lengths_of_stacked_layers_and_conv2d_time_axis():
    layers = [keras.layers.Conv2D(2, (3, 3), strides=(2, 2), padding="same"),
              keras.layers.Conv2D(2, (3, 3), strides=(2, 1), padding="valid"),
              keras.layers.Conv2D(2, (5, 1), strides=(3, 1), padding="same")]
    stack = keras.Sequential(layers)
    lengths = np.arange(5, 30, dtype=np.int64)
    expected = [int(stack(np.ones((1, n, 8, 1), np.float32)).shape[1]) for n in lengths]
    got = conv_output_lengths(lengths, [3, 3, 5], [2, 2, 3], ["same", "valid", "same"])
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == tf.int64


def test_conv_output_lengths_in_a_functional_model():
    lengths_in = keras.Input((), dtype="int32")
    model = keras.Model(lengths_in, conv_output_lengths(lengths_in, 3, 2, "causal"))
    np.testing.assert_array_equal(model(np.array([1, 2, 7, 8], np.int32)), [1, 1, 4, 4])


def test_conv_output_lengths_rejects_bad_settings():
    with pytest.raises(ValueError, match="equal lengths"):
        conv_output_lengths(np.array([4]), [3, 3], [2, 2, 2])
    with pytest.raises(ValueError, match="padding"):
        conv_output_lengths(np.array([4]), 3, 2, "full")
    with pytest.raises(ValueError, match="strides"):
        conv_output_lengths(np.array([4]), 3, 0)


# ----------------------------------------------------------------------------------------------
# LengthMask and PredictorInput.
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3, 5, 2), (3, 5, 4, 2)], ids=["rank3", "rank4"])
def test_length_mask_zeros_padding_and_sets_the_mask(shape):
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    lengths = np.array([5, 0, 2], np.int32)
    layer = LengthMask()
    out = layer([x, lengths]).numpy()
    mask = np.arange(5)[None, :] < lengths[:, None]
    np.testing.assert_array_equal(layer.compute_mask([x, lengths]), mask)
    np.testing.assert_array_equal(out[mask], x[mask])
    np.testing.assert_array_equal(out[~mask], 0.0)
    np.testing.assert_array_equal(LengthMask(zero_padding=False)([x, lengths]), x)


def test_length_mask_feeds_a_masking_aware_layer():
    # A backward LSTM over the masked sequence equals the LSTM over each sample alone.
    keras.utils.set_random_seed(0)
    x_in, len_in = keras.Input((None, 2)), keras.Input((), dtype="int32")
    lstm = keras.layers.LSTM(3, go_backwards=True)
    model = keras.Model([x_in, len_in], lstm(LengthMask()([x_in, len_in])))
    x = np.random.default_rng(1).normal(size=(2, 6, 2)).astype(np.float32) + 5.0
    lengths = np.array([6, 3], np.int32)
    out = model([x, lengths]).numpy()
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(out[b], lstm(x[b:b + 1, :n])[0], rtol=1e-5, atol=1e-6)


def test_predictor_input_values_and_mask():
    labels = np.array([[3, 1, 2], [4, PAD, PAD], [PAD, PAD, PAD]], np.int32)
    layer = PredictorInput(blank=0)
    np.testing.assert_array_equal(layer(labels), [[0, 3, 1, 2], [0, 4, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(layer.compute_mask(labels), [[1, 1, 1, 1], [1, 1, 0, 0],
                                                               [1, 0, 0, 0]])
    layer = PredictorInput(blank=-1, pad_value=-2, vocab_size=VOCAB)
    np.testing.assert_array_equal(layer(np.array([[0, 2, -2]], np.int32)), [[5, 0, 2, 5]])
    with pytest.raises(ValueError, match="vocab_size"):
        PredictorInput(blank=-1)
    assert RNNTJoint(VOCAB, 4, blank=-1, pad_value=-3).predictor_input().get_config()[
        "blank"] == VOCAB - 1


def test_predictor_input_in_a_functional_model_with_unknown_u():
    labels_in = keras.Input((None,), dtype="int32")
    ids = PredictorInput()(labels_in)
    assert tuple(ids.shape) == (None, None) and ids.dtype == "int32"
    model = keras.Model(labels_in, ids)
    for num_labels in (1, 4):
        labels = np.full((2, num_labels), PAD, np.int32)
        labels[0] = np.arange(1, num_labels + 1)
        expected = np.zeros((2, num_labels + 1), np.int32)
        expected[0, 1:] = np.arange(1, num_labels + 1)
        np.testing.assert_array_equal(model(labels), expected)
    clone = PredictorInput.from_config(PredictorInput(blank=2, pad_value=-5).get_config())
    assert (clone.blank, clone.pad_value) == (2, -5)


# ----------------------------------------------------------------------------------------------
# A subsampling encoder: costs of a padded batch equal each sample's unpadded cost.
# ----------------------------------------------------------------------------------------------
def _subsampling_transducer(encoder_kind, seed=0, joint_kwargs=None):
    """features [B, T, F] + lengths [B] -> two stride-2 convolutions -> LSTM -> RNNTJoint.

    encoder_kind: "lengths" (frame lengths as RNNTJoint's 4th input), "mask" (LengthMask, then
    a Bidirectional LSTM that needs the mask, no 4th input) or "valid_same" (a "valid" stride-2
    convolution, LengthMask zeroing the padding, a "same" stride-1 convolution).
    Returns the model and a model of the same layers giving [encoder_out, predictor_out].
    """
    keras.utils.set_random_seed(seed)
    features = keras.Input((None, FEATURES), name="features")
    feature_lengths = keras.Input((), dtype="int32", name="feature_lengths")
    labels = keras.Input((None,), dtype="int32", name="labels")
    joint = RNNTJoint(VOCAB, 8, name="joint", **(joint_kwargs or {}))
    if encoder_kind == "valid_same":
        x = keras.layers.Conv1D(6, 3, strides=2, padding="valid", activation="relu")(features)
        lengths = conv_output_lengths(feature_lengths, 3, 2, "valid")
        x = LengthMask()([x, lengths])
        x = keras.layers.Conv1D(6, 3, padding="same")(x)
    else:
        x = keras.layers.Conv1D(6, 3, strides=2, padding="causal", activation="relu")(features)
        x = keras.layers.Conv1D(6, 3, strides=2, padding="causal")(x)
        lengths = conv_output_lengths(feature_lengths, [3, 3], [2, 2], "causal")
    if encoder_kind == "mask":
        x = LengthMask()([x, lengths])
        encoder = keras.layers.Bidirectional(keras.layers.LSTM(4, return_sequences=True))(x)
    else:
        encoder = keras.layers.LSTM(8, return_sequences=True)(x)
    predictor = joint.predictor_input()(labels)
    predictor = keras.layers.Embedding(VOCAB, 4)(predictor)
    predictor = keras.layers.LSTM(5, return_sequences=True)(predictor)
    if encoder_kind == "mask":
        lattice = joint([encoder, predictor, labels])
    else:
        lattice = joint([encoder, predictor, labels, lengths])
    inputs = [features, feature_lengths, labels]
    return keras.Model(inputs, lattice), keras.Model(inputs, [encoder, predictor])


def _padded_batch(seed, frame_lengths=(17, 9, 12, 6), label_lengths=(3, 1, 0, 2), pad=PAD):
    rng = np.random.default_rng(seed)
    batch, max_t, max_u = len(frame_lengths), max(frame_lengths), max(label_lengths)
    features = np.zeros((batch, max_t, FEATURES), np.float32)
    labels = np.full((batch, max_u), pad, np.int32)
    for b, (n, u) in enumerate(zip(frame_lengths, label_lengths)):
        # Padding holds large values: any frame that leaks into a valid one changes the cost.
        features[b, n:] = 50.0
        features[b, :n] = rng.normal(size=(n, FEATURES))
        labels[b, :u] = rng.integers(1, VOCAB - 1, size=u)  # neither 0 nor V - 1
    return features, np.array(frame_lengths, np.int32), labels


def unpadded_reference_costs(parts_model, joint, features, frame_lengths, labels, pad=PAD):
    """Each sample alone, unpadded, through the model's layers; its cost by the reference."""
    costs = []
    for b, n in enumerate(frame_lengths):
        sample_labels = labels[b:b + 1][:, labels[b] != pad]
        encoder, predictor = parts_model([features[b:b + 1, :n], frame_lengths[b:b + 1],
                                          sample_labels])
        logits = joint.logits(encoder, predictor)
        costs.append(float(reference.rnnt_loss(logits, sample_labels, [encoder.shape[1]],
                                               [sample_labels.shape[1]],
                                               blank=joint.blank)[0]))
    return np.array(costs)


@pytest.mark.parametrize("encoder_kind", ["lengths", "mask", "valid_same"])
def test_subsampling_encoder_costs_equal_unpadded_costs(encoder_kind):
    model, parts = _subsampling_transducer(encoder_kind)
    features, frame_lengths, labels = _padded_batch(1)
    joint = model.get_layer("joint")
    lattice = model([features, frame_lengths, labels])
    subsampled = conv_output_lengths(frame_lengths, [3, 3], [2, 2], "causal") \
        if encoder_kind != "valid_same" else conv_output_lengths(frame_lengths, 3, 2, "valid")
    np.testing.assert_array_equal(lattice_lengths(lattice)[0], subsampled)
    costs = joint.loss(reduction="none")(labels, lattice)
    expected = unpadded_reference_costs(parts, joint, features, frame_lengths, labels)
    np.testing.assert_allclose(costs, expected, rtol=1e-5)


def test_subsampling_encoder_without_lengths_is_refused():
    # Keras drops the Masking mask at the strided Conv1D: the joint must not take T frames.
    features = keras.Input((None, FEATURES))
    labels = keras.Input((None,), dtype="int32")
    x = keras.layers.Masking()(features)
    x = keras.layers.Conv1D(6, 3, strides=2, padding="same")(x)
    encoder = keras.layers.LSTM(8, return_sequences=True)(x)
    predictor = keras.layers.Embedding(VOCAB, 4)(PredictorInput()(labels))
    with pytest.raises(ValueError, match=r"no frame lengths.*4th input.*LengthMask"
                                         r".*conv_output_lengths.*all_frames_valid"):
        RNNTJoint(VOCAB, 8)([encoder, predictor, labels])
    with pytest.raises(ValueError, match=r"RNNTLoss: no frame lengths.*y_pred"):
        RNNTLoss()(np.array([[1]]), tf.zeros([1, 3, 2, VOCAB]))


def test_explicit_lengths_take_precedence_over_the_mask():
    rng = np.random.default_rng(2)
    encoder_out = rng.normal(size=(2, 5, 3)).astype(np.float32)
    predictor_out = rng.normal(size=(2, 3, 4)).astype(np.float32)
    labels = np.array([[1, 2], [3, PAD]], np.int32)
    mask = tf.ones([2, 5], tf.bool)
    lattice = RNNTJoint(VOCAB, 4)([encoder_out, predictor_out, labels, np.array([4, 2])],
                                  mask=[mask, None, None, None])
    frames, label_lengths = lattice_lengths(lattice)
    np.testing.assert_array_equal(frames, [4, 2])
    np.testing.assert_array_equal(label_lengths, [2, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="logit_lengths exceed"):
        RNNTJoint(VOCAB, 4)([encoder_out, predictor_out, labels, np.array([6, 2])])


# ----------------------------------------------------------------------------------------------
# Blank and pad_value set once, on the layer.
# ----------------------------------------------------------------------------------------------
def test_default_loss_takes_the_layers_blank_and_pad_value():
    model, parts = _subsampling_transducer("lengths", joint_kwargs=dict(blank=-1, pad_value=-2))
    features, frame_lengths, labels = _padded_batch(3, pad=-2)
    labels[0, 0] = 0  # a label id, as the blank is V - 1
    joint = model.get_layer("joint")
    expected = unpadded_reference_costs(parts, joint, features, frame_lengths, labels, pad=-2)
    lattice = model([features, frame_lengths, labels])
    for loss in (FlashRNNTLoss(reduction="none"), joint.loss(reduction="none")):
        np.testing.assert_allclose(loss(labels.astype(np.float32), lattice), expected, rtol=1e-5)
    model.compile(optimizer="sgd", loss=FlashRNNTLoss())
    model.fit([features, frame_lengths, labels], labels, batch_size=4, epochs=1, verbose=0)


@pytest.mark.parametrize("joint_kwargs, loss_kwargs, pattern", [
    (dict(blank=-1), dict(blank=0),
     r"FlashRNNTLoss\(blank=0\) differs from the blank of the RNNTJoint.*\(5\).*joint.loss"),
    (dict(pad_value=-2), dict(pad_value=-1),
     r"FlashRNNTLoss\(pad_value=-1\) differs from the pad_value of the RNNTJoint.*joint.loss"),
])
def test_mismatched_layer_and_loss_settings_fail_at_the_first_step(joint_kwargs, loss_kwargs,
                                                                   pattern):
    # Both settings are known when the step is traced: a ValueError before anything runs.
    model, _ = _subsampling_transducer("lengths", joint_kwargs=joint_kwargs)
    pad = joint_kwargs.get("pad_value", PAD)
    features, frame_lengths, labels = _padded_batch(4, pad=pad)
    model.compile(optimizer="sgd", loss=FlashRNNTLoss(**loss_kwargs))
    with pytest.raises(ValueError, match=pattern):
        model.fit([features, frame_lengths, labels], labels, batch_size=4, epochs=1, verbose=0)


# ----------------------------------------------------------------------------------------------
# The per_token reduction (NeMo's mean_volume) and V = 2 logits.
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_per_token_reduction_matches_oracle(weighted):
    logits, labels, frame_lengths, label_lengths, costs = padded_rnnt_problem(5, [4, 2, 3], VOCAB,
                                                                              PAD)
    weights = np.array([0.5, 2.0, 1.0], np.float32) if weighted else None
    expected = np.sum(costs * (1.0 if weights is None else weights)) / label_lengths.sum()
    masked = tf.identity(logits)
    masked._keras_mask = tf.sequence_mask(frame_lengths, 4)
    np.testing.assert_allclose(
        RNNTLoss(reduction="per_token")(labels, masked, sample_weight=weights), expected,
        rtol=1e-5)
    lattice = oracle.lattice_from_logits(logits, np.where(labels == PAD, 0, labels))
    from tf_rnnt.keras import mark_lattice_padding
    marked = mark_lattice_padding(lattice.astype(np.float32), frame_lengths, label_lengths)
    np.testing.assert_allclose(
        FlashRNNTLoss(reduction="per_token", lattice="marked")(labels, marked,
                                                               sample_weight=weights),
        expected, rtol=1e-5)
    config = FlashRNNTLoss(reduction="per_token").get_config()
    assert config["reduction"] == "per_token"
    assert FlashRNNTLoss.from_config(config).get_config() == config


def test_rnnt_loss_takes_two_class_logits():
    rng = np.random.default_rng(6)
    logits = rng.normal(size=(2, 4, 3, 2)).astype(np.float32)
    labels = np.array([[1, 1], [1, PAD]], np.int32)
    logits_var = tf.Variable(logits)
    with tf.GradientTape() as tape:
        costs = RNNTLoss(reduction="none", all_frames_valid=True)(labels, logits_var)
    grad = tape.gradient(costs, logits_var)
    expected, expected_grad = oracle.rnnt_loss(logits, np.where(labels == PAD, 0, labels),
                                               [4, 4], [2, 1])
    np.testing.assert_allclose(costs, expected, rtol=1e-5)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# .keras files load after `import tf_rnnt`.
# ----------------------------------------------------------------------------------------------
_LOAD_SCRIPT = textwrap.dedent("""
    import sys
    {first}
    assert "tensorflow" not in sys.modules or "keras" in sys.modules
    import keras
    import numpy as np
    model = keras.saving.load_model(sys.argv[1])
    data = np.load(sys.argv[2])
    inputs = [data["features"], data["frame_lengths"], data["labels"]]
    np.save(sys.argv[3], model.loss(data["labels"], model(inputs)).numpy())
""")


@pytest.mark.slow
@pytest.mark.parametrize("first", [
    # A library probing for Keras before importing it must not spoil the registration.
    "import tf_rnnt; import importlib.util; assert importlib.util.find_spec('keras')",
    "import keras; import tf_rnnt",
], ids=["tf_rnnt_first", "keras_first"])
def test_keras_file_loads_after_import_tf_rnnt(tmp_path, first):
    model, _ = _subsampling_transducer("mask")
    model.compile(optimizer="adam", loss=model.get_layer("joint").loss(reduction="per_token"))
    features, frame_lengths, labels = _padded_batch(7)
    path, data = os.path.join(tmp_path, "m.keras"), os.path.join(tmp_path, "data.npz")
    out = os.path.join(tmp_path, "loss.npy")
    model.save(path)
    np.savez(data, features=features, frame_lengths=frame_lengths, labels=labels)
    script = os.path.join(tmp_path, "load.py")
    with open(script, "w") as f:
        f.write(_LOAD_SCRIPT.format(first=first))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=pythonpath(REPO_ROOT))
    proc = subprocess.run([sys.executable, script, path, data, out], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    expected = model.loss(labels, model([features, frame_lengths, labels]))
    np.testing.assert_allclose(np.load(out), expected, rtol=1e-6)
