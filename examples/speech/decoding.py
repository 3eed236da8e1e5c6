"""Greedy RNN-T decoding (batched, plain TensorFlow ops) and word error rate.

Greedy search: at each encoder frame, take the joint's argmax; a label is emitted and fed to the
predictor, and the same frame is scored again (at most `max_symbols` labels per frame); blank
moves on to the next frame. Samples of a batch advance together: a sample whose frames ran out
or that chose blank this frame just stops changing. The decoder state is the predictor's output
for the last emitted label (blank at the start) and the predictor's own state (LSTM: h and c;
stateless: the previous token), so decoding a stream chunk by chunk and decoding it whole give
the same tokens.
"""

import numpy as np
import tensorflow as tf

NO_TOKEN = -1


def initial_decoder_state(predictor, batch_size, blank=0):
    """Predictor output and state after the start symbol (blank): `[out, *state]`."""
    out, state = predictor.step(tf.fill([batch_size], blank), predictor.initial_state(batch_size))
    return [out] + list(state)


def greedy_decode(joint, predictor, frames, frame_lengths, decoder_state, max_symbols=5,
                  blank=0):
    """Greedy decoding of `[B, T, D]` encoder frames.

    Args:
      joint: the `RNNTJoint` (its `logits`: plain TensorFlow).
      predictor: the `Predictor`.
      frames: `[B, T, D]` encoder output.
      frame_lengths: `[B]` int, valid frames per sample.
      decoder_state: `[out, *predictor_state]` from `initial_decoder_state` or a previous call.
      max_symbols: labels emitted per frame at most.

    Returns:
      `(tokens [B, T * max_symbols] int32, new decoder_state)`; token slot
      `t * max_symbols + s` holds the s-th label emitted at frame t or `NO_TOKEN` (-1).
    """
    frames = tf.convert_to_tensor(frames, tf.float32)
    frame_lengths = tf.cast(frame_lengths, tf.int32)
    batch = tf.shape(frames)[0]
    num_frames = tf.shape(frames)[1]
    decoder_state = list(decoder_state)

    def keep_where(emit, new, old):
        emit = tf.reshape(emit, tf.concat([[batch], tf.ones([tf.rank(old) - 1], tf.int32)], 0))
        return tf.where(emit, new, old)

    def frame_body(t, state, tokens):
        frame = frames[:, t]
        columns = tf.range(max_symbols)

        def symbol_cond(s, active, state, frame_tokens):
            return (s < max_symbols) & tf.reduce_any(active)

        def symbol_body(s, active, state, frame_tokens):
            out = state[0]
            logits = joint.logits(frame[:, None], out[:, None])[:, 0, 0]
            token = tf.argmax(logits, axis=-1, output_type=tf.int32)
            emit = active & tf.not_equal(token, blank)
            frame_tokens = tf.where(emit[:, None] & tf.equal(columns, s)[None, :],
                                    token[:, None], frame_tokens)
            new_out, new_state = predictor.step(tf.where(emit, token, blank), state[1:])
            state = [keep_where(emit, new, old)
                     for new, old in zip([new_out] + list(new_state), state)]
            return s + 1, emit, state, frame_tokens

        active = t < frame_lengths
        frame_tokens = tf.fill([batch, max_symbols], NO_TOKEN)
        _, _, state, frame_tokens = tf.while_loop(
            symbol_cond, symbol_body, (tf.constant(0), active, state, frame_tokens))
        return t + 1, state, tokens.write(t, frame_tokens)

    tokens = tf.TensorArray(tf.int32, size=num_frames, element_shape=[None, max_symbols])
    _, decoder_state, tokens = tf.while_loop(
        lambda t, *_: t < num_frames, frame_body, (tf.constant(0), decoder_state, tokens))
    # (An empty TensorArray cannot be stacked with an unknown batch size: a chunk may be empty.)
    tokens = tf.cond(num_frames > 0, tokens.stack,
                     lambda: tf.zeros([0, batch, max_symbols], tf.int32))
    tokens = tf.transpose(tokens, [1, 0, 2])  # [B, T, S]
    return tf.reshape(tokens, [batch, num_frames * max_symbols]), decoder_state


def tokens_to_lists(tokens):
    """`[B, N]` tokens with `NO_TOKEN` slots -> list of lists of label ids."""
    return [[int(t) for t in row if t > 0] for row in np.asarray(tokens)]


def edit_distance(reference, hypothesis):
    """Levenshtein distance between two sequences (substitutions, insertions, deletions)."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, 1):
        current = [i]
        for j, hyp in enumerate(hypothesis, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1,
                               previous[j - 1] + (ref != hyp)))
        previous = current
    return previous[-1]


def word_error_rate(references, hypotheses):
    """Corpus WER: total word edits / total reference words."""
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    edits = sum(edit_distance(r.split(), h.split()) for r, h in zip(references, hypotheses))
    words = sum(len(r.split()) for r in references)
    return edits / max(words, 1)
