"""The speech example's weight averaging (train.py --ema): the weights it evaluates and keeps
are the exponential moving average of the weights after each step, computed here in float64,
also when training stops before its last epoch."""

import csv
import importlib.util
import os

import keras
import numpy as np
import pytest

SPEECH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # examples/speech
# Under its own module name: examples/multiworker has a train.py too.
_spec = importlib.util.spec_from_file_location("speech_train_ema",
                                               os.path.join(SPEECH, "train.py"))
train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train)


class _Recorder(keras.callbacks.Callback):
    """The raw weights after every step, and the weights the epoch-end callbacks see."""

    def __init__(self):
        super().__init__()
        self.steps, self.epoch_end = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append([w.copy() for w in self.model.get_weights()])

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_end.append([w.copy() for w in self.model.get_weights()])


def _ema(steps, momentum):
    """Keras' update: the first step copies the weights, later ones blend them in."""
    average = [w.astype(np.float64) for w in steps[0]]
    for weights in steps[1:]:
        average = [momentum * a + (1 - momentum) * w for a, w in zip(average, weights)]
    return average


@pytest.mark.parametrize("stop_early", [False, True])
def test_ema_weights_are_evaluated_and_kept(stop_early):
    momentum, epochs, batches = 0.7, 3, 4
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.05, use_ema=True, ema_momentum=momentum),
                  loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8 * batches, 3)).astype("float32")
    y = rng.normal(size=(8 * batches, 2)).astype("float32")
    recorder, after = _Recorder(), _Recorder()
    callbacks = [recorder]
    if stop_early:
        callbacks.append(train.TimeLimit(0))  # stops after the first epoch
    callbacks += [train.SwapEMAWeights(), after]
    model.fit(x, y, batch_size=8, epochs=epochs, callbacks=callbacks, verbose=0)
    trained_epochs = 1 if stop_early else epochs
    assert len(recorder.steps) == trained_epochs * batches
    # Callbacks after SwapEMAWeights see the average of the steps so far at each epoch end.
    for epoch, seen in enumerate(after.epoch_end):
        expected = _ema(recorder.steps[:(epoch + 1) * batches], momentum)
        for got, want in zip(seen, expected):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # The model keeps the average after fit, and it differs from the last raw weights.
    expected = _ema(recorder.steps, momentum)
    for got, want, raw in zip(model.get_weights(), expected, recorder.steps[-1]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert np.abs(want - raw).max() > 1e-3


def _small_synthesized_set(tmp_path):
    """8 training and 4 held-out utterances of the committed synthesized set."""
    data_dir = os.path.join(SPEECH, "data")
    out = tmp_path / "data"
    out.mkdir()
    for name, rows in (("train.tsv", 9), ("test.tsv", 5)):
        lines = open(os.path.join(data_dir, name)).read().splitlines()[:rows]
        body = [os.path.join(data_dir, line.split("\t", 1)[0]) + "\t" + line.split("\t", 1)[1]
                for line in lines[1:]]
        (out / name).write_text("\n".join([lines[0]] + body) + "\n")
    return out


@pytest.mark.slow
def test_train_scores_the_final_averaged_weights(tmp_path, monkeypatch):
    monkeypatch.setattr(keras.callbacks, "TensorBoard",
                        lambda *args, **kwargs: keras.callbacks.Callback())
    seen = []  # the weights at each evaluation of a held-out set
    make_evaluator = train.make_evaluator

    def recording_evaluator(model, *args, **kwargs):
        evaluate = make_evaluator(model, *args, **kwargs)

        def wrapped(dataset):
            seen.append([w.copy() for w in model.get_weights()])
            return evaluate(dataset)
        return wrapped

    monkeypatch.setattr(train, "make_evaluator", recording_evaluator)
    out = tmp_path / "run"
    results = train.main([
        "--data", str(_small_synthesized_set(tmp_path)), "--out", str(out),
        "--human-train", "8", "--human-test", "4", "--epochs", "2", "--eval-every", "1",
        "--batch-size", "8", "--encoder-dim", "16", "--encoder-layers", "1", "--ema", "0.5",
        "--no-export"])
    assert set(results["wer"]) == {"synthetic", "human"}
    # Two sets scored after each of the 2 epochs, none again after training.
    assert len(seen) == 4
    model = train.build_model(train.ModelConfig(**results["config"]))
    model.load_weights(str(out / "final.weights.h5"))
    final = model.get_weights()
    for scored in seen[2:]:
        for got, want in zip(scored, final):
            np.testing.assert_array_equal(got, want)
    # The first epoch's weights differ from the final ones.
    assert any(not np.array_equal(a, b) for a, b in zip(seen[0], final))
    # hypotheses.tsv holds every held-out reference once, and its words give the reported WERs.
    with open(out / "hypotheses.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    for name, manifest in (("synthetic", tmp_path / "data" / "test.tsv"),
                           ("human", out / "fsdd_strings" / "test.tsv")):
        pairs = [(r["reference"], r["hypothesis"]) for r in rows if r["set"] == name]
        with open(manifest, newline="") as f:
            transcripts = [train.pipeline.normalize_transcript(r["transcript"])
                           for r in csv.DictReader(f, delimiter="\t")]
        assert sorted(ref for ref, _ in pairs) == sorted(transcripts)
        edits = sum(_word_edits(ref.split(), hyp.split()) for ref, hyp in pairs)
        words = sum(len(ref.split()) for ref, _ in pairs)
        assert results["wer"][name] == pytest.approx(edits / words, abs=1e-12)


def _word_edits(ref, hyp):
    """Levenshtein distance between two word lists."""
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[:], i
        for j, h in enumerate(hyp, 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (r != h))
    return row[-1]
