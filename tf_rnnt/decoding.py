"""Transducer decoding in plain TensorFlow: batched greedy search and beam search, chunk by chunk.

Both searches run on encoder frames and two callables, so they work with any prediction network
and joint (the Keras ones included) and trace into `tf.function`, SavedModels and TFLite:

  predictor_step(tokens, state) -> (output, new_state)
      `tokens` `[N]` int32, `state` any nest of `[N, ...]` tensors -> output `[N, P]` and the
      new state (same structure). The prediction network's step for one token.
  joint_fn(encoder_frames, predictor_output) -> logits
      `[N, D]` and `[N, P]` -> `[N, V]` (unnormalized; `joint_fn_from_layer` makes one from a
      `tf_rnnt.keras.RNNTJoint` through its plain-TF `logits`).

Each search takes a state and returns the next one, so decoding a stream chunk by chunk gives the
same result as decoding it whole. States are dicts of tensors (nests), made by
`greedy_initial_state` / `beam_initial_state` from the predictor's own initial state.

Greedy search (`greedy_search`): at each frame the joint's argmax; a label is emitted and fed to
the predictor and the frame is scored again, up to `max_symbols_per_frame` labels; blank moves on
to the next frame.

Beam search (`beam_search`): "modified beam search" (one symbol per frame: a hypothesis moves to
the next frame after blank or after one label), the search of k2/icefall (Kuang et al. 2022,
"Pruned RNN-T for fast, memory-efficient ASR training", sec. 4) and of the one-step constrained
search of Saon et al. 2020, "Alignment-length synchronous decoding for RNN transducer" (ALSD;
here, the alignment length advances by exactly one frame per step). Hypotheses with the same
label sequence are merged (prefix merging, Graves 2012, "Sequence transduction with recurrent
neural networks"): their probabilities are added (`merge="sum"`) or the better one is kept
(`merge="max"`, which makes the search a Viterbi beam search for the best single alignment).
"""

import tensorflow as tf

from tf_rnnt._tdt_decoding import (  # noqa: F401  (TDT searches, public here)
    _batch_size,
    _extend_hypotheses,
    _fold,
    _keep_shapes,
    _unfold,
    tdt_beam_initial_state,
    tdt_beam_search,
    tdt_greedy_initial_state,
    tdt_greedy_search,
)

NO_TOKEN = -1  # empty slots in token outputs


def joint_fn_from_layer(joint):
    """`joint_fn` of a `tf_rnnt.keras.RNNTJoint` (or any layer with the same `logits` method).

    Args:
      joint: the layer; its `logits(encoder_out [B, T, D], predictor_out [B, U+1, P])` gives
        `[B, T, U+1, V]` logits with plain TensorFlow ops.

    Returns:
      `joint_fn(encoder_frames [N, D], predictor_output [N, P]) -> [N, V]` float32 logits.
    """

    def joint_fn(encoder_frames, predictor_output):
        logits = joint.logits(encoder_frames[:, None, :], predictor_output[:, None, :])
        return tf.cast(logits[:, 0, 0, :], tf.float32)

    return joint_fn


def _check_int(value, name, minimum):
    """A Python int argument >= minimum, else ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"tf_rnnt.decoding: {name} must be an int >= {minimum}, got {value!r}.")
    return value


def _check_blank(blank, vocab_size=None):
    """`blank` as a Python int; a negative one counts from the end of V, so it needs V here."""
    if isinstance(blank, bool) or not isinstance(blank, int):
        raise ValueError(f"tf_rnnt.decoding: blank must be an int, got {blank!r}.")
    if vocab_size is not None:
        if not -vocab_size <= blank < vocab_size:
            raise ValueError(f"tf_rnnt.decoding: blank={blank} is outside [-V, V) for "
                             f"V={vocab_size}.")
        return blank % vocab_size
    if blank < 0:
        raise ValueError(f"tf_rnnt.decoding: blank={blank} counts from the end of the "
                         f"vocabulary, so pass vocab_size=V (or give the blank as V + {blank}).")
    return blank


def _blank_id(blank, vocab):
    """The blank id in [0, V) for a Python int blank (negative: from the end) and V (tensor)."""
    return blank if blank >= 0 else vocab + blank


def _checked_state(encoder_out, state, argument):
    """`encoder_out` once the batch of every tensor of `state` matches it (run time; a state of
    another batch would otherwise be broadcast or misread)."""
    batch = tf.shape(encoder_out)[0]
    checks = []
    for x in tf.nest.flatten(state):
        static = x.shape[:1].num_elements() if x.shape.rank else None
        if static is not None and encoder_out.shape[0] is not None and \
                static != encoder_out.shape[0]:
            raise ValueError(f"tf_rnnt.decoding: `{argument}` holds a batch of {static}, "
                             f"`encoder_out` a batch of {encoder_out.shape[0]}.")
        checks.append(tf.debugging.assert_equal(
            tf.shape(x)[0], batch, message=f"tf_rnnt.decoding: the batch of `{argument}` "
            f"differs from the batch of `encoder_out`"))
    with tf.control_dependencies(checks):
        return tf.identity(encoder_out)


def _select(condition, new, old):
    """`where(condition[b], new, old)` for every tensor of two nests of `[B, ...]` tensors."""

    def pick(n, o):
        c = tf.reshape(condition, tf.concat([tf.shape(condition), tf.ones([tf.rank(o) - 1],
                                                                          tf.int32)], 0))
        return tf.where(c, n, o)

    return tf.nest.map_structure(pick, new, old)


# ----------------------------------------------------------------------------------------------
# Greedy search.
# ----------------------------------------------------------------------------------------------
def greedy_initial_state(predictor_step, predictor_state, blank=0, vocab_size=None):
    """The greedy search's state at the start of a stream.

    Args:
      predictor_step: see the module docstring.
      predictor_state: the predictor's initial state, a nest of `[B, ...]` tensors.
      blank: the blank id, also the start symbol; negative counts from the end of V (then
        `vocab_size` is needed).
      vocab_size: V, or None.

    Returns:
      `{"predictor_out": [B, P], "predictor_state": nest}`: the predictor after the start symbol.
    """
    blank = _check_blank(blank, vocab_size)
    out, state = predictor_step(tf.fill([_batch_size(predictor_state)], blank), predictor_state)
    return {"predictor_out": out, "predictor_state": state}


def greedy_search(encoder_out, encoder_lengths, state, joint_fn, predictor_step,
                  max_symbols_per_frame=5, blank=0):
    """Batched greedy decoding of a chunk of encoder frames.

    Samples of a batch advance together; a sample whose frames ran out (`t >= encoder_lengths`)
    or that chose blank for this frame stops changing. The loops are `tf.while_loop`s and the
    token buffer is a tensor (no TensorArray), so the function converts to TFLite builtin ops when
    the shapes are static.

    Args:
      encoder_out: `[B, T, D]` encoder frames.
      encoder_lengths: `[B]` int, valid frames per sample.
      state: from `greedy_initial_state` or the previous chunk.
      joint_fn, predictor_step: see the module docstring.
      max_symbols_per_frame: labels emitted per frame at most (>= 1).
      blank: the blank id; negative counts from the end of V.

    Returns:
      `(tokens, new_state)`: tokens `[B, T * max_symbols_per_frame]` int32, slot
      `t * max_symbols_per_frame + s` holding the s-th label emitted at frame t or `NO_TOKEN`.
    """
    symbols = _check_int(max_symbols_per_frame, "max_symbols_per_frame", 1)
    _check_int(blank, "blank", -2**31)
    encoder_out = _checked_state(tf.convert_to_tensor(encoder_out), state, "state")
    encoder_lengths = tf.cast(encoder_lengths, tf.int32)
    batch = tf.shape(encoder_out)[0]
    num_frames = tf.shape(encoder_out)[1]
    columns = tf.range(symbols)

    def frame_body(t, state, tokens):
        frame = tf.gather(encoder_out, t, axis=1)

        def symbol_body(s, active, state, frame_tokens):
            logits = joint_fn(frame, state["predictor_out"])
            blank_id = _blank_id(blank, tf.shape(logits)[-1])
            token = tf.argmax(logits, axis=-1, output_type=tf.int32)
            emit = active & tf.not_equal(token, blank_id)
            frame_tokens = tf.where(emit[:, None] & tf.equal(columns, s)[None, :],
                                    token[:, None], frame_tokens)
            out, pred_state = predictor_step(tf.where(emit, token, blank_id),
                                             state["predictor_state"])
            new = {"predictor_out": out, "predictor_state": pred_state}
            return (s + 1, emit, _keep_shapes(_select(emit, new, state), state),
                    _keep_shapes(frame_tokens, columns_init))

        frame_tokens = columns_init
        _, _, state, frame_tokens = tf.while_loop(
            lambda s, active, *_: (s < symbols) & tf.reduce_any(active), symbol_body,
            (tf.constant(0), t < encoder_lengths, state, frame_tokens))
        at_t = tf.equal(tf.range(num_frames), t)[None, :, None]
        return t + 1, state, _keep_shapes(tf.where(at_t, frame_tokens[:, None, :], tokens), tokens)

    columns_init = tf.fill([batch, symbols], NO_TOKEN)
    columns_init.set_shape([encoder_out.shape[0], symbols])
    tokens = tf.fill([batch, num_frames, symbols], NO_TOKEN)
    tokens.set_shape([encoder_out.shape[0], encoder_out.shape[1], symbols])
    _, state, tokens = tf.while_loop(lambda t, *_: t < num_frames, frame_body,
                                     (tf.constant(0), state, tokens))
    return tf.reshape(tokens, [batch, num_frames * symbols]), state


# ----------------------------------------------------------------------------------------------
# Beam search.
# ----------------------------------------------------------------------------------------------
def beam_initial_state(predictor_step, predictor_state, beam_size, blank=0, vocab_size=None):
    """The beam search's state at the start of a stream: one empty hypothesis per sample.

    Args:
      predictor_step: see the module docstring.
      predictor_state: the predictor's initial state for `B` samples, a nest of `[B, ...]`.
      beam_size: hypotheses kept per sample, `K` (>= 1).
      blank: the blank id, also the start symbol; negative counts from the end of V (then
        `vocab_size` is needed).
      vocab_size: V, or None.

    Returns:
      `{"scores": [B, K] float32 log-probabilities (-inf: an empty slot), "tokens": [B, K, L]
      int32 label sequences padded with NO_TOKEN, "lengths": [B, K] int32, "predictor_out":
      [B, K, P], "predictor_state": nest of [B, K, ...]}`, with L = 0.
    """
    beam_size = _check_int(beam_size, "beam_size", 1)
    start = greedy_initial_state(predictor_step, predictor_state, blank, vocab_size)
    batch = _batch_size(predictor_state)

    def tile(x):
        return tf.repeat(x[:, None], beam_size, axis=1)

    first = tf.equal(tf.range(beam_size), 0)
    scores = tf.where(first, 0.0, float("-inf"))
    return {"scores": tf.tile(scores[None, :], [batch, 1]),
            "tokens": tf.zeros([batch, beam_size, 0], tf.int32),
            "lengths": tf.zeros([batch, beam_size], tf.int32),
            "predictor_out": tile(start["predictor_out"]),
            "predictor_state": tf.nest.map_structure(tile, start["predictor_state"])}


def beam_search(encoder_out, encoder_lengths, state, joint_fn, predictor_step, blank=0,
                merge="sum"):
    """Modified beam search (one symbol per frame) over a chunk of encoder frames.

    At every frame each hypothesis is extended by blank (it keeps its labels) and by every label;
    an extension's score is the hypothesis' score plus the label's log-probability from the
    joint. Extensions with the same label sequence (hypothesis i + blank and hypothesis j + label
    v when i's labels are j's followed by v) are merged, then the best `K` are kept. Samples whose
    frames ran out keep their state.

    Args:
      encoder_out: `[B, T, D]` encoder frames.
      encoder_lengths: `[B]` int, valid frames per sample.
      state: from `beam_initial_state` or the previous chunk (its `K` is the beam size).
      joint_fn, predictor_step: see the module docstring.
      blank: the blank id; negative counts from the end of V.
      merge: "sum" (log-sum-exp of the merged scores: the best label sequence) or "max" (the
        best single alignment).

    Returns:
      The new state; `best_hypothesis` reads the best labels from it.
    """
    if merge not in ("sum", "max"):
        raise ValueError(f"tf_rnnt.decoding: merge must be 'sum' or 'max', got {merge!r}")
    _check_int(blank, "blank", -2**31)
    if state["scores"].shape[1] is not None:
        _check_int(state["scores"].shape[1], "the beam size of `state`", 1)
    encoder_out = _checked_state(tf.convert_to_tensor(encoder_out), state, "state")
    encoder_lengths = tf.cast(encoder_lengths, tf.int32)
    batch = tf.shape(encoder_out)[0]
    num_frames = tf.shape(encoder_out)[1]
    beam = state["scores"].shape[1] or tf.shape(state["scores"])[1]
    # Room for one more label per frame; trimmed to the longest hypothesis at the end.
    state = dict(state, tokens=tf.pad(state["tokens"], [[0, 0], [0, 0], [0, num_frames]],
                                      constant_values=NO_TOKEN))
    max_length = tf.shape(state["tokens"])[2]
    positions = tf.range(max_length)

    def frame_body(t, state):
        frame = tf.repeat(tf.gather(encoder_out, t, axis=1), beam, axis=0)  # [B * K, D]
        logits = joint_fn(frame, _fold(state["predictor_out"]))
        log_probs = _unfold(tf.nn.log_softmax(logits, axis=-1), batch)  # [B, K, V]
        vocab = tf.shape(log_probs)[2]
        blank_id = _blank_id(blank, vocab)
        scores, tokens, lengths = state["scores"], state["tokens"], state["lengths"]
        candidates = scores[:, :, None] + log_probs

        # Merging: hypothesis i (labels y + [v]) + blank == hypothesis j (labels y) + v.
        valid = scores > float("-inf")
        # Each hypothesis' last label (0 for empty ones, which match nothing below).
        last = tf.maximum(tf.gather(tokens, tf.maximum(lengths - 1, 0), axis=2, batch_dims=2), 0)
        prefix = tf.where(positions[None, None, :] < (lengths - 1)[:, :, None], tokens,
                          NO_TOKEN)
        same = tf.reduce_all(tf.equal(prefix[:, :, None, :], tokens[:, None, :, :]), axis=3)
        match = (same & tf.equal(lengths[:, :, None], lengths[:, None, :] + 1)
                 & valid[:, :, None] & valid[:, None, :])  # [B, K_i, K_j]
        from_j = tf.gather(candidates, last, axis=2, batch_dims=1)  # [b, j, i] = cand[b, j, last_i]
        from_j = tf.where(match, tf.transpose(from_j, [0, 2, 1]), float("-inf"))
        blank_scores = tf.concat([candidates[:, :, blank_id:blank_id + 1], from_j], axis=2)
        if merge == "sum":
            merged = tf.reduce_logsumexp(blank_scores, axis=2)
        else:
            merged = tf.reduce_max(blank_scores, axis=2)
        one_hot_last = tf.one_hot(last, vocab, on_value=True, off_value=False)  # [B, K_i, V]
        dropped = tf.reduce_any(match[:, :, :, None] & one_hot_last[:, :, None, :], axis=1)
        is_blank = tf.equal(tf.range(vocab), blank_id)[None, None, :]
        candidates = tf.where(is_blank, merged[:, :, None],
                              tf.where(dropped, float("-inf"), candidates))

        best, index = tf.math.top_k(tf.reshape(candidates, [batch, -1]), k=beam)
        source = index // vocab  # [B, K]
        label = index % vocab
        emit = tf.not_equal(label, blank_id) & (best > float("-inf"))
        new_tokens, new_lengths, gathered = _extend_hypotheses(
            tokens, lengths, state, source, label, emit, positions, blank_id, predictor_step,
            batch)
        new = dict(gathered, scores=best, tokens=new_tokens, lengths=new_lengths)
        return t + 1, _keep_shapes(_select(t < encoder_lengths, new, state), state)

    _, state = tf.while_loop(lambda t, _: t < num_frames, frame_body, (tf.constant(0), state))
    return dict(state, tokens=state["tokens"][:, :, :tf.reduce_max(
        tf.concat([tf.reshape(state["lengths"], [-1]), [0]], 0))])


def compact_tokens(tokens):
    """`[B, S]` token slots with empty ones (`NO_TOKEN`, as `greedy_search` returns them) ->
    `[B, K]` each sample's labels in order, padded with `NO_TOKEN`; K is the most labels of a
    sample."""
    keep = tokens != NO_TOKEN
    return tf.RaggedTensor.from_row_lengths(
        tf.boolean_mask(tokens, keep), tf.reduce_sum(tf.cast(keep, tf.int32), axis=1)
    ).to_tensor(default_value=NO_TOKEN)


def best_hypothesis(state):
    """The best hypothesis of each sample in a beam search state.

    Returns:
      `(tokens [B, L] int32 padded with NO_TOKEN, lengths [B] int32, scores [B] float32)`.
    """
    best = tf.argmax(state["scores"], axis=1, output_type=tf.int32)
    tokens = tf.gather(state["tokens"], best, axis=1, batch_dims=1)
    lengths = tf.gather(state["lengths"], best, axis=1, batch_dims=1)
    scores = tf.gather(state["scores"], best, axis=1, batch_dims=1)
    return tokens, lengths, scores
