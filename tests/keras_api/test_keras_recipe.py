"""The README's Keras recipe for a subsampling encoder, run exactly as written.

RECIPE is the README snippet verbatim. The test runs it, then checks that the trained model's
cost of each padded sample equals that sample's cost alone and unpadded (the same layers run
on the sample's own frames and labels, scored by tf_rnnt.reference on full logits).
"""

import keras
import numpy as np
from test_keras_lengths import unpadded_reference_costs

RECIPE = '''
import keras
import numpy as np
import tf_rnnt

V, FEATURES = 8, 12  # vocabulary (blank = 0) and feature size

# Encoder: two stride-2 convolutions; the frame lengths follow them.
features = keras.Input((None, FEATURES), name="features")
feature_lengths = keras.Input((), dtype="int32", name="feature_lengths")
x = keras.layers.Conv1D(32, 3, strides=2, padding="causal", activation="relu")(features)
x = keras.layers.Conv1D(32, 3, strides=2, padding="causal", activation="relu")(x)
frame_lengths = tf_rnnt.keras.conv_output_lengths(feature_lengths, [3, 3], [2, 2], "causal")
x = tf_rnnt.keras.LengthMask()([x, frame_lengths])  # the mask the LSTM needs, padding zeroed
encoder_out = keras.layers.Bidirectional(keras.layers.LSTM(32, return_sequences=True))(x)

# Joint: blank and label padding are set here, once.
joint = tf_rnnt.keras.RNNTJoint(vocab_size=V, units=64, blank=0, pad_value=-1, name="joint")

# Predictor: blank, then the labels.
labels = keras.Input((None,), dtype="int32", name="labels")  # padded with -1
predictor_ids = joint.predictor_input()(labels)  # [B, U+1]: blank, y1, ..., yU
predictor = keras.layers.Embedding(V, 32)(predictor_ids)
predictor_out = keras.layers.LSTM(32, return_sequences=True)(predictor)

lattice = joint([encoder_out, predictor_out, labels, frame_lengths])  # [B, T', U+1, 2]
model = keras.Model([features, feature_lengths, labels], lattice)
model.compile(optimizer=keras.optimizers.Adam(0.01), loss=joint.loss())

# Tiny random data: 4 utterances of 10 to 33 frames with 1 to 5 labels, padded.
rng = np.random.default_rng(0)
lengths = rng.integers(10, 34, size=4).astype("int32")
x_batch = np.zeros((4, lengths.max(), FEATURES), "float32")
y_batch = np.full((4, 5), -1, "int32")
for b, n in enumerate(lengths):
    x_batch[b, :n] = rng.normal(size=(n, FEATURES))
    num_labels = rng.integers(1, 6)
    y_batch[b, :num_labels] = rng.integers(1, V, size=num_labels)
history = model.fit([x_batch, lengths, y_batch], y_batch, epochs=5, verbose=0)
'''


def test_recipe_trains_on_each_samples_unpadded_cost():
    namespace = {}
    exec(compile(RECIPE, "README recipe", "exec"), namespace)  # noqa: S102 (our own snippet)
    losses = namespace["history"].history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses

    model, joint = namespace["model"], namespace["joint"]
    x_batch, lengths, y_batch = (namespace[k] for k in ("x_batch", "lengths", "y_batch"))
    assert len(set(lengths)) > 1 and len(set((y_batch != -1).sum(axis=1))) > 1
    parts = keras.Model(model.inputs, [namespace["encoder_out"], namespace["predictor_out"]])
    expected = unpadded_reference_costs(parts, joint, x_batch, lengths, y_batch)
    costs = joint.loss(reduction="none")(y_batch, model([x_batch, lengths, y_batch]))
    np.testing.assert_allclose(costs, expected, rtol=1e-5)
    # What model.fit reports is the mean of these costs.
    np.testing.assert_allclose(model.evaluate([x_batch, lengths, y_batch], y_batch, verbose=0),
                               expected.mean(), rtol=1e-5)
