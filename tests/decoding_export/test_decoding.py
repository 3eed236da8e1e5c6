"""tf_rnnt.decoding against brute force in float64 NumPy, on tiny vocabularies and lengths.

The model is a toy transducer written twice, in TensorFlow (float32, what the searches run) and
in NumPy (float64, the oracle): an RNN predictor (embedding, tanh recurrence) and an additive
tanh joint. Greedy search must follow the argmax path of a NumPy loop; modified beam search
with a beam large enough to keep every hypothesis must find the best of all alignments with at
most one label per frame, enumerated exhaustively (best single alignment for `merge="max"`, best
label sequence summed over its alignments for `merge="sum"`); chunked decoding must equal
whole-utterance decoding; and the Keras `RNNTJoint` adapter must give the layer's logits.
"""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from tf_rnnt import decoding

BLANK = 0


class ToyTransducer:
    """Random toy predictor and joint: `predictor_step`/`joint_fn` in TF, `*_np` in float64."""

    def __init__(self, vocab, enc_dim=5, hidden=6, joint_dim=7, scale=1.0, seed=0):
        rng = np.random.default_rng(seed)
        self.vocab = vocab
        self.embedding = rng.normal(size=(vocab, hidden))
        self.recurrent = rng.normal(size=(hidden, hidden)) * 0.5
        self.enc_proj = rng.normal(size=(enc_dim, joint_dim))
        self.pred_proj = rng.normal(size=(hidden, joint_dim))
        self.out = rng.normal(size=(joint_dim, vocab)) * scale
        self.bias = rng.normal(size=(vocab,))
        self.hidden = hidden

    # TensorFlow (float32)
    def predictor_step(self, tokens, state):
        h = tf.tanh(tf.gather(tf.constant(self.embedding, tf.float32), tokens)
                    + tf.matmul(state["h"], tf.constant(self.recurrent, tf.float32)))
        return h, {"h": h}

    def initial_predictor_state(self, batch):
        return {"h": tf.zeros([batch, self.hidden])}

    def joint_fn(self, enc, pred):
        hidden = tf.tanh(tf.matmul(enc, tf.constant(self.enc_proj, tf.float32))
                         + tf.matmul(pred, tf.constant(self.pred_proj, tf.float32)))
        return tf.matmul(hidden, tf.constant(self.out, tf.float32)) + tf.constant(
            self.bias, tf.float32)

    # NumPy (float64)
    def predictor_np(self, labels):
        """Output after the start symbol (blank) and then each label of `labels`."""
        h = np.zeros(self.hidden)
        for token in [BLANK] + list(labels):
            h = np.tanh(self.embedding[token] + h @ self.recurrent)
        return h

    def log_probs_np(self, enc_frame, labels):
        hidden = np.tanh(enc_frame @ self.enc_proj + self.predictor_np(labels) @ self.pred_proj)
        logits = hidden @ self.out + self.bias
        m = logits.max()
        return logits - m - np.log(np.exp(logits - m).sum())


def numpy_greedy(toy, frames, max_symbols):
    labels = []
    for frame in frames:
        for _ in range(max_symbols):
            token = int(np.argmax(toy.log_probs_np(frame, labels)))
            if token == BLANK:
                break
            labels.append(token)
    return labels


def all_alignments(toy, frames):
    """Every alignment with at most one label per frame: `{labels: [path log-probs]}`."""
    paths = {}
    for choice in itertools.product(range(toy.vocab), repeat=len(frames)):
        labels, score = [], 0.0
        for frame, c in zip(frames, choice):
            score += toy.log_probs_np(frame, labels)[c]
            if c != BLANK:
                labels.append(c)
        paths.setdefault(tuple(labels), []).append(score)
    return paths


def emitted(tokens):
    return [[int(t) for t in row if t != decoding.NO_TOKEN] for row in np.asarray(tokens)]


def encoder_frames(batch, frames, dim=5, seed=1):
    return np.random.default_rng(seed).normal(size=(batch, frames, dim)).astype(np.float32)


# ---------------------------------------------------------------------------------------- greedy
@pytest.mark.parametrize("max_symbols", [1, 3])
def test_greedy_equals_numpy_argmax_path(max_symbols):
    toy = ToyTransducer(vocab=5, scale=2.0)
    frames = encoder_frames(3, 9)
    lengths = np.array([9, 5, 0], np.int32)
    state = decoding.greedy_initial_state(toy.predictor_step, toy.initial_predictor_state(3))
    tokens, _ = decoding.greedy_search(frames, lengths, state, toy.joint_fn, toy.predictor_step,
                                       max_symbols_per_frame=max_symbols)
    assert tokens.shape == (3, 9 * max_symbols)
    got = emitted(tokens)
    for b in range(3):
        assert got[b] == numpy_greedy(toy, frames[b, :lengths[b]].astype(np.float64),
                                      max_symbols)
    assert got[0] and got[1], "the toy model should emit labels: the check would be vacuous"
    if max_symbols == 3:
        # Slot t * S + s is the s-th label of frame t: some frame emits more than one label.
        per_frame = (np.asarray(tokens)[0].reshape(9, 3) != decoding.NO_TOKEN).sum(1)
        assert per_frame.max() > 1


def test_greedy_chunked_equals_whole_in_tf_function():
    toy = ToyTransducer(vocab=6, scale=2.0, seed=3)
    frames = encoder_frames(2, 11, seed=4)
    lengths = np.array([11, 8], np.int32)
    search = tf.function(
        lambda f, n, s: decoding.greedy_search(f, n, s, toy.joint_fn, toy.predictor_step, 4),
        input_signature=[tf.TensorSpec([None, None, 5]), tf.TensorSpec([None], tf.int32),
                         {"predictor_out": tf.TensorSpec([None, 6]),
                          "predictor_state": {"h": tf.TensorSpec([None, 6])}}])
    start = decoding.greedy_initial_state(toy.predictor_step, toy.initial_predictor_state(2))
    whole, whole_state = search(frames, lengths, start)
    state, pieces = start, []
    for begin in (0, 3, 4, 9):  # chunks of 3, 1, 5 and 2 frames
        end = {0: 3, 3: 4, 4: 9, 9: 11}[begin]
        chunk_lengths = np.clip(lengths - begin, 0, end - begin).astype(np.int32)
        tokens, state = search(frames[:, begin:end], chunk_lengths, state)
        pieces.append(emitted(tokens))
    for b in range(2):
        assert sum((p[b] for p in pieces), []) == emitted(whole)[b]
    np.testing.assert_allclose(state["predictor_out"], whole_state["predictor_out"], atol=1e-6)
    assert emitted(whole)[0]


# ------------------------------------------------------------------------------------ beam search
@pytest.mark.parametrize("merge", ["max", "sum"])
def test_beam_search_finds_the_exhaustive_best(merge):
    vocab, num_frames = 3, 5
    toy = ToyTransducer(vocab=vocab, scale=1.5, seed=7)
    frames = encoder_frames(3, num_frames, seed=8)
    lengths = np.array([5, 4, 2], np.int32)
    # At most 2^(T+1) - 1 label sequences exist: a beam of 64 never prunes.
    state = decoding.beam_initial_state(toy.predictor_step, toy.initial_predictor_state(3), 64)
    state = decoding.beam_search(frames, lengths, state, toy.joint_fn, toy.predictor_step,
                                 merge=merge)
    tokens, token_lengths, scores = decoding.best_hypothesis(state)
    for b in range(3):
        paths = all_alignments(toy, frames[b, :lengths[b]].astype(np.float64))
        totals = {labels: (max(s) if merge == "max" else np.logaddexp.reduce(s))
                  for labels, s in paths.items()}
        best = max(totals, key=totals.get)
        got = tuple(int(t) for t in np.asarray(tokens)[b, :token_lengths[b]])
        assert got == best
        np.testing.assert_allclose(scores[b], totals[best], rtol=1e-5, atol=1e-5)
        # Every hypothesis kept is a distinct label sequence scored as the oracle scores it.
        valid = np.isfinite(state["scores"][b].numpy())
        kept = [tuple(int(t) for t in state["tokens"][b, k, :state["lengths"][b, k]])
                for k in np.flatnonzero(valid)]
        assert len(kept) == len(set(kept)) == len(paths)
        for k, labels in zip(np.flatnonzero(valid), kept):
            np.testing.assert_allclose(state["scores"][b, k], totals[labels], rtol=1e-5,
                                       atol=1e-5)


def test_beam_of_one_equals_greedy_with_one_symbol_per_frame():
    toy = ToyTransducer(vocab=6, scale=2.0, seed=5)
    frames = encoder_frames(2, 12, seed=6)
    lengths = np.array([12, 7], np.int32)
    state = decoding.beam_initial_state(toy.predictor_step, toy.initial_predictor_state(2), 1)
    state = decoding.beam_search(frames, lengths, state, toy.joint_fn, toy.predictor_step)
    tokens, token_lengths, _ = decoding.best_hypothesis(state)
    for b in range(2):
        expected = numpy_greedy(toy, frames[b, :lengths[b]].astype(np.float64), 1)
        assert list(np.asarray(tokens)[b, :token_lengths[b]]) == expected and expected


def test_beam_search_chunked_equals_whole():
    toy = ToyTransducer(vocab=5, scale=1.0, seed=9)
    frames = encoder_frames(2, 10, seed=10)
    lengths = np.array([10, 6], np.int32)
    spec = {"scores": tf.TensorSpec([None, 4]), "tokens": tf.TensorSpec([None, 4, None], tf.int32),
            "lengths": tf.TensorSpec([None, 4], tf.int32),
            "predictor_out": tf.TensorSpec([None, 4, 6]),
            "predictor_state": {"h": tf.TensorSpec([None, 4, 6])}}
    search = tf.function(
        lambda f, n, s: decoding.beam_search(f, n, s, toy.joint_fn, toy.predictor_step),
        input_signature=[tf.TensorSpec([None, None, 5]), tf.TensorSpec([None], tf.int32), spec])
    start = decoding.beam_initial_state(toy.predictor_step, toy.initial_predictor_state(2), 4)
    whole = search(frames, lengths, start)
    state = start
    for begin, end in ((0, 4), (4, 5), (5, 10)):
        chunk_lengths = np.clip(lengths - begin, 0, end - begin).astype(np.int32)
        state = search(frames[:, begin:end], chunk_lengths, state)
    for key in ("scores", "tokens", "lengths", "predictor_out"):
        np.testing.assert_allclose(state[key], whole[key], atol=1e-5)
    assert np.asarray(decoding.best_hypothesis(whole)[1]).min() > 0


def test_beam_search_rejects_unknown_merge():
    toy = ToyTransducer(vocab=3)
    state = decoding.beam_initial_state(toy.predictor_step, toy.initial_predictor_state(1), 2)
    with pytest.raises(ValueError, match="merge"):
        decoding.beam_search(encoder_frames(1, 2), [2], state, toy.joint_fn, toy.predictor_step,
                             merge="mean")


# --------------------------------------------------------------------------------- Keras adapter
def test_joint_fn_from_layer_gives_the_layers_logits():
    from tf_rnnt.keras import RNNTJoint

    joint = RNNTJoint(7, 8)
    enc = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
    pred = np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32)
    joint.logits(enc[:, None], pred[:, None])  # builds the layer
    # Independent: the joint's definition, W tanh(enc W_e + b_e + pred W_p) + b, in float64 from
    # the layer's weights by name.
    w = {v.path.split("/")[-1]: v.numpy().astype(np.float64) for v in joint.weights}
    hidden = np.tanh(enc @ w["encoder_kernel"] + w["encoder_bias"] + pred @ w["predictor_kernel"])
    expected = hidden @ w["kernel"] + w["bias"]
    got = decoding.joint_fn_from_layer(joint)(tf.constant(enc), tf.constant(pred)).numpy()
    assert got.shape == (4, 7)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_compact_tokens_squeezes_out_empty_slots():
    slots = np.array([[-1, 3, -1, -1, 5, 2], [-1, -1, -1, -1, -1, -1], [7, -1, -1, -1, -1, 1]],
                     np.int32)
    got = decoding.compact_tokens(tf.constant(slots)).numpy()
    rows = [[t for t in row if t != decoding.NO_TOKEN] for row in slots.tolist()]
    width = max(len(r) for r in rows)
    expected = [r + [decoding.NO_TOKEN] * (width - len(r)) for r in rows]
    np.testing.assert_array_equal(got, np.array(expected, np.int32))
