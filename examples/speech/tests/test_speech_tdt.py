"""The speech example with a TDT joint (train.py --tdt): it trains, scores, measures greedy
decoding speed and exports; the exported SavedModel transcribes as the scoring did."""

import csv
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_speech_ema import _small_synthesized_set, train


@pytest.mark.slow
def test_train_main_tdt_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setattr(keras.callbacks, "TensorBoard",
                        lambda *args, **kwargs: keras.callbacks.Callback())
    out = tmp_path / "run"
    results = train.main([
        "--tdt", "--data", str(_small_synthesized_set(tmp_path)), "--out", str(out),
        "--human-train", "8", "--human-test", "4", "--epochs", "2", "--batch-size", "8",
        "--encoder-dim", "16", "--encoder-layers", "1", "--tdt-sigma", "0.1", "--tdt-omega", "0.25",
        "--tflite"])
    assert results["config"]["durations"] == (0, 1, 2, 3, 4)
    assert (results["config"]["tdt_sigma"], results["config"]["tdt_omega"]) == (0.1, 0.25)
    assert all(np.isfinite(w) and w >= 0 for w in results["wer"].values())
    model = train.build_model(train.ModelConfig(**results["config"]))
    joint = model.get_layer("joint")
    assert joint.durations == [0, 1, 2, 3, 4]
    assert joint.kernel.shape[-1] == results["config"]["vocab_size"] + 5
    assert (model.loss.sigma, model.loss.omega) == (0.1, 0.25)
    for name, speed in results["decoding"].items():
        assert speed["utterances"] == 4, name
        # Every utterance takes at least one move, and a move advances at most 4 frames.
        assert speed["joint_steps"] >= max(4, speed["encoder_frames"] // 4), speed
        assert speed["search_seconds"] > 0 and speed["audio_seconds"] > 0
    assert os.path.exists(results["tflite"])
    # The SavedModel (TDT greedy search in its graph) gives the scored hypotheses.
    loaded = tf.saved_model.load(results["saved_model"])
    with open(out / "hypotheses.tsv", newline="") as f:
        scored = {(r["set"], r["reference"]): r["hypothesis"]
                  for r in csv.DictReader(f, delimiter="\t")}
    with open(out / "fsdd_strings" / "test.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    for row in rows[:2]:
        path = row["path"] if os.path.isabs(row["path"]) else str(
            out / "fsdd_strings" / row["path"])
        audio = train.pipeline.load_audio(path)
        text = loaded.signatures["transcribe"](
            audio=audio[None], audio_lengths=tf.shape(audio)[:1])["text"][0].numpy().decode()
        reference = train.pipeline.normalize_transcript(row["transcript"])
        assert " ".join(text.split()) == " ".join(scored[("human", reference)].split())
