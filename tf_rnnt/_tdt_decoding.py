"""TDT (Token-and-Duration Transducer) decoding in plain TensorFlow: greedy and beam search.

The searches follow the conventions of the TDT loss (`tf_rnnt.tdt_loss`; Xu et al. 2023, "Efficient
sequence transduction by jointly predicting tokens and durations", arXiv 2304.06795): the joint
gives `[N, V + D]` logits, `V` token logits (blank among them) then `D = len(durations)` duration
logits, each normalized by its own log-softmax. From frame `t`, blank with duration `d >= 1`
moves to frame `t + d`; a label with duration `d >= 0` is emitted, fed to the predictor, and
moves to frame `t + d` (0 stays on the frame).

The callables are those of `tf_rnnt.decoding`:

  predictor_step(tokens, state) -> (output, new_state)
      `tokens` `[N]` int32, `state` any nest of `[N, ...]` tensors -> `[N, P]` and the new state.
  joint_fn(encoder_frames, predictor_output) -> logits
      `[N, H]` and `[N, P]` -> `[N, V + D]` (unnormalized).

Streaming: a move may land past the end of a chunk. Each state carries, per sample (greedy) or
per hypothesis (beam), `skip`: how many frames of the next chunk that move still covers, so
decoding a stream chunk by chunk gives the same result as decoding it whole.
"""

import tensorflow as tf

from tf_rnnt import _contract as contract

__all__ = ["tdt_beam_initial_state", "tdt_beam_search", "tdt_greedy_initial_state",
           "tdt_greedy_search"]

# tf_rnnt.decoding.NO_TOKEN, the empty slots of token outputs (decoding.py re-exports this
# module's functions, so this module does not import it).
NO_TOKEN = -1
_GREEDY_KEYS = ("predictor_out", "predictor_state", "last_token", "skip")
_BEAM_KEYS = ("scores", "tokens", "lengths", "predictor_out", "predictor_state", "skip")


# ----------------------------------------------------------------------------------------------
# Argument checks and small helpers.
# ----------------------------------------------------------------------------------------------
def _start_token(blank, vocab_size, owner):
    """The start symbol (blank) as a Python int in `[0, V)`."""
    blank = contract.check_blank(blank, owner)
    if vocab_size is not None:
        vocab_size = contract.check_positive_int(vocab_size, "vocab_size", owner,
                                                 allow_none=False)
        return contract.check_blank(blank, owner, vocab_size) % vocab_size
    if blank < 0:
        raise ValueError(f"{owner}: a negative blank ({blank}) counts from the end of the token "
                         "logits; pass vocab_size (V) to resolve it")
    return blank


def _search_blank(blank, vocab_size, owner):
    """Blank in `[0, V)` for a vocabulary size known statically (int) or not (tensor)."""
    if isinstance(vocab_size, int):
        if vocab_size < 1:
            raise ValueError(f"{owner}: joint_fn must return [N, V + D] logits with V >= 1 token "
                             f"logits and D = len(durations) duration logits, got {vocab_size} "
                             "token logits")
        return contract.check_blank(blank, owner, vocab_size) % vocab_size
    return contract.normalized_blank(blank, vocab_size, owner)


def _split_logits(logits, num_durations, blank, owner):
    """`[N, V + D]` -> token log-probs `[N, V]`, duration log-probs `[N, D]`, blank, V."""
    logits = tf.cast(logits, tf.float32)
    last = logits.shape[-1]
    vocab_size = last - num_durations if last is not None else (
        tf.shape(logits)[-1] - num_durations)
    blank = _search_blank(blank, vocab_size, owner)
    token_logits = logits[:, :vocab_size]
    duration_logits = logits[:, tf.shape(logits)[-1] - num_durations:]
    duration_logits.set_shape([None, num_durations])
    return token_logits, duration_logits, blank, vocab_size


def _check_search_args(durations, max_symbols_per_frame, blank, owner):
    """Checked `(durations, max_symbols_per_frame, blank)` of a TDT search."""
    durations = contract.check_durations(durations, owner)
    symbols = contract.check_positive_int(max_symbols_per_frame, "max_symbols_per_frame", owner,
                                          maximum=2**20, allow_none=False)
    return durations, symbols, contract.check_blank(blank, owner)


def _check_search_inputs(encoder_out, encoder_lengths, state, keys, owner, beam=False):
    """Tensors of a search's inputs; ValueError on a wrong rank, missing state entries, or
    statically known batch sizes (and beam sizes) that disagree. Batch sizes known only at run
    time are checked then (InvalidArgumentError)."""
    encoder_out = tf.convert_to_tensor(encoder_out)
    if encoder_out.shape.rank is not None and encoder_out.shape.rank != 3:
        raise ValueError(f"{owner}: encoder_out must have shape [B, T, H], got "
                         f"{encoder_out.shape}")
    encoder_lengths = contract.int32_tensor(encoder_lengths, "encoder_lengths", owner, rank=1)
    if not isinstance(state, dict) or any(key not in state for key in keys):
        raise ValueError(f"{owner}: state must be a dict with keys {', '.join(keys)} (from the "
                         f"initial-state function or the previous chunk), got "
                         f"{sorted(state) if isinstance(state, dict) else type(state).__name__}")
    state = tf.nest.map_structure(tf.convert_to_tensor, {key: state[key] for key in keys})
    leaves = list(zip(_paths(state), tf.nest.flatten(state)))
    for path, leaf in leaves:
        if leaf.shape.rank is not None and leaf.shape.rank < (2 if beam else 1):
            raise ValueError(f"{owner}: state{path} must have shape "
                             f"{'[B, K, ...]' if beam else '[B, ...]'}, got {leaf.shape}")
    dims = {"encoder_out": contract.static_dim(encoder_out, 0),
            "encoder_lengths": contract.static_dim(encoder_lengths, 0)}
    dims.update((f"state{path}", contract.static_dim(leaf, 0)) for path, leaf in leaves)
    contract.check_same_dims(dims, "batch sizes", owner)
    if beam:
        contract.check_same_dims({f"state{path}": contract.static_dim(leaf, 1)
                                  for path, leaf in leaves}, "beam sizes (axis 1)", owner)
    if None in dims.values():
        batch = tf.shape(encoder_out)[0]
        sizes = [tf.shape(encoder_lengths)[0]] + [tf.shape(leaf)[0] for _, leaf in leaves]
        check = tf.debugging.Assert(
            tf.reduce_all(tf.equal(tf.stack(sizes), batch)),
            [f"{owner}: encoder_out, encoder_lengths and every state tensor must have the same "
             "batch size (axis 0); encoder_out's, then the others':", batch, tf.stack(sizes)])
        with tf.control_dependencies([check]):
            encoder_out = tf.identity(encoder_out)
    return encoder_out, encoder_lengths, state


def _paths(nest):
    """`['key']...` strings of a nest's leaves, in `tf.nest.flatten` order."""
    if isinstance(nest, dict):
        return [f"[{key!r}]{p}" for key in sorted(nest) for p in _paths(nest[key])]
    if isinstance(nest, (list, tuple)):
        return [f"[{i}]{p}" for i, x in enumerate(nest) for p in _paths(x)]
    return [""]


def _batch_size(nest):
    return tf.shape(tf.nest.flatten(nest)[0])[0]


def _where(condition, new, old):
    """`where(condition, new, old)` for two nests of tensors with `condition`'s leading shape."""

    def pick(n, o):
        extra = tf.ones([tf.rank(o) - tf.rank(condition)], tf.int32)
        return tf.where(tf.reshape(condition, tf.concat([tf.shape(condition), extra], 0)), n, o)

    return tf.nest.map_structure(pick, new, old)


def _keep_shapes(new, old):
    """`new` with the static shapes of `old` (loop variables keep their shapes: where and
    gather with tensor shapes can forget them, and a static shape must stay static for TFLite)."""

    def restore(n, o):
        n.set_shape(n.shape.merge_with(o.shape))
        return n

    return tf.nest.map_structure(restore, new, old)


def _fold(x):  # [B, K, ...] -> [B * K, ...]
    shape = tf.shape(x)
    return tf.reshape(x, tf.concat([[shape[0] * shape[1]], shape[2:]], 0))


def _unfold(x, batch):  # [B * K, ...] -> [B, K, ...]
    shape = tf.shape(x)
    return tf.reshape(x, tf.concat([[batch, shape[0] // batch], shape[1:]], 0))


def _extend_hypotheses(tokens, lengths, state, source, label, emit, positions, blank_id,
                       predictor_step, batch):
    """Beam hypotheses `source` `[B, K]` of `tokens` `[B, K', S]`, each extended by its `label`
    where `emit` (at `positions` `[S]` = range(S)), the predictor stepped on them (B = `batch`).

    Returns:
      `(tokens, lengths, predictor)`, predictor `{"predictor_out", "predictor_state"}`.
    """
    new_tokens = tf.gather(tokens, source, batch_dims=1)
    new_lengths = tf.gather(lengths, source, batch_dims=1)
    write = emit[:, :, None] & tf.equal(positions[None, None, :], new_lengths[:, :, None])
    new_tokens = tf.where(write, label[:, :, None], new_tokens)
    predictor = tf.nest.map_structure(
        lambda x: tf.gather(x, source, axis=1, batch_dims=1),
        {"predictor_out": state["predictor_out"], "predictor_state": state["predictor_state"]})
    out, pred_state = predictor_step(_fold(tf.where(emit, label, blank_id)),
                                     tf.nest.map_structure(_fold, predictor["predictor_state"]))
    stepped = {"predictor_out": _unfold(out, batch),
               "predictor_state": tf.nest.map_structure(lambda x: _unfold(x, batch), pred_state)}
    return new_tokens, new_lengths + tf.cast(emit, tf.int32), _where(emit, stepped, predictor)


def _frame_lengths(encoder_out, encoder_lengths):
    """Valid frames per sample, clipped to `[0, T]`."""
    return tf.clip_by_value(encoder_lengths, 0, tf.shape(encoder_out)[1])


# ----------------------------------------------------------------------------------------------
# Greedy search.
# ----------------------------------------------------------------------------------------------
def tdt_greedy_initial_state(predictor_step, predictor_state, blank=0, vocab_size=None):
    """The TDT greedy search's state at the start of a stream.

    Args:
      predictor_step: see the module docstring.
      predictor_state: the predictor's initial state, a nest of `[B, ...]` tensors.
      blank: the blank id, also the start symbol; negative counts from the end of the `V` token
        logits (then `vocab_size` is needed).
      vocab_size: `V`, the number of token logits; only needed for a negative blank.

    Returns:
      `{"predictor_out": [B, P], "predictor_state": nest, "last_token": [B] int32 (blank),
      "skip": [B] int32 zeros}`: the predictor after the start symbol, the last label fed to
      it, and the frames of the next chunk to skip.
    """
    owner = "tf_rnnt.decoding.tdt_greedy_initial_state"
    start = _start_token(blank, vocab_size, owner)
    batch = _batch_size(predictor_state)
    out, state = predictor_step(tf.fill([batch], start), predictor_state)
    return {"predictor_out": out, "predictor_state": state,
            "last_token": tf.fill([batch], start), "skip": tf.zeros([batch], tf.int32)}


def tdt_greedy_search(encoder_out, encoder_lengths, state, joint_fn, predictor_step, durations,
                      max_symbols_per_frame=5, blank=0):
    """Batched TDT greedy decoding of a chunk of encoder frames (NeMo's TDT greedy rules).

    Each sample has its own frame pointer `t`, starting at its state's `skip`. At frame `t` the
    joint gives the best token (argmax over the `V` token logits) and the best duration
    (`durations[argmax]` over the `D` duration logits):
      - blank: `t += duration`, at least 1 (a blank never stays on its frame);
      - a label: it is emitted and fed to the predictor, and `t += duration` (0 stays on the
        frame); after `max_symbols_per_frame` labels on one frame, a label of duration 0 moves
        on by 1 frame instead.
    A sample stops when `t >= encoder_lengths`; `t - encoder_lengths` frames are left to skip
    in the next chunk. The loop is a `tf.while_loop` over moves and the token buffer a tensor.

    Args:
      encoder_out: `[B, T, H]` encoder frames.
      encoder_lengths: `[B]` int, valid frames per sample (clipped to `[0, T]`).
      state: from `tdt_greedy_initial_state` or the previous chunk.
      joint_fn, predictor_step: see the module docstring.
      durations: strictly increasing non-negative ints containing 1, as for `tdt_loss`, e.g.
        `[0, 1, 2, 3, 4]`; `joint_fn`'s last `len(durations)` logits score them.
      max_symbols_per_frame: labels emitted on one frame at most.
      blank: the blank id among the `V` token logits, in `[-V, V)`.

    Returns:
      `(tokens, new_state)`: tokens `[B, T * max_symbols_per_frame]` int32, slot
      `t * max_symbols_per_frame + s` holding the s-th label emitted at frame t or `NO_TOKEN`
      (`tf_rnnt.decoding.compact_tokens` squeezes out the empty slots).
    """
    owner = "tf_rnnt.decoding.tdt_greedy_search"
    durations, symbols, blank = _check_search_args(durations, max_symbols_per_frame, blank, owner)
    encoder_out, encoder_lengths, state = _check_search_inputs(
        encoder_out, encoder_lengths, state, _GREEDY_KEYS, owner)
    batch = tf.shape(encoder_out)[0]
    num_frames = tf.shape(encoder_out)[1]
    lengths = _frame_lengths(encoder_out, encoder_lengths)
    duration_values = tf.constant(durations, tf.int32)
    num_slots = num_frames * symbols
    slots = tf.range(num_slots)

    def body(t, count, state, tokens):
        active = t < lengths
        frame = tf.gather(encoder_out, tf.clip_by_value(t, 0, tf.maximum(num_frames - 1, 0)),
                          axis=1, batch_dims=1)
        logits = joint_fn(frame, state["predictor_out"])
        token_logits, duration_logits, blank_id, _ = _split_logits(logits, len(durations), blank,
                                                                   owner)
        token = tf.argmax(token_logits, axis=-1, output_type=tf.int32)
        duration = tf.gather(duration_values,
                             tf.argmax(duration_logits, axis=-1, output_type=tf.int32))
        is_blank = tf.equal(token, blank_id)
        emit = active & ~is_blank
        tokens = tf.where(emit[:, None] & tf.equal(slots[None, :], (t * symbols + count)[:, None]),
                          token[:, None], tokens)
        emitted = count + 1
        advance = tf.where(is_blank, tf.maximum(duration, 1),
                           tf.where(duration > 0, duration,
                                    tf.cast(emitted >= symbols, tf.int32)))
        new_count = tf.where(advance > 0, 0, emitted)
        out, pred_state = predictor_step(tf.where(emit, token, blank_id),
                                         state["predictor_state"])
        stepped = dict(state, predictor_out=out, predictor_state=pred_state, last_token=token)
        state = _keep_shapes(_where(emit, stepped, state), state)
        return (tf.where(active, t + advance, t), tf.where(active, new_count, count), state,
                _keep_shapes(tokens, tokens_init))

    tokens_init = tf.fill([batch, num_slots], NO_TOKEN)
    static_frames = encoder_out.shape[1]
    tokens_init.set_shape([encoder_out.shape[0],
                           None if static_frames is None else static_frames * symbols])
    search_state = {"predictor_out": state["predictor_out"],
                    "predictor_state": state["predictor_state"],
                    "last_token": tf.cast(state["last_token"], tf.int32)}
    skip = tf.maximum(tf.cast(state["skip"], tf.int32), 0)
    t, _, search_state, tokens = tf.while_loop(
        lambda t, *_: tf.reduce_any(t < lengths), body,
        (skip, tf.zeros_like(skip), search_state, tokens_init))
    return tokens, dict(search_state, skip=t - lengths)


# ----------------------------------------------------------------------------------------------
# Beam search.
# ----------------------------------------------------------------------------------------------
def tdt_beam_initial_state(predictor_step, predictor_state, beam_size, blank=0, vocab_size=None):
    """The TDT beam search's state at the start of a stream: one empty hypothesis per sample.

    Args:
      predictor_step: see the module docstring.
      predictor_state: the predictor's initial state for `B` samples, a nest of `[B, ...]`.
      beam_size: hypotheses kept per sample, `K >= 1`.
      blank: the blank id, also the start symbol; negative counts from the end of the `V` token
        logits (then `vocab_size` is needed).
      vocab_size: `V`, the number of token logits; only needed for a negative blank.

    Returns:
      `{"scores": [B, K] float32 (-inf: an empty slot), "tokens": [B, K, L] int32 padded with
      NO_TOKEN, "lengths": [B, K] int32, "predictor_out": [B, K, P], "predictor_state": nest of
      [B, K, ...], "skip": [B, K] int32}` with L = 0; `tf_rnnt.decoding.best_hypothesis` reads
      the best labels from it.
    """
    owner = "tf_rnnt.decoding.tdt_beam_initial_state"
    beam_size = contract.check_positive_int(beam_size, "beam_size", owner, maximum=2**16,
                                            allow_none=False)
    start = tdt_greedy_initial_state(predictor_step, predictor_state, blank, vocab_size)
    batch = _batch_size(predictor_state)

    def tile(x):
        return tf.repeat(x[:, None], beam_size, axis=1)

    scores = tf.where(tf.equal(tf.range(beam_size), 0), 0.0, float("-inf"))
    return {"scores": tf.tile(scores[None, :], [batch, 1]),
            "tokens": tf.zeros([batch, beam_size, 0], tf.int32),
            "lengths": tf.zeros([batch, beam_size], tf.int32),
            "predictor_out": tile(start["predictor_out"]),
            "predictor_state": tf.nest.map_structure(tile, start["predictor_state"]),
            "skip": tf.zeros([batch, beam_size], tf.int32)}


def tdt_beam_search(encoder_out, encoder_lengths, state, joint_fn, predictor_step, durations,
                    max_symbols_per_frame=5, blank=0):
    """TDT beam search over a chunk of encoder frames: time-synchronous, Viterbi merging.

    A sample keeps `K` hypotheses, each waiting at its own arrival frame. A step takes, per
    sample, the earliest frame `t` where a hypothesis waits and expands every hypothesis waiting
    there by every move: blank with each duration `d >= 1` (to `t + d`) and each label with each
    duration `d >= 0` (to `t + d`; `d = 0` stays at `t`, to be expanded again at the next step),
    scored `log P(token) + log P(duration)` from the joint. Hypotheses waiting at later frames
    are kept as they are. Candidates with the same labels and arrival frame are merged, keeping
    the best score (a Viterbi beam search for the best single alignment, like `merge="max"` of
    `tf_rnnt.decoding.beam_search`), and the best `K` of the sample are kept, whatever their
    frames. NeMo's default TDT beam search also goes frame by frame with hypotheses waiting at
    later frames, expanding one hypothesis at a time.

    A hypothesis is complete once its arrival frame is at or past the end of the stream. The
    alignments searched are the move sequences from frame 0 whose moves all start before
    `encoder_lengths` (the last one may land past it) with at most `max_symbols_per_frame`
    labels starting at any one frame. With a beam that never prunes, every kept hypothesis holds
    the best score of its labels and arrival frame, and the best one is the best single
    alignment. A hypothesis arriving past the chunk's end waits there: its `skip` is the number
    of frames of the next chunk that its last move covers.

    With `K = 1` the search takes the best allowed move at each step, which need not be the
    greedy search's move (greedy picks the best token and the best duration apart, then turns
    a blank's duration 0 into 1 and moves a label on after `max_symbols_per_frame`).

    Cost per step: one `joint_fn` and one `predictor_step` call on `B * K` rows, a top-k over
    the `N = K * (1 + V * D)` candidates of a sample, and a pairwise comparison of the best
    `M = min(K * K, N)`: a candidate's duplicates come from other hypotheses, so the best `K`
    distinct ones are among them. Label sequences are compared through the hypotheses they
    extend (`K * K` comparisons of the labels). A sample takes at most
    `max_symbols_per_frame + 1` steps per frame.

    Args:
      encoder_out: `[B, T, H]` encoder frames.
      encoder_lengths: `[B]` int, valid frames per sample (clipped to `[0, T]`).
      state: from `tdt_beam_initial_state` or the previous chunk (its `K` is the beam size).
      joint_fn, predictor_step: see the module docstring.
      durations: strictly increasing non-negative ints containing 1, as for `tdt_loss`.
      max_symbols_per_frame: labels starting at one frame at most, per hypothesis.
      blank: the blank id among the `V` token logits, in `[-V, V)`.

    Returns:
      The new state; `tf_rnnt.decoding.best_hypothesis` reads the best labels from it.
    """
    owner = "tf_rnnt.decoding.tdt_beam_search"
    durations, symbols, blank = _check_search_args(durations, max_symbols_per_frame, blank, owner)
    encoder_out, encoder_lengths, state = _check_search_inputs(
        encoder_out, encoder_lengths, state, _BEAM_KEYS, owner, beam=True)
    num_durations = len(durations)
    batch = tf.shape(encoder_out)[0]
    num_frames = tf.shape(encoder_out)[1]
    lengths = _frame_lengths(encoder_out, encoder_lengths)
    beam = state["scores"].shape[1] or tf.shape(state["scores"])[1]
    duration_values = tf.constant(durations, tf.int32)
    minus_inf = float("-inf")
    # Room for max_symbols_per_frame more labels per frame; trimmed to the longest at the end.
    state["tokens"] = tf.pad(state["tokens"], [[0, 0], [0, 0], [0, num_frames * symbols]],
                             constant_values=NO_TOKEN)
    buffer_size = tf.shape(state["tokens"])[2]
    positions = tf.range(buffer_size)

    def body(arrival, count, pool):
        scores, tokens, hyp_lengths = pool["scores"], pool["tokens"], pool["lengths"]
        live = (scores > minus_inf) & (arrival < lengths[:, None])
        sample_active = tf.reduce_any(live, axis=1)
        t = tf.reduce_min(tf.where(live, arrival, tf.int32.max), axis=1)  # [B]
        t = tf.where(sample_active, t, 0)
        expanding = live & tf.equal(arrival, t[:, None])

        frames = tf.gather(encoder_out,
                           tf.clip_by_value(arrival, 0, tf.maximum(num_frames - 1, 0)),
                           axis=1, batch_dims=1)  # [B, K, H]
        logits = joint_fn(_fold(frames), _fold(pool["predictor_out"]))
        token_logits, duration_logits, blank_id, vocab = _split_logits(logits, num_durations,
                                                                       blank, owner)
        token_lp = _unfold(tf.nn.log_softmax(token_logits, axis=-1), batch)  # [B, K, V]
        duration_lp = _unfold(tf.nn.log_softmax(duration_logits, axis=-1), batch)  # [B, K, D]
        is_blank = tf.equal(tf.range(vocab), blank_id)[:, None]  # [V, 1]
        zero = tf.equal(duration_values, 0)[None, :]  # [1, D]
        allowed = tf.where(is_blank, ~zero, (count < symbols)[:, :, None, None])  # [B, K, V, D]
        moves = scores[:, :, None, None] + token_lp[:, :, :, None] + duration_lp[:, :, None, :]
        moves = tf.where(allowed & expanding[:, :, None, None], moves, minus_inf)
        carried = tf.where((scores > minus_inf) & ~expanding, scores, minus_inf)
        candidates = tf.concat([carried, tf.reshape(moves, [batch, -1])], axis=1)

        # The best min(K * K, N) candidates, then duplicates out (see the docstring).
        per_hyp = vocab * num_durations
        if isinstance(beam, int) and isinstance(per_hyp, int):
            shortlist = min(beam * beam, beam + beam * per_hyp)
        else:
            shortlist = tf.minimum(beam * beam, beam + beam * per_hyp)
        values, index = tf.math.top_k(candidates, k=shortlist)  # [B, M], best first
        is_move = index >= beam
        move = tf.maximum(index - beam, 0)
        source = tf.where(is_move, move // per_hyp, index)
        label = (move // num_durations) % vocab
        duration = tf.gather(duration_values, move % num_durations)
        emit = is_move & tf.not_equal(label, blank_id) & (values > minus_inf)
        new_arrival = tf.where(is_move, t[:, None] + duration,
                               tf.gather(arrival, source, batch_dims=1))
        source_count = tf.gather(count, source, batch_dims=1)
        new_count = tf.where(is_move, tf.where(emit & tf.equal(duration, 0), source_count + 1, 0),
                             source_count)

        # Label classes: a pool hypothesis' labels are named by the first hypothesis holding the
        # same labels; labels + [v] by a hypothesis holding them, else by (class, v).
        width = tf.reduce_max(tf.concat([tf.reshape(hyp_lengths, [-1]), [0]], 0))
        labels = tokens[:, :, :width]
        same = tf.reduce_all(tf.equal(labels[:, :, None, :], labels[:, None, :, :]), axis=3)
        pool_class = tf.argmax(tf.cast(same, tf.int32), axis=2, output_type=tf.int32)  # [B, K]
        last = tf.gather(tokens, tf.maximum(hyp_lengths - 1, 0), axis=2, batch_dims=2)
        head = tf.where(tf.range(width)[None, None, :] < (hyp_lengths - 1)[:, :, None], labels,
                        NO_TOKEN)
        # extends[b, i, j]: hypothesis i's labels are hypothesis j's plus one label.
        extends = (tf.reduce_all(tf.equal(head[:, :, None, :], labels[:, None, :, :]), axis=3)
                   & (hyp_lengths > 0)[:, :, None])
        holder = (tf.gather(extends, source, axis=2, batch_dims=1)
                  & tf.equal(last[:, :, None], label[:, None, :]))  # [B, K, M]
        held = tf.reduce_any(holder, axis=1)
        holder_class = tf.gather(pool_class,
                                 tf.argmax(tf.cast(holder, tf.int32), axis=1,
                                           output_type=tf.int32), batch_dims=1)
        source_class = tf.gather(pool_class, source, batch_dims=1)
        label_class = tf.where(emit, tf.where(held, holder_class,
                                              beam + source_class * vocab + label), source_class)
        # The key is (labels, arrival frame): candidates arriving at one frame have emitted the
        # same number of labels there (those of duration 0 arrive at t together, the others at
        # later frames, and the frames before t are done), so the count needs no comparison.
        same_key = (tf.equal(label_class[:, :, None], label_class[:, None, :])
                    & tf.equal(new_arrival[:, :, None], new_arrival[:, None, :]))
        earlier = tf.range(shortlist)[:, None] < tf.range(shortlist)[None, :]
        duplicate = tf.reduce_any(same_key & earlier[None], axis=1)
        best, pick = tf.math.top_k(tf.where(duplicate, minus_inf, values), k=beam)

        def take(x):
            return tf.gather(x, pick, batch_dims=1)

        source, label, emit = take(source), take(label), take(emit) & (best > minus_inf)
        new_tokens, new_lengths, predictor = _extend_hypotheses(
            tokens, hyp_lengths, pool, source, label, emit, positions, blank_id, predictor_step,
            batch)
        new_pool = dict(predictor, scores=best, tokens=new_tokens, lengths=new_lengths)
        new = (take(new_arrival), take(new_count), new_pool)
        return _keep_shapes(_where(sample_active, new, (arrival, count, pool)),
                            (arrival, count, pool))

    def cond(arrival, count, pool):
        return tf.reduce_any((pool["scores"] > minus_inf) & (arrival < lengths[:, None]))

    pool = {key: state[key] for key in _BEAM_KEYS if key != "skip"}
    arrival = tf.maximum(tf.cast(state["skip"], tf.int32), 0)
    arrival, _, pool = tf.while_loop(cond, body, (arrival, tf.zeros_like(arrival), pool))
    width = tf.reduce_max(tf.concat([tf.reshape(pool["lengths"], [-1]), [0]], 0))
    return dict(pool, tokens=pool["tokens"][:, :, :width],
                skip=tf.maximum(arrival - lengths[:, None], 0))
