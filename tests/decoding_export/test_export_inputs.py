"""tf_rnnt.export's checks of what it is given: plain Keras models (an error that says how to
wrap them), states and features of the wrong shape in the SavedModel's signatures and in the
TFLite step, and recurrent layers inside a tf.Module (unrolled for TFLite's builtin ops)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_rnnt
from tf_rnnt import export

V, FEATURES = 6, 4


class ModuleEncoder(tf.Module):
    """A user's streaming encoder as a tf.Module holding a Keras LSTM."""

    def __init__(self):
        super().__init__()
        self.lstm = keras.layers.LSTM(8, return_sequences=True, return_state=True)

    def initial_state(self, batch_size):
        return [tf.zeros([batch_size, 8]), tf.zeros([batch_size, 8])]

    def stream(self, features, state):
        frames, h, c = self.lstm(features, initial_state=state)
        return frames, [h, c]


def pieces():
    keras.utils.set_random_seed(1)
    features = keras.Input((None, FEATURES))
    encoder_model = keras.Model(features, keras.layers.Dense(8)(features))
    embedding, lstm = keras.layers.Embedding(V, 5), keras.layers.LSTM(7)
    joint = tf_rnnt.keras.RNNTJoint(V, 10)
    predictor = export.RNNPredictor(embedding, lstm)
    joint.logits(tf.zeros([1, 1, 8]), tf.zeros([1, 1, 7]))  # builds the joint
    return encoder_model, predictor, joint


def transcriber(encoder, predictor, joint):
    return export.StreamingTranscriber(
        encoder, predictor, joint, feature_fn=lambda a: tf.reshape(a, [tf.shape(a)[0], -1,
                                                                       FEATURES]),
        num_features=FEATURES, vocabulary=list("_abcde"), feature_lengths_fn=lambda n: n,
        frame_lengths_fn=lambda n: n)


def test_plain_keras_models_get_an_error_that_says_how_to_wrap_them():
    encoder_model, predictor, joint = pieces()
    with pytest.raises(TypeError, match=r"`encoder`.*initial_state.*stream.*wrap"):
        transcriber(encoder_model, predictor, joint)
    with pytest.raises(TypeError, match=r"`predictor`.*initial_state.*step"):
        transcriber(export.WholeChunkEncoder(encoder_model), keras.Sequential(), joint)


@pytest.mark.parametrize("blank, symbols", [(6, 5), (-7, 5), (0, 0), (0, -1)])
def test_bad_blank_and_max_symbols_are_named(blank, symbols):
    encoder_model, predictor, joint = pieces()
    with pytest.raises(ValueError, match="blank" if symbols > 0 else "max_symbols_per_frame"):
        export.StreamingTranscriber(
            export.WholeChunkEncoder(encoder_model), predictor, joint, feature_fn=tf.identity,
            num_features=FEATURES, vocabulary=list("_abcde"), feature_lengths_fn=tf.identity,
            frame_lengths_fn=tf.identity, blank=blank, max_symbols_per_frame=symbols)


def test_saved_model_signatures_check_states_and_features(tmp_path):
    encoder_model, predictor, joint = pieces()
    module = transcriber(export.WholeChunkEncoder(encoder_model), predictor, joint)
    export.export_saved_model(module, str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path)).signatures
    state = loaded["initial_state"](batch_size=tf.constant(1))
    frames = tf.zeros([2, 3, 8])
    decoder_state = state["decoder_state"]
    good = loaded["decode_chunk"](frames=frames[:1], decoder_state=decoder_state)
    assert good["tokens"].shape == (1, 15)
    cases = [
        (dict(frames=frames[:1], decoder_state=decoder_state[:, :-1]), "decoder_state.*width"),
        (dict(frames=frames, decoder_state=decoder_state), "batch of `decoder_state`"),
    ]
    for kwargs, pattern in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
            loaded["decode_chunk"](**kwargs)
    with pytest.raises(tf.errors.InvalidArgumentError, match="encoder_state.*width"):
        loaded["encode_chunk"](features=tf.zeros([1, 4, FEATURES]),
                               encoder_state=tf.zeros([1, 3]))


def test_tflite_step_of_a_module_encoder_is_builtin_and_checks_shapes():
    _, predictor, joint = pieces()
    joint.logits(tf.zeros([1, 1, 8]), tf.zeros([1, 1, 7]))
    module = transcriber(ModuleEncoder(), predictor, joint)
    flatbuffer = export.convert_streaming_step_to_tflite(module, 4)
    ops = {op["op_name"] for op in export.tflite_interpreter(flatbuffer)._get_ops_details()}
    assert not [op for op in ops if op.startswith("Flex") or op == "CUSTOM"], sorted(ops)
    step = export.tflite_step_runner(flatbuffer)
    state = module.initial_state(tf.constant(1))
    features = np.random.default_rng(0).normal(size=(1, 4, FEATURES)).astype(np.float32)
    out = step(features, state["encoder_state"], state["decoder_state"])
    expected = module.streaming_step(features, state["encoder_state"], state["decoder_state"])
    np.testing.assert_array_equal(out["tokens"], expected["tokens"])
    np.testing.assert_allclose(out["decoder_state"], expected["decoder_state"], atol=1e-5)
    with pytest.raises(ValueError, match="decoder_state"):
        step(features, state["encoder_state"], state["decoder_state"][:, :-1])
    with pytest.raises(ValueError, match="features"):
        step(features[0], state["encoder_state"], state["decoder_state"])
