"""The README's Keras recipe taken to deployment, as a user would write it: fit, greedy and beam
decoding, a SavedModel run in a process without tf_rnnt, and TFLite with builtin ops only; all
give the same tokens."""

import subprocess
import sys

import keras
import numpy as np
import tensorflow as tf

import tf_rnnt
from tf_rnnt import decoding, export


def test_recipe_to_deployment(tmp_path):
    V, FEATURES = 8, 12
    keras.utils.set_random_seed(0)

    # The recipe (README), tiny.
    features = keras.Input((None, FEATURES), name="features")
    feature_lengths = keras.Input((), dtype="int32", name="feature_lengths")
    x = keras.layers.Conv1D(16, 3, strides=2, padding="causal", activation="relu")(features)
    frame_lengths = tf_rnnt.keras.conv_output_lengths(feature_lengths, 3, 2, "causal")
    x = tf_rnnt.keras.LengthMask()([x, frame_lengths])
    encoder_out = keras.layers.Bidirectional(keras.layers.LSTM(16, return_sequences=True))(x)
    joint = tf_rnnt.keras.RNNTJoint(vocab_size=V, units=32, name="joint")
    labels = keras.Input((None,), dtype="int32", name="labels")
    embedding = keras.layers.Embedding(V, 16)
    lstm = keras.layers.LSTM(16, return_sequences=True)
    predictor_out = lstm(embedding(joint.predictor_input()(labels)))
    model = keras.Model([features, feature_lengths, labels],
                        joint([encoder_out, predictor_out, labels, frame_lengths]))
    model.compile(optimizer="adam", loss=joint.loss())
    rng = np.random.default_rng(0)
    x_batch = rng.normal(size=(2, 24, FEATURES)).astype("float32")
    y_batch = np.array([[1, 2, 3], [4, 5, -1]], "int32")
    model.fit([x_batch, np.array([24, 24], "int32"), y_batch], y_batch, epochs=2, verbose=0)
    joint.kernel.assign(joint.kernel * 30.0)  # clear margins: greedy and beam agree

    # Streaming pieces: the encoder model as a whole-chunk encoder, the predictor one step.
    encoder = export.WholeChunkEncoder(keras.Model([features, feature_lengths], encoder_out))
    predictor = export.RNNPredictor(embedding, lstm)
    utterance = x_batch[:1]
    frames, _ = encoder.stream(utterance, encoder.initial_state(1))
    lengths = [frames.shape[1]]
    joint_fn = decoding.joint_fn_from_layer(joint)

    start = decoding.greedy_initial_state(predictor.step, predictor.initial_state(1))
    greedy, _ = decoding.greedy_search(frames, lengths, start, joint_fn, predictor.step,
                                       max_symbols_per_frame=1)
    greedy = [int(t) for t in greedy[0] if t >= 0]
    beam = decoding.beam_initial_state(predictor.step, predictor.initial_state(1), beam_size=4)
    beam = decoding.beam_search(frames, lengths, beam, joint_fn, predictor.step)
    tokens, length, _ = decoding.best_hypothesis(beam)
    assert greedy and [int(t) for t in tokens[0, :length[0]]] == greedy

    # SavedModel, run in a process that cannot import tf_rnnt.
    transcriber = export.StreamingTranscriber(
        encoder, predictor, joint, num_features=FEATURES,
        feature_fn=lambda audio: tf.reshape(audio, [tf.shape(audio)[0], -1, FEATURES]),
        vocabulary=[str(i) for i in range(V)], feature_lengths_fn=lambda n: n // FEATURES,
        frame_lengths_fn=lambda n: (n + 1) // 2, max_symbols_per_frame=1)
    export.export_saved_model(transcriber, str(tmp_path / "model"))
    np.save(tmp_path / "utterance.npy", utterance)
    child = f"""
import sys
sys.modules["tf_rnnt"] = None  # no tf_rnnt in this process
import numpy as np, tensorflow as tf
chunk = tf.constant(np.load({str(tmp_path / "utterance.npy")!r}))
model = tf.saved_model.load({str(tmp_path / "model")!r})
state = model.signatures["initial_state"](batch_size=tf.constant(1))
frames = model.signatures["encode_chunk"](features=chunk, encoder_state=state["encoder_state"])
out = model.signatures["decode_chunk"](frames=frames["frames"],
                                       decoder_state=state["decoder_state"])
print([int(t) for t in out["tokens"][0] if t >= 0])
"""
    run = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == str(greedy)

    # TFLite: one streaming step over the whole utterance, builtin ops only.
    flatbuffer = export.convert_streaming_step_to_tflite(transcriber, utterance.shape[1])
    ops = {op["op_name"] for op in export.tflite_interpreter(flatbuffer)._get_ops_details()}
    assert not [op for op in ops if op.startswith("Flex") or op == "CUSTOM"], sorted(ops)
    step = export.tflite_step_runner(flatbuffer)
    state = transcriber.initial_state(tf.constant(1))
    out = step(utterance, state["encoder_state"], state["decoder_state"])
    assert [int(t) for t in out["tokens"][0] if t >= 0] == greedy
