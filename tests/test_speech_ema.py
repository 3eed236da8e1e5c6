"""The speech example's weight averaging (train.py --ema): the weights it evaluates and keeps
are the exponential moving average of the weights after each step, computed here in float64,
also when training stops before its last epoch."""

import os
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "examples", "speech"))

import keras  # noqa: E402
import train  # noqa: E402


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
