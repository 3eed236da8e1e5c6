"""tf_rnnt.decoding's arguments: a negative blank (counted from the end of V) against a float64
NumPy brute force, early errors naming bad arguments, and states of another batch."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

import tf_rnnt
from tf_rnnt import decoding

VOCAB = 4


class Toy:
    """An RNN predictor and tanh joint, in TensorFlow (float32) and NumPy (float64)."""

    def __init__(self, seed=0, hidden=6, joint_dim=7, enc_dim=5):
        rng = np.random.default_rng(seed)
        self.embedding = rng.normal(size=(VOCAB, hidden))
        self.recurrent = rng.normal(size=(hidden, hidden)) * 0.5
        self.enc_proj = rng.normal(size=(enc_dim, joint_dim))
        self.pred_proj = rng.normal(size=(hidden, joint_dim))
        self.out = rng.normal(size=(joint_dim, VOCAB)) * 1.5
        self.bias = rng.normal(size=(VOCAB,))
        self.hidden = hidden

    def predictor_step(self, tokens, state):
        # tf.gather raises on an out-of-range id on the CPU (and returns zeros on a GPU).
        h = tf.tanh(tf.gather(tf.constant(self.embedding, tf.float32), tokens)
                    + tf.matmul(state["h"], tf.constant(self.recurrent, tf.float32)))
        return h, {"h": h}

    def joint_fn(self, enc, pred):
        hidden = tf.tanh(tf.matmul(enc, tf.constant(self.enc_proj, tf.float32))
                         + tf.matmul(pred, tf.constant(self.pred_proj, tf.float32)))
        return tf.matmul(hidden, tf.constant(self.out, tf.float32)) + self.bias.astype(np.float32)

    def log_probs_np(self, frame, labels, blank):
        h = np.zeros(self.hidden)
        for token in [blank] + list(labels):
            h = np.tanh(self.embedding[token] + h @ self.recurrent)
        logits = np.tanh(frame @ self.enc_proj + h @ self.pred_proj) @ self.out + self.bias
        return logits - np.logaddexp.reduce(logits)


def brute_force_best(toy, frames, blank, merge):
    """The best label sequence over every alignment with at most one label per frame."""
    paths = {}
    for choice in itertools.product(range(VOCAB), repeat=len(frames)):
        labels, score = [], 0.0
        for frame, c in zip(frames, choice):
            score += toy.log_probs_np(frame, labels, blank)[c]
            if c != blank:
                labels.append(c)
        paths.setdefault(tuple(labels), []).append(score)
    totals = {k: (max(v) if merge == "max" else np.logaddexp.reduce(v)) for k, v in paths.items()}
    best = max(totals, key=totals.get)
    return best, totals[best]


def frames_of(batch, num_frames, seed=1):
    return np.random.default_rng(seed).normal(size=(batch, num_frames, 5)).astype(np.float32)


def start_state(toy, batch):
    return {"h": tf.zeros([batch, toy.hidden])}


@pytest.mark.parametrize("merge", ["max", "sum"])
def test_beam_search_with_negative_blank_matches_brute_force(merge):
    toy = Toy(seed=3)
    frames = frames_of(2, 4, seed=5)
    lengths = np.array([4, 3], np.int32)
    results = {}
    for blank in (-1, VOCAB - 1):
        state = decoding.beam_initial_state(toy.predictor_step, start_state(toy, 2), 64,
                                            blank=blank, vocab_size=VOCAB)
        state = decoding.beam_search(frames, lengths, state, toy.joint_fn, toy.predictor_step,
                                     blank=blank, merge=merge)
        tokens, token_lengths, scores = decoding.best_hypothesis(state)
        results[blank] = [tuple(int(t) for t in np.asarray(tokens)[b, :token_lengths[b]])
                          for b in range(2)], np.asarray(scores)
    assert results[-1][0] == results[VOCAB - 1][0]
    np.testing.assert_allclose(results[-1][1], results[VOCAB - 1][1], rtol=1e-6)
    for b in range(2):
        best, score = brute_force_best(toy, frames[b, :lengths[b]].astype(np.float64),
                                       VOCAB - 1, merge)
        assert results[-1][0][b] == best
        np.testing.assert_allclose(results[-1][1][b], score, rtol=1e-5, atol=1e-5)
        assert VOCAB - 1 not in results[-1][0][b]


def test_greedy_with_negative_blank_equals_last_id():
    toy = Toy(seed=4)
    frames = frames_of(3, 7, seed=2)
    lengths = np.array([7, 5, 2], np.int32)
    outputs = []
    for blank in (-1, VOCAB - 1):
        state = decoding.greedy_initial_state(toy.predictor_step, start_state(toy, 3), blank,
                                              vocab_size=VOCAB)
        tokens, state = decoding.greedy_search(frames, lengths, state, toy.joint_fn,
                                               toy.predictor_step, 3, blank=blank)
        outputs.append((np.asarray(tokens), np.asarray(state["predictor_out"])))
    np.testing.assert_array_equal(outputs[0][0], outputs[1][0])
    np.testing.assert_allclose(outputs[0][1], outputs[1][1])
    emitted = outputs[0][0][outputs[0][0] != decoding.NO_TOKEN]
    assert emitted.size and not np.any(emitted == VOCAB - 1)


def test_negative_blank_without_vocab_size_names_the_fix():
    toy = Toy()
    with pytest.raises(ValueError, match="vocab_size"):
        decoding.greedy_initial_state(toy.predictor_step, start_state(toy, 1), blank=-1)


@pytest.mark.parametrize("beam_size", [0, -1, 1.5])
def test_bad_beam_size_is_named(beam_size):
    toy = Toy()
    with pytest.raises(ValueError, match="beam_size"):
        decoding.beam_initial_state(toy.predictor_step, start_state(toy, 1), beam_size)


@pytest.mark.parametrize("symbols", [0, -1])
def test_bad_max_symbols_per_frame_is_named(symbols):
    toy = Toy()
    state = decoding.greedy_initial_state(toy.predictor_step, start_state(toy, 1))
    with pytest.raises(ValueError, match="max_symbols_per_frame"):
        decoding.greedy_search(frames_of(1, 3), [3], state, toy.joint_fn, toy.predictor_step,
                               symbols)


def test_state_of_another_batch_is_rejected_with_unknown_batch():
    toy = Toy()
    one = decoding.greedy_initial_state(toy.predictor_step, start_state(toy, 1))
    search = tf.function(
        lambda f, n, s: decoding.greedy_search(f, n, s, toy.joint_fn, toy.predictor_step, 2),
        input_signature=[tf.TensorSpec([None, None, 5]), tf.TensorSpec([None], tf.int32),
                         {"predictor_out": tf.TensorSpec([None, 6]),
                          "predictor_state": {"h": tf.TensorSpec([None, 6])}}])
    with pytest.raises(tf.errors.InvalidArgumentError, match="batch of `state`"):
        search(frames_of(2, 3), np.array([3, 3], np.int32), one)
    beam = decoding.beam_initial_state(toy.predictor_step, start_state(toy, 1), 2)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="batch"):
        decoding.beam_search(frames_of(2, 3), [3, 3], beam, toy.joint_fn, toy.predictor_step)


def test_decoding_and_export_are_attributes_after_a_bare_import():
    import subprocess
    import sys

    code = ("import tf_rnnt; print(tf_rnnt.decoding.greedy_search.__name__, "
            "tf_rnnt.export.export_saved_model.__name__, tf_rnnt.xla_kernels_available())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=__import__("os").environ.copy(), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "greedy_search export_saved_model" in out.stdout
    assert tf_rnnt.decoding is decoding
