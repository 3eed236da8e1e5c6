"""The speech example's Conformer configuration (examples/speech, train.py --conformer).

Checks: the Conformer encoder's frame lengths are the 4x subsampling's (what its convolutions
produce for each utterance alone, and what the joint reads in the training model); the valid
frames of an utterance do not depend on the padding after it; `train.main --conformer` trains,
scores both held-out sets and writes results.json; the whole-utterance SavedModel, loaded in a
process that cannot import tf_rnnt, transcribes as the Keras model does, one utterance at a time
and in a padded batch; the streaming-only exports (TFLite) refuse the Conformer.
"""

import importlib.util
import json
import os
import textwrap

import keras
import numpy as np
import pipeline
import pytest
import tensorflow as tf
from model import ModelConfig, build_model, parts
from saved_model_child import PREAMBLE, keras_greedy_tokens, run_child

SPEECH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # examples/speech
DATA = os.path.join(SPEECH, "data")


def tiny_config():
    return ModelConfig(vocab_size=pipeline.WORDS.size, encoder="conformer", conv_channels=8,
                       encoder_dim=32, encoder_layers=2, attention_heads=4, ff_dim=64,
                       conv_kernel_size=5, embedding_dim=16, predictor_dim=32, joint_dim=32,
                       dropout=0.0, mean_prior_frames=50)


def load_train():
    """examples/speech/train.py under its own module name (another example has a train.py)."""
    spec = importlib.util.spec_from_file_location("speech_train", os.path.join(SPEECH, "train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(5)
    model = build_model(tiny_config())
    parts(model)[0].set_feature_statistics(np.full(40, -6.0, np.float32),
                                           np.full(40, 3.0, np.float32))
    return model


LENGTHS = np.array([37, 1, 2, 3, 4, 5, 8, 9, 20, 31, 32, 33], np.int32)


def ragged_features(pad_value, num_frames=37, seed=0):
    """`[B, num_frames, 40]` features: the same random valid frames, `pad_value` after them."""
    valid = np.random.default_rng(seed).normal(-6.0, 3.0, size=(len(LENGTHS), 37, 40))
    features = np.full((len(LENGTHS), num_frames, 40), pad_value, np.float32)
    for b, n in enumerate(LENGTHS):
        features[b, :n] = valid[b, :n]
    return features


def test_frame_lengths_follow_the_subsampling(model):
    encoder = parts(model)[0]
    features = ragged_features(0.0)
    expected = -(-LENGTHS // 4)  # two stride-2 "same" convolutions: ceil(ceil(L / 2) / 2)
    np.testing.assert_array_equal(encoder.frame_lengths(LENGTHS), expected)
    frames = encoder([features, LENGTHS])
    assert frames.shape == (len(LENGTHS), 10, 32)
    np.testing.assert_array_equal(np.sum(frames._keras_mask, axis=1), expected)
    # What the convolutions produce for each utterance alone.
    for b, n in enumerate(LENGTHS):
        assert encoder([features[b:b + 1, :n], LENGTHS[b:b + 1]]).shape[1] == expected[b]
    # The training model's joint reads the same lengths: outside them the lattice's blank
    # channel holds the padding marker 1 (log-probabilities inside are <= 0).
    labels = np.ones((len(LENGTHS), 2), np.int32)
    lattice = model({"features": features, "feature_lengths": LENGTHS, "labels": labels},
                    training=False).numpy()
    np.testing.assert_array_equal(np.sum(lattice[:, :, 0, 0] <= 0, axis=1), expected)


def test_padding_does_not_reach_the_valid_frames(model):
    encoder = parts(model)[0]
    short = encoder([ragged_features(0.0), LENGTHS]).numpy()
    long = encoder([ragged_features(50.0, num_frames=61), LENGTHS]).numpy()
    frames = -(-LENGTHS // 4)
    for b, n in enumerate(LENGTHS):
        alone = encoder([ragged_features(0.0)[b:b + 1, :n], LENGTHS[b:b + 1]]).numpy()[0]
        np.testing.assert_allclose(short[b, :frames[b]], alone, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(long[b, :frames[b]], alone, rtol=1e-4, atol=1e-4)
    # Non-vacuous: were the padding read as frames (lengths + 4), every valid frame would change
    # (full-context attention).
    leaked = encoder([ragged_features(50.0, num_frames=61), LENGTHS + 4]).numpy()
    for b in range(len(LENGTHS)):
        assert np.abs(leaked[b, :frames[b]] - long[b, :frames[b]]).max(axis=-1).min() > 1e-2


@pytest.mark.slow
def test_train_main_conformer_end_to_end(tmp_path, monkeypatch):
    # TensorBoard (examples/speech/requirements.txt) need not be installed for the tests; its
    # logs are not what this test checks.
    monkeypatch.setattr(keras.callbacks, "TensorBoard", lambda *args, **kwargs:
                        keras.callbacks.Callback())
    # A small synthesized set: 8 training and 4 held-out utterances of the committed data.
    lines = open(os.path.join(DATA, "train.tsv")).read().splitlines()
    test_lines = open(os.path.join(DATA, "test.tsv")).read().splitlines()
    data = tmp_path / "data"
    data.mkdir()
    for name, rows in (("train.tsv", lines[:9]), ("test.tsv", test_lines[:5])):
        header, body = rows[0], rows[1:]
        body = [os.path.join(DATA, row.split("\t", 1)[0]) + "\t" + row.split("\t", 1)[1]
                for row in body]
        (data / name).write_text("\n".join([header] + body) + "\n")
    out = tmp_path / "run"
    train = load_train()
    results = train.main([
        "--conformer", "--data", str(data), "--out", str(out), "--human-train", "8",
        "--human-test", "4", "--epochs", "1", "--batch-size", "16", "--encoder-dim", "32",
        "--encoder-layers", "1"])
    saved = json.loads((out / "results.json").read_text())
    assert saved["wer"] == results["wer"]
    assert set(saved["wer"]) == {"synthetic", "human"}
    assert all(np.isfinite(w) and w >= 0 for w in saved["wer"].values())
    assert saved["test_utterances"] == {"synthetic": 4, "human": 4}
    assert saved["training_utterances"] == 16 and np.isfinite(saved["final_loss"])
    config = saved["config"]
    assert config["encoder"] == "conformer"
    assert (config["encoder_dim"], config["encoder_layers"]) == (32, 1)
    assert config["attention_heads"] == 4 and config["conv_kernel_size"] == 15
    # The exported SavedModel has the whole-utterance signatures only.
    loaded = tf.saved_model.load(saved["saved_model"])
    assert sorted(loaded.signatures) == ["features", "transcribe"]
    assert "tflite" not in saved


def test_tflite_is_refused(model, tmp_path, capsys):
    train = load_train()
    with pytest.raises(SystemExit):
        train.parse_args(["--conformer", "--tflite"])
    assert "--tflite needs a streaming encoder" in capsys.readouterr().err
    train.parse_args(["--tflite"])  # the streaming encoder's TFLite export stays available
    import export

    with pytest.raises(ValueError, match="needs a streaming encoder"):
        export.export_tflite(model, str(tmp_path / "step.tflite"))
    assert not (tmp_path / "step.tflite").exists()


# ------------------------------------------------------------------------------ SavedModel

_CHILD = PREAMBLE + textwrap.dedent(r'''
    transcribe = model.signatures["transcribe"]
    audio = np.load(audio_file)
    keys = sorted(audio.files)
    alone, texts = {}, {}
    for key in keys:
        x = audio[key].astype(np.float32)
        out = transcribe(audio=tf.constant(x[None]), audio_lengths=tf.constant([len(x)]))
        alone[key] = [int(t) for t in out["tokens"][0].numpy() if t >= 0]
        texts[key] = out["text"][0].numpy().decode()
    # All in one batch, zero-padded to the longest.
    lengths = [len(audio[key]) for key in keys]
    batch = np.zeros((len(keys), max(lengths)), np.float32)
    for i, key in enumerate(keys):
        batch[i, :lengths[i]] = audio[key]
    out = transcribe(audio=tf.constant(batch), audio_lengths=tf.constant(lengths, tf.int32))
    batched = {key: [int(t) for t in row if t >= 0]
               for key, row in zip(keys, out["tokens"].numpy())}
    print(json.dumps(dict(
        signatures=sorted(model.signatures), alone=alone, texts=texts, batched=batched,
        unregistered=unregistered, num_ops=len(ops),
        tf_rnnt_loaded=any(m == "tf_rnnt" or m.startswith("tf_rnnt.") for m in sys.modules))))
''')


@pytest.mark.slow
def test_saved_model_transcribes_without_tf_rnnt(tmp_path):
    """A random tiny model, its joint's output layer scaled up so that greedy decisions have
    clear margins (as in test_export.py): the SavedModel, in a process that cannot import
    tf_rnnt, gives the tokens this process's Keras model gives."""
    import export

    keras.utils.set_random_seed(3)
    model = build_model(tiny_config())
    encoder, predictor, joint = parts(model)
    encoder.set_feature_statistics(np.full(40, -6.0, np.float32), np.full(40, 3.0, np.float32))
    joint.kernel.assign(joint.kernel * 8.0)
    export_dir = str(tmp_path / "saved_model")
    export.export_saved_model(model, export_dir, tokenizer=pipeline.WORDS)
    paths, _ = pipeline.read_manifest(os.path.join(DATA, "test.tsv"))
    audio = [pipeline.load_audio(p).numpy() for p in paths[:3]]
    audio_file = str(tmp_path / "audio.npz")
    np.savez(audio_file, **{f"u{i}": a for i, a in enumerate(audio)})
    expected = keras_greedy_tokens(encoder, predictor, joint, audio,
                                   lambda lengths: -(-lengths // 4))
    report = run_child(_CHILD, export_dir, audio_file, str(tmp_path))
    assert report["signatures"] == ["features", "transcribe"]
    assert report["alone"] == expected
    assert report["batched"] == expected  # the padding of a batch changes nothing
    for key, tokens in expected.items():
        assert report["texts"][key].split() == pipeline.WORDS.decode(tokens).split()
    assert sum(len(t) for t in expected.values()) > 0, "no labels: the comparison is vacuous"
