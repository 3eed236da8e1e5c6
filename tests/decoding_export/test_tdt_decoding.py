"""TDT greedy and beam search (tf_rnnt._tdt_decoding) against float64 NumPy oracles.

The model is a toy TDT transducer written twice, in TensorFlow (float32, what the searches run)
and in NumPy (float64, the oracles): an RNN predictor and an additive tanh joint with `V` token
logits then `D` duration logits. Greedy search must follow a NumPy loop written from the TDT
greedy rules; beam search with a beam that never prunes must keep, for every label sequence and
end frame, the best score of all alignments enumerated one by one, and its best hypothesis must
be the best alignment; beam search with one hypothesis must take the best move at each step;
and decoding a stream chunk by chunk (in a `tf.function` with unknown batch and time) must give
what decoding it whole gives.
"""

import numpy as np
import pytest
import tensorflow as tf

from tf_rnnt import _tdt_decoding as tdt
from tf_rnnt import decoding

NO_TOKEN = decoding.NO_TOKEN
ENC_DIM, HIDDEN = 5, 6


class ToyTDT:
    """Random toy predictor and TDT joint: `predictor_step`/`joint_fn` in TF, `*_np` in float64.

    `duration_bias` shifts the duration logits (to make long or zero durations likely).
    """

    def __init__(self, vocab, durations, blank=0, joint_dim=7, scale=1.0, duration_bias=None,
                 seed=0):
        rng = np.random.default_rng(seed)
        self.vocab, self.durations = vocab, list(durations)
        self.blank = blank % vocab
        outputs = vocab + len(durations)
        self.embedding = rng.normal(size=(vocab, HIDDEN))
        self.recurrent = rng.normal(size=(HIDDEN, HIDDEN)) * 0.5
        self.enc_proj = rng.normal(size=(ENC_DIM, joint_dim))
        self.pred_proj = rng.normal(size=(HIDDEN, joint_dim))
        self.out = rng.normal(size=(joint_dim, outputs)) * scale
        self.bias = rng.normal(size=(outputs,))
        if duration_bias is not None:
            self.bias[vocab:] += duration_bias

    # TensorFlow (float32)
    def predictor_step(self, tokens, state):
        h = tf.tanh(tf.gather(tf.constant(self.embedding, tf.float32), tokens)
                    + tf.matmul(state["h"], tf.constant(self.recurrent, tf.float32)))
        return h, {"h": h}

    def initial_predictor_state(self, batch):
        return {"h": tf.zeros([batch, HIDDEN])}

    def joint_fn(self, enc, pred):
        hidden = tf.tanh(tf.matmul(enc, tf.constant(self.enc_proj, tf.float32))
                         + tf.matmul(pred, tf.constant(self.pred_proj, tf.float32)))
        return tf.matmul(hidden, tf.constant(self.out, tf.float32)) + tf.constant(
            self.bias, tf.float32)

    # NumPy (float64)
    def log_probs_np(self, frame, labels):
        """(token log-probs [V], duration log-probs [D]) after the start symbol and `labels`."""
        h = np.zeros(HIDDEN)
        for token in [self.blank] + list(labels):
            h = np.tanh(self.embedding[token] + h @ self.recurrent)
        logits = np.tanh(frame @ self.enc_proj + h @ self.pred_proj) @ self.out + self.bias

        def log_softmax(x):
            return x - x.max() - np.log(np.exp(x - x.max()).sum())

        return log_softmax(logits[:self.vocab]), log_softmax(logits[self.vocab:])


def frames_of(batch, num_frames, seed=1):
    return np.random.default_rng(seed).normal(size=(batch, num_frames, ENC_DIM)).astype(
        np.float32)


def numpy_greedy(toy, frames, max_symbols, skip=0):
    """The TDT greedy rules, one frame pointer: `([(frame, s, label)], frames left to skip)`."""
    t, count, labels, emitted = skip, 0, [], []
    while t < len(frames):
        token_lp, duration_lp = toy.log_probs_np(frames[t], labels)
        token = int(np.argmax(token_lp))
        duration = toy.durations[int(np.argmax(duration_lp))]
        if token == toy.blank:
            t, count = t + max(duration, 1), 0
            continue
        emitted.append((t, count, token))
        labels.append(token)
        count += 1
        if duration > 0:
            t, count = t + duration, 0
        elif count == max_symbols:
            t, count = t + 1, 0
    return emitted, t - len(frames)


def greedy_slots(emitted, num_frames, max_symbols):
    slots = np.full(num_frames * max_symbols, NO_TOKEN)
    for t, s, token in emitted:
        slots[t * max_symbols + s] = token
    return slots


def all_alignments(toy, frames, max_symbols):
    """Every TDT alignment from frame 0, enumerated one by one: `{(labels, skip): best score}`.

    Moves start before the last frame's end (the last may land past it: `skip` frames); blank
    moves by `d >= 1`, a label by `d >= 0`, at most `max_symbols` labels start at one frame."""
    num_frames, cache, best = len(frames), {}, {}
    stack = [(0, (), 0, 0.0)]  # frame, labels, labels emitted at this frame, score
    while stack:
        t, labels, count, score = stack.pop()
        if t >= num_frames:
            key = (labels, t - num_frames)
            best[key] = max(best.get(key, -np.inf), score)
            continue
        if (t, labels) not in cache:
            cache[t, labels] = toy.log_probs_np(frames[t], labels)
        token_lp, duration_lp = cache[t, labels]
        for d, duration_score in zip(toy.durations, duration_lp):
            if d >= 1:
                stack.append((t + d, labels, 0, score + token_lp[toy.blank] + duration_score))
            if count < max_symbols:
                for v in range(toy.vocab):
                    if v != toy.blank:
                        stack.append((t + d, labels + (v,), count + 1 if d == 0 else 0,
                                      score + token_lp[v] + duration_score))
    return best


def numpy_best_move_path(toy, frames, max_symbols):
    """One hypothesis taking the best allowed (token, duration) move at each step: labels."""
    t, count, labels = 0, 0, []
    while t < len(frames):
        token_lp, duration_lp = toy.log_probs_np(frames[t], labels)
        moves = token_lp[:, None] + duration_lp[None, :]
        moves[toy.blank, np.array(toy.durations) == 0] = -np.inf
        if count >= max_symbols:
            moves[np.arange(toy.vocab) != toy.blank] = -np.inf
        token, index = np.unravel_index(np.argmax(moves), moves.shape)
        duration = toy.durations[index]
        if token != toy.blank:
            labels.append(int(token))
            count = count + 1 if duration == 0 else 0
        else:
            count = 0
        t += duration
    return labels


def labels_of(tokens, length):
    return tuple(int(x) for x in np.asarray(tokens)[:length])


# ------------------------------------------------------------------------------------- greedy
GREEDY_CASES = [
    # durations, blank, max_symbols, duration_bias
    pytest.param([0, 1], 0, 1, None, id="d01-blank0-s1"),
    pytest.param([0, 1], 0, 3, [1.5, 0.0], id="d01-blank0-s3-zero-biased"),
    pytest.param([0, 1, 2, 3, 4], -1, 2, None, id="d01234-blank-1-s2"),
    pytest.param([0, 1, 2, 3, 4], 4, 3, [1.0, 0.0, 0.0, 0.0, 0.0], id="d01234-blank-last-s3"),
    pytest.param([0, 1, 2, 3, 4], 0, 2, [0.0, -1.0, 0.0, 1.0, 2.0], id="d01234-long"),
    pytest.param([1, 2], 0, 2, None, id="d12-blank0"),
    pytest.param([1, 2], -1, 1, None, id="d12-blank-1"),
]


@pytest.mark.parametrize("durations, blank, max_symbols, duration_bias", GREEDY_CASES)
def test_greedy_follows_the_numpy_rules(durations, blank, max_symbols, duration_bias):
    vocab = 5
    toy = ToyTDT(vocab, durations, blank, scale=2.0, duration_bias=duration_bias, seed=11)
    num_frames = 10
    frames = frames_of(4, num_frames, seed=12)
    # Full, shorter, shorter than max(durations), and empty samples.
    lengths = np.array([10, 7, 1, 0], np.int32)
    state = tdt.tdt_greedy_initial_state(toy.predictor_step, toy.initial_predictor_state(4),
                                         blank, vocab_size=vocab)
    tokens, state = tdt.tdt_greedy_search(frames, lengths, state, toy.joint_fn,
                                          toy.predictor_step, durations, max_symbols, blank)
    assert tokens.shape == (4, num_frames * max_symbols)
    emitted_any = False
    for b in range(4):
        emitted, skip = numpy_greedy(toy, frames[b, :lengths[b]].astype(np.float64), max_symbols)
        np.testing.assert_array_equal(tokens[b], greedy_slots(emitted, num_frames, max_symbols))
        assert int(state["skip"][b]) == skip
        last = emitted[-1][2] if emitted else toy.blank
        assert int(state["last_token"][b]) == last
        emitted_any |= len(emitted) > 1
    assert emitted_any, "the toy model should emit labels: the check would be vacuous"


def test_greedy_covers_duration_zero_and_the_symbol_cap():
    # Zero durations dominate: labels stay on their frame until the cap moves them on.
    durations, max_symbols = [0, 1, 2], 2
    toy = ToyTDT(4, durations, scale=2.0, duration_bias=[3.0, 0.0, 0.0], seed=21)
    frames = frames_of(1, 8, seed=22)
    emitted, _ = numpy_greedy(toy, frames[0].astype(np.float64), max_symbols)
    per_frame = np.bincount([t for t, _, _ in emitted], minlength=8)
    assert per_frame.max() == max_symbols  # the cap is reached: the case is not vacuous
    state = tdt.tdt_greedy_initial_state(toy.predictor_step, toy.initial_predictor_state(1))
    tokens, _ = tdt.tdt_greedy_search(frames, [8], state, toy.joint_fn, toy.predictor_step,
                                      durations, max_symbols)
    np.testing.assert_array_equal(tokens[0], greedy_slots(emitted, 8, max_symbols))
    assert tdt.NO_TOKEN == decoding.NO_TOKEN  # compact_tokens squeezes out tdt's empty slots
    compact = decoding.compact_tokens(tokens).numpy()[0]
    assert list(compact) == [token for _, _, token in emitted]


GREEDY_SPEC = {"predictor_out": tf.TensorSpec([None, HIDDEN]),
               "predictor_state": {"h": tf.TensorSpec([None, HIDDEN])},
               "last_token": tf.TensorSpec([None], tf.int32),
               "skip": tf.TensorSpec([None], tf.int32)}


@pytest.mark.parametrize("durations, blank", [([0, 1, 2, 3, 4], -1), ([1, 2], 0), ([0, 1], 2)])
def test_greedy_chunked_equals_whole_in_tf_function(durations, blank):
    vocab, max_symbols = 5, 3
    toy = ToyTDT(vocab, durations, blank, scale=2.0,
                 duration_bias=np.linspace(-1.0, 1.0, len(durations)), seed=31)
    frames = frames_of(3, 13, seed=32)
    lengths = np.array([13, 9, 2], np.int32)
    search = tf.function(
        lambda f, n, s: tdt.tdt_greedy_search(f, n, s, toy.joint_fn, toy.predictor_step,
                                              durations, max_symbols, blank),
        input_signature=[tf.TensorSpec([None, None, ENC_DIM]), tf.TensorSpec([None], tf.int32),
                         GREEDY_SPEC])
    start = tdt.tdt_greedy_initial_state(toy.predictor_step, toy.initial_predictor_state(3),
                                         blank, vocab_size=vocab)
    whole, whole_state = search(frames, lengths, start)
    state, pieces, carried = start, [], 0
    for begin, end in ((0, 1), (1, 4), (4, 5), (5, 7), (7, 12), (12, 13)):
        chunk_lengths = np.clip(lengths - begin, 0, end - begin).astype(np.int32)
        tokens, state = search(frames[:, begin:end], chunk_lengths, state)
        pieces.append(np.asarray(tokens).reshape(3, end - begin, max_symbols))
        carried += int(np.sum(np.asarray(state["skip"])[chunk_lengths == end - begin] > 0))
    chunked = np.concatenate(pieces, axis=1).reshape(3, -1)
    np.testing.assert_array_equal(chunked, whole)
    for key in ("skip", "last_token"):
        np.testing.assert_array_equal(state[key], whole_state[key])
    np.testing.assert_allclose(state["predictor_out"], whole_state["predictor_out"], atol=1e-6)
    for b in range(3):
        emitted, skip = numpy_greedy(toy, frames[b, :lengths[b]].astype(np.float64), max_symbols)
        np.testing.assert_array_equal(whole[b], greedy_slots(emitted, 13, max_symbols))
        assert int(whole_state["skip"][b]) == skip
    if max(durations) > 1:
        assert carried > 0, "no move crossed a chunk boundary: the check would be vacuous"


# ---------------------------------------------------------------------------------- beam search
BEAM_CASES = [
    # durations, blank, max_symbols, frames per sample, beam size (never prunes)
    pytest.param([0, 1, 2], 0, 1, [4, 3], 160, id="d012-s1"),
    pytest.param([0, 1, 2], -1, 2, [2, 1], 128, id="d012-s2-blank-1"),
    pytest.param([1, 2], 2, 1, [4, 1], 96, id="d12-blank-last"),
    pytest.param([0, 1], 1, 1, [4, 2], 128, id="d01-blank1"),
]


@pytest.mark.parametrize("durations, blank, max_symbols, lengths, beam_size", BEAM_CASES)
def test_beam_search_finds_every_best_alignment(durations, blank, max_symbols, lengths,
                                                beam_size):
    vocab = 3
    toy = ToyTDT(vocab, durations, blank, scale=1.5, seed=41)
    frames = frames_of(2, max(lengths), seed=42)
    lengths = np.array(lengths, np.int32)
    state = tdt.tdt_beam_initial_state(toy.predictor_step, toy.initial_predictor_state(2),
                                       beam_size, blank, vocab_size=vocab)
    state = tdt.tdt_beam_search(frames, lengths, state, toy.joint_fn, toy.predictor_step,
                                durations, max_symbols, blank)
    tokens, token_lengths, scores = decoding.best_hypothesis(state)
    for b in range(2):
        best = all_alignments(toy, frames[b, :lengths[b]].astype(np.float64), max_symbols)
        assert len(best) < beam_size
        (labels, _), score = max(best.items(), key=lambda item: item[1])
        assert labels_of(tokens[b], token_lengths[b]) == labels
        np.testing.assert_allclose(scores[b], score, rtol=1e-5, atol=1e-5)
        # Every hypothesis kept is a distinct (labels, frames to skip) with its best score.
        kept = {}
        for k in np.flatnonzero(np.isfinite(state["scores"][b].numpy())):
            key = (labels_of(state["tokens"][b, k], state["lengths"][b, k]),
                   int(state["skip"][b, k]))
            assert key not in kept
            kept[key] = float(state["scores"][b, k])
        assert set(kept) == set(best)
        for key, score in best.items():
            np.testing.assert_allclose(kept[key], score, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("durations, max_symbols", [([0, 1, 2, 3, 4], 2), ([1, 2], 1)])
def test_beam_of_one_takes_the_best_move(durations, max_symbols):
    toy = ToyTDT(6, durations, scale=2.0, seed=51)
    frames = frames_of(2, 12, seed=52)
    lengths = np.array([12, 7], np.int32)
    state = tdt.tdt_beam_initial_state(toy.predictor_step, toy.initial_predictor_state(2), 1)
    state = tdt.tdt_beam_search(frames, lengths, state, toy.joint_fn, toy.predictor_step,
                                durations, max_symbols)
    tokens, token_lengths, _ = decoding.best_hypothesis(state)
    for b in range(2):
        expected = numpy_best_move_path(toy, frames[b, :lengths[b]].astype(np.float64),
                                        max_symbols)
        assert list(labels_of(tokens[b], token_lengths[b])) == expected and expected


def beam_spec(beam_size):
    return {"scores": tf.TensorSpec([None, beam_size]),
            "tokens": tf.TensorSpec([None, beam_size, None], tf.int32),
            "lengths": tf.TensorSpec([None, beam_size], tf.int32),
            "predictor_out": tf.TensorSpec([None, beam_size, HIDDEN]),
            "predictor_state": {"h": tf.TensorSpec([None, beam_size, HIDDEN])},
            "skip": tf.TensorSpec([None, beam_size], tf.int32)}


@pytest.mark.parametrize("durations", [[0, 1, 2, 3, 4], [1, 2]])
def test_beam_search_chunked_equals_whole_in_tf_function(durations):
    beam_size, max_symbols = 4, 2
    toy = ToyTDT(5, durations, blank=-1, scale=1.0,
                 duration_bias=np.linspace(-0.5, 1.5, len(durations)), seed=61)
    frames = frames_of(2, 11, seed=62)
    lengths = np.array([11, 6], np.int32)
    search = tf.function(
        lambda f, n, s: tdt.tdt_beam_search(f, n, s, toy.joint_fn, toy.predictor_step,
                                            durations, max_symbols, blank=-1),
        input_signature=[tf.TensorSpec([None, None, ENC_DIM]), tf.TensorSpec([None], tf.int32),
                         beam_spec(beam_size)])
    start = tdt.tdt_beam_initial_state(toy.predictor_step, toy.initial_predictor_state(2),
                                       beam_size, blank=-1, vocab_size=5)
    whole = search(frames, lengths, start)
    state, carried = start, 0
    for begin, end in ((0, 1), (1, 4), (4, 5), (5, 10), (10, 11)):
        chunk_lengths = np.clip(lengths - begin, 0, end - begin).astype(np.int32)
        state = search(frames[:, begin:end], chunk_lengths, state)
        carried += int(np.sum(np.asarray(state["skip"])[0] > 0))
    valid = np.isfinite(whole["scores"].numpy())
    np.testing.assert_array_equal(np.isfinite(state["scores"].numpy()), valid)
    np.testing.assert_allclose(state["scores"].numpy()[valid], whole["scores"].numpy()[valid],
                               atol=1e-5)
    for key in ("tokens", "lengths", "skip", "predictor_out"):
        np.testing.assert_allclose(np.asarray(state[key])[valid], np.asarray(whole[key])[valid],
                                   atol=1e-5)
    assert carried > 0, "no hypothesis crossed a chunk boundary: the check would be vacuous"
    assert valid.all() and np.asarray(decoding.best_hypothesis(whole)[1]).min() > 0


# ------------------------------------------------------------------------------ argument checks
def test_arguments_are_checked_early():
    toy = ToyTDT(4, [0, 1, 2])
    greedy = tdt.tdt_greedy_initial_state(toy.predictor_step, toy.initial_predictor_state(2))
    beam = tdt.tdt_beam_initial_state(toy.predictor_step, toy.initial_predictor_state(2), 2)
    frames, lengths = frames_of(2, 3), np.array([3, 2], np.int32)

    def greedy_search(**options):
        kwargs = dict(durations=[0, 1, 2], max_symbols_per_frame=2, blank=0)
        kwargs.update(options)
        state = kwargs.pop("state", greedy)
        return tdt.tdt_greedy_search(frames, lengths, state, toy.joint_fn, toy.predictor_step,
                                     **kwargs)

    def beam_search(**options):
        kwargs = dict(durations=[0, 1, 2], max_symbols_per_frame=2, blank=0)
        kwargs.update(options)
        state = kwargs.pop("state", beam)
        return tdt.tdt_beam_search(frames, lengths, state, toy.joint_fn, toy.predictor_step,
                                   **kwargs)

    for search in (greedy_search, beam_search):
        for durations in ([], [0, 2], [2, 1], [1, 1], [-1, 1], [True, 1], "01", [0.0, 1.0]):
            with pytest.raises(ValueError, match="durations"):
                search(durations=durations)
        for symbols in (0, -1, 1.5, True, None):
            with pytest.raises(ValueError, match="max_symbols_per_frame"):
                search(max_symbols_per_frame=symbols)
        for blank in (1.0, True, "0", 4, -5):  # V = 4 token logits
            with pytest.raises(ValueError, match="blank"):
                search(blank=blank)
        # joint_fn gives V + 3 logits: durations of 7 values leave no token logit.
        with pytest.raises(ValueError, match="V >= 1"):
            search(durations=[0, 1, 2, 3, 4, 5, 6])
    with pytest.raises(ValueError, match="state"):
        greedy_search(state={"predictor_out": greedy["predictor_out"]})
    with pytest.raises(ValueError, match="state"):
        beam_search(state=greedy)
    three = tdt.tdt_greedy_initial_state(toy.predictor_step, toy.initial_predictor_state(3))
    with pytest.raises(ValueError, match=r"state\['skip'\]"):
        greedy_search(state=three)
    three = tdt.tdt_beam_initial_state(toy.predictor_step, toy.initial_predictor_state(3), 2)
    with pytest.raises(ValueError, match="batch sizes"):
        beam_search(state=three)
    with pytest.raises(ValueError, match="beam sizes"):
        beam_search(state=dict(beam, skip=tf.zeros([2, 3], tf.int32)))
    # Batch sizes known only at run time are checked then.
    search = tf.function(
        lambda f, n, s: tdt.tdt_greedy_search(f, n, s, toy.joint_fn, toy.predictor_step,
                                              [0, 1, 2]),
        input_signature=[tf.TensorSpec([None, None, ENC_DIM]), tf.TensorSpec([None], tf.int32),
                         GREEDY_SPEC])
    three = tdt.tdt_greedy_initial_state(toy.predictor_step, toy.initial_predictor_state(3))
    with pytest.raises(tf.errors.InvalidArgumentError, match="same batch size"):
        search(frames, lengths, three)
    for beam_size in (0, -2, 2.0, True, None):
        with pytest.raises(ValueError, match="beam_size"):
            tdt.tdt_beam_initial_state(toy.predictor_step, toy.initial_predictor_state(2),
                                       beam_size)
    for initial in (tdt.tdt_greedy_initial_state,
                    lambda *args, **kw: tdt.tdt_beam_initial_state(*args[:2], 2, **kw)):
        with pytest.raises(ValueError, match="vocab_size"):
            initial(toy.predictor_step, toy.initial_predictor_state(2), blank=-1)
        with pytest.raises(ValueError, match="blank"):
            initial(toy.predictor_step, toy.initial_predictor_state(2), blank=4, vocab_size=4)
        with pytest.raises(ValueError, match="vocab_size"):
            initial(toy.predictor_step, toy.initial_predictor_state(2), blank=-1, vocab_size=0)
