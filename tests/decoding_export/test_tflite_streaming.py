"""The TFLite streaming step of `tf_rnnt.export` against the SavedModel's streaming signatures.

A tiny random speech model (examples/speech, stateless and LSTM predictors) is exported both
ways; the TFLite model must hold builtin ops only (no Flex) and, run in a TFLite interpreter
(LiteRT's when installed, else TensorFlow's) chunk by chunk over held-out audio, give the same
tokens and states as the SavedModel's encode_chunk + decode_chunk; a TDT model too (its decoder
state carries the frames a move skips into the next chunk).
"""

import os

import export as speech_export  # examples/speech/export.py
import keras
import numpy as np
import pipeline
import pytest
import tensorflow as tf
from model import ModelConfig, build_model, parts
from rnnt_testing import SPEECH_DIR

from tf_rnnt import export

CHUNK = 16  # feature frames per step: 4 encoder frames


def tiny_model(predictor, durations=()):
    keras.utils.set_random_seed(5)
    model = build_model(ModelConfig(vocab_size=pipeline.VOCAB_SIZE, conv_channels=8,
                                    encoder_dim=32, encoder_layers=2, embedding_dim=16,
                                    predictor_dim=24, joint_dim=24, dropout=0.0,
                                    predictor=predictor, durations=durations))
    encoder, _, joint = parts(model)
    encoder.set_feature_statistics(np.full(40, -6.0, np.float32), np.full(40, 3.0, np.float32))
    joint.kernel.assign(joint.kernel * 8.0)  # clear argmax margins: no near-ties to flip
    return model


def held_out_features():
    paths, _ = pipeline.read_manifest(os.path.join(SPEECH_DIR, "data", "test.tsv"))
    return pipeline.log_mel(pipeline.load_audio(paths[0])).numpy()[None]


def op_names(flatbuffer):
    interpreter = export.tflite_interpreter(flatbuffer)
    return {op["op_name"] for op in interpreter._get_ops_details()}


@pytest.mark.slow
@pytest.mark.parametrize("predictor,durations", [
    pytest.param("stateless", (), id="stateless"), pytest.param("lstm", (), id="lstm"),
    pytest.param("stateless", (0, 1, 2, 3, 4), id="tdt")])
def test_tflite_streaming_step_equals_saved_model(predictor, durations, tmp_path):
    model = tiny_model(predictor, durations)
    transcriber = speech_export.make_transcriber(model)
    export.export_saved_model(transcriber, str(tmp_path / "saved_model"))
    flatbuffer = export.convert_streaming_step_to_tflite(transcriber, CHUNK)
    ops = op_names(flatbuffer)
    assert "WHILE" in ops  # the greedy search's loops
    assert not [op for op in ops if op.startswith("Flex") or op == "CUSTOM"], sorted(ops)

    saved = tf.saved_model.load(str(tmp_path / "saved_model")).signatures
    runner = export.tflite_interpreter(flatbuffer).get_signature_runner()
    features = held_out_features()
    state = saved["initial_state"](batch_size=tf.constant(1))
    saved_enc, saved_dec = state["encoder_state"], state["decoder_state"]
    lite_enc, lite_dec = saved_enc.numpy(), saved_dec.numpy()
    saved_tokens, lite_tokens = [], []
    for start in range(0, features.shape[1] - CHUNK + 1, CHUNK):
        chunk = features[:, start:start + CHUNK]
        enc = saved["encode_chunk"](features=tf.constant(chunk), encoder_state=saved_enc)
        dec = saved["decode_chunk"](frames=enc["frames"], decoder_state=saved_dec)
        saved_enc, saved_dec = enc["encoder_state"], dec["decoder_state"]
        out = runner(features=chunk, encoder_state=lite_enc, decoder_state=lite_dec)
        lite_enc, lite_dec = out["encoder_state"], out["decoder_state"]
        np.testing.assert_array_equal(out["tokens"], dec["tokens"].numpy())
        np.testing.assert_allclose(lite_enc, saved_enc.numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(lite_dec, saved_dec.numpy(), rtol=1e-4, atol=1e-4)
        saved_tokens += [int(t) for t in dec["tokens"][0] if t >= 0]
        lite_tokens += [int(t) for t in out["tokens"][0] if t >= 0]
    assert lite_tokens == saved_tokens
    assert saved_tokens, "the model emitted nothing: the comparison would be vacuous"


def test_unrolled_recurrent_layers_restores_the_setting():
    model = tiny_model("lstm")
    encoder, predictor, _ = parts(model)
    rnns = [layer for layer in (*encoder.lstms, predictor.lstm)]
    with export.unrolled_recurrent_layers(encoder, predictor) as found:
        assert set(map(id, found)) == set(map(id, rnns))
        assert all(rnn.unroll for rnn in rnns)
    assert not any(rnn.unroll for rnn in rnns)
