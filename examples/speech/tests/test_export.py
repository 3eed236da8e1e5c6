"""The speech example's streaming model and SavedModel export (examples/speech).

Checks: chunk-by-chunk encoding equals whole-utterance encoding; batched greedy decoding equals a
one-sample-at-a-time Python loop over the same joint and predictor; the exported SavedModel,
loaded in a fresh Python process that cannot import tf_rnnt, holds only core TensorFlow ops,
transcribes held-out audio exactly as the Keras model does in this process, and its streaming
signatures (audio chunk -> features -> encode_chunk -> decode_chunk) give the same tokens as
`transcribe` on the whole utterance.
"""

import os
import textwrap

import keras
import numpy as np
import pipeline
import pytest
import tensorflow as tf
from model import ModelConfig, build_model, output_lengths, parts
from saved_model_child import PREAMBLE, keras_greedy_tokens, run_child

from tf_rnnt import decoding

SPEECH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # examples/speech
DATA = os.path.join(SPEECH, "data")


def tiny_config(predictor="stateless"):
    return ModelConfig(vocab_size=pipeline.VOCAB_SIZE, conv_channels=8, encoder_dim=48,
                       encoder_layers=2, embedding_dim=16, predictor_dim=32, joint_dim=32,
                       dropout=0.0, predictor=predictor)


def held_out_audio(count):
    paths, texts = pipeline.read_manifest(os.path.join(DATA, "test.tsv"))
    return [pipeline.load_audio(p).numpy() for p in paths[:count]], texts[:count]


def python_greedy(joint, predictor, frames, max_symbols=5):
    """One utterance, Python control flow: the textbook greedy RNN-T loop."""
    out, pred_state = predictor.step(tf.constant([pipeline.BLANK]), predictor.initial_state(1))
    tokens = []
    for t in range(frames.shape[0]):
        for _ in range(max_symbols):
            logits = joint.logits(frames[None, t:t + 1], out[:, None])[0, 0, 0].numpy()
            token = int(np.argmax(logits))
            if token == pipeline.BLANK:
                break
            tokens.append(token)
            out, pred_state = predictor.step(tf.constant([token]), pred_state)
    return tokens


def greedy_start(predictor, batch):
    return decoding.greedy_initial_state(predictor.step, predictor.initial_state(batch))


def emitted(tokens):
    return [[int(t) for t in row if t != decoding.NO_TOKEN] for row in np.asarray(tokens)]


@pytest.fixture(scope="module", params=["stateless", "lstm"])
def random_model(request):
    keras.utils.set_random_seed(11)
    model = build_model(tiny_config(request.param))
    encoder = parts(model)[0]
    encoder.set_feature_statistics(np.full(40, -6.0, np.float32), np.full(40, 3.0, np.float32))
    return model


@pytest.fixture(scope="module")
def held_out_features():
    audio, _ = held_out_audio(3)
    feats = [pipeline.log_mel(a).numpy() for a in audio]
    length = max(len(f) for f in feats)
    batch = np.zeros((len(feats), length, 40), np.float32)
    for i, f in enumerate(feats):
        batch[i, :len(f)] = f
    return batch, np.array([len(f) for f in feats], np.int32)


def test_chunked_encoding_equals_whole_utterance(random_model, held_out_features):
    encoder = parts(random_model)[0]
    features, lengths = held_out_features
    whole = encoder([features, lengths]).numpy()
    assert whole.shape[1] == features.shape[1] // 4
    for chunk in (4, 8, 24):
        state = encoder.initial_state(features.shape[0])
        pieces = []
        for start in range(0, features.shape[1], chunk):  # the last chunk may be any size
            frames, state = encoder.stream(features[:, start:start + chunk], state)
            pieces.append(frames.numpy())
        np.testing.assert_allclose(np.concatenate(pieces, 1), whole, rtol=1e-5, atol=1e-5)


def test_batched_greedy_equals_python_loop(random_model, held_out_features):
    encoder, predictor, joint = parts(random_model)
    features, lengths = held_out_features
    frames = encoder([features, lengths])
    # The Python loop runs eagerly, one op at a time: keep it short (<= 24 frames, 2 samples).
    frame_lengths = np.minimum(output_lengths(lengths).numpy(), [24, 12, 0])
    tokens, _ = decoding.greedy_search(frames, frame_lengths, greedy_start(predictor, len(lengths)),
                                       decoding.joint_fn_from_layer(joint), predictor.step)
    got = emitted(tokens)
    assert got[2] == []  # no frames, no tokens
    for b in range(2):
        expected = python_greedy(joint, predictor, frames[b, :int(frame_lengths[b])].numpy())
        assert expected, "a random model should emit labels: the comparison would be empty"
        assert got[b] == expected


def test_chunked_greedy_equals_whole(random_model, held_out_features):
    encoder, predictor, joint = parts(random_model)
    features, lengths = held_out_features
    frames = encoder([features[:1, :lengths[0]], lengths[:1]])
    joint_fn = decoding.joint_fn_from_layer(joint)
    whole, _ = decoding.greedy_search(frames, [frames.shape[1]], greedy_start(predictor, 1),
                                      joint_fn, predictor.step)
    state = greedy_start(predictor, 1)
    decode = tf.function(lambda f, n, s: decoding.greedy_search(f, n, s, joint_fn, predictor.step))
    streamed = []
    for start in range(0, frames.shape[1], 3):
        piece = frames[:, start:start + 3]
        tokens, state = decode(piece, [piece.shape[1]], state)
        streamed += emitted(tokens)[0]
    assert streamed == emitted(whole)[0] and streamed


# ------------------------------------------------------------------------------ SavedModel

_CHILD = PREAMBLE + textwrap.dedent(r'''
    sig = model.signatures
    audio = np.load(audio_file)
    results = []
    for key in sorted(audio.files):
        x = audio[key].astype(np.float32)
        whole = sig["transcribe"](audio=tf.constant(x[None]),
                                  audio_lengths=tf.constant([len(x)], tf.int32))
        whole_tokens = [int(t) for t in whole["tokens"][0].numpy() if t >= 0]
        whole_features = sig["features"](audio=tf.constant(x[None]))["features"][0].numpy()

        # Streaming: audio arrives in pieces of 1000 samples (62.5 ms); whenever the buffer
        # holds 8 or more complete feature frames, a multiple of 8 of them (of 4, as encode_chunk
        # needs) is computed and passed on; frame n needs samples [160 n, 160 n + 400), so the
        # buffer keeps everything from 160 * (frames used). The last piece flushes the rest.
        state = sig["initial_state"](batch_size=tf.constant(1))
        encoder_state, decoder_state = state["encoder_state"], state["decoder_state"]
        buffer = np.zeros(0, np.float32)
        stream_tokens, stream_text, stream_features = [], "", []
        for start in range(0, len(x), 1000):
            buffer = np.concatenate([buffer, x[start:start + 1000]])
            n = 1 + (len(buffer) - 400) // 160 if len(buffer) >= 400 else 0
            if start + 1000 < len(x):
                n -= n % 8
            if n <= 0:
                continue
            feats = sig["features"](audio=tf.constant(buffer[None, :(n - 1) * 160 + 400]))
            feats = feats["features"]
            buffer = buffer[n * 160:]
            stream_features.append(feats[0].numpy())
            enc = sig["encode_chunk"](features=feats, encoder_state=encoder_state)
            encoder_state = enc["encoder_state"]
            dec = sig["decode_chunk"](frames=enc["frames"], decoder_state=decoder_state)
            decoder_state = dec["decoder_state"]
            stream_tokens += [int(t) for t in dec["tokens"][0].numpy() if t >= 0]
            stream_text += dec["text"][0].numpy().decode()
        stream_features = np.concatenate(stream_features)
        results.append(dict(
            key=key, whole_tokens=whole_tokens, whole_text=whole["text"][0].numpy().decode(),
            stream_tokens=stream_tokens, stream_text=stream_text,
            feature_frames=[len(whole_features), len(stream_features)],
            feature_max_diff=float(np.abs(whole_features - stream_features).max())))
    print(json.dumps(dict(
        results=results, unregistered=unregistered, num_ops=len(ops),
        tf_rnnt_loaded=any(m == "tf_rnnt" or m.startswith("tf_rnnt.") for m in sys.modules))))
''')


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny random model, exported, plus what this process's Keras model transcribes for three
    held-out utterances. Its joint's output layer is scaled up so that greedy decisions have
    clear margins: a near-tie could flip between two graphs that round differently, and a
    barely trained model (mostly blank, near-ties everywhere) would make the comparison flaky
    or vacuous."""
    keras.utils.set_random_seed(3)
    paths, texts = pipeline.read_manifest(os.path.join(DATA, "train.tsv"))
    model = build_model(tiny_config())
    encoder, predictor, joint = parts(model)
    encoder.adapt_features(pipeline.feature_dataset((paths[:16], texts[:16])))
    joint.kernel.assign(joint.kernel * 8.0)

    import export

    directory = tmp_path_factory.mktemp("speech_export")
    export_dir = str(directory / "saved_model")
    export.export_saved_model(model, export_dir)
    audio, _ = held_out_audio(3)
    audio_file = str(directory / "audio.npz")
    np.savez(audio_file, **{f"u{i}": a for i, a in enumerate(audio)})
    expected = keras_greedy_tokens(encoder, predictor, joint, audio, output_lengths)
    return export_dir, audio_file, expected


@pytest.mark.slow
def test_saved_model_in_a_process_without_tf_rnnt(exported):
    export_dir, audio_file, expected = exported
    report = run_child(_CHILD, export_dir, audio_file, os.path.dirname(export_dir))
    assert len(report["results"]) == len(expected)
    emitted = 0
    for result in report["results"]:
        want = expected[result["key"]]
        # The SavedModel transcribes as the Keras model does in this process.
        assert result["whole_tokens"] == want
        assert result["whole_text"] == pipeline.decode_ids(want)
        # Streaming, chunk by chunk from raw audio, equals the whole-utterance output.
        frames_whole, frames_stream = result["feature_frames"]
        assert frames_whole == frames_stream and result["feature_max_diff"] < 1e-3
        assert result["stream_tokens"] == result["whole_tokens"]
        assert result["stream_text"] == result["whole_text"]
        emitted += len(want)
    assert emitted > 0, "the model emitted nothing: the comparisons would be vacuous"
