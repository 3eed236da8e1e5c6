"""Exports a trained streaming transducer as a SavedModel that needs neither tf_rnnt nor Keras.

Signatures (all plain TensorFlow ops; the joint is `RNNTJoint.logits`, no custom op):
  features(audio [B, N] float32 at 16 kHz) -> {"features": [B, T, F]}
      T = 1 + (N - 400) // 160; frame n reads samples [160 n, 160 n + 400). Streaming: buffer
      the audio, take n frames (a multiple of 4) from the first 160 (n - 1) + 400 samples, and
      keep the buffer from sample 160 n on.
  initial_state(batch_size int32) -> {"encoder_state": [B, S_enc], "decoder_state": [B, S_dec]}
  encode_chunk(features [B, C, F], encoder_state) -> {"frames": [B, C // 4, D], "encoder_state"}
      Causal: chunks whose sizes are multiples of 4 (the last one may be any size) give the
      frames of the whole utterance.
  decode_chunk(frames [B, T', D], decoder_state) -> {"tokens": [B, T' * S] int32 (-1 = none),
      "text": [B] string (this chunk's characters), "decoder_state"}
      Greedy RNN-T decoding, at most S labels per frame.
  transcribe(audio [B, N] float32 at 16 kHz, audio_lengths [B] int32) ->
      {"text": [B] string, "tokens": [B, K] int32 (-1 = none)}
"""

import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import decoding  # noqa: E402
import pipeline  # noqa: E402
from model import output_lengths, parts  # noqa: E402


class StreamingTranscriber(tf.Module):
    def __init__(self, model, feature_config=pipeline.FeatureConfig(), max_symbols=5):
        super().__init__(name="streaming_transducer")
        self.encoder, self.predictor, self.joint = parts(model)
        self.feature_config = feature_config
        self.max_symbols = max_symbols
        self.num_mel_bins = feature_config.num_mel_bins
        self.encoder_state_size = self.encoder.state_size()
        # Decoder state: the predictor output [B, P], then each predictor state tensor
        # (LSTM h and c; or the previous token, stored as a float).
        self._decoder_specs = [(self.predictor.predictor_dim, tf.float32)]
        self._decoder_specs += list(self.predictor.state_specs())
        self.decoder_state_size = sum(w or 1 for w, _ in self._decoder_specs)
        self.frame_dim = self.encoder.encoder_dim
        # Token id -> character, blank -> "".
        self._characters = tf.constant([""] + list(pipeline.VOCABULARY[1:]))
        f, d = self.num_mel_bins, self.frame_dim
        self.features = tf.function(
            self._features, input_signature=[tf.TensorSpec([None, None], tf.float32, "audio")])
        self.initial_state = tf.function(
            self._initial_state, input_signature=[tf.TensorSpec([], tf.int32, "batch_size")])
        self.encode_chunk = tf.function(self._encode_chunk, input_signature=[
            tf.TensorSpec([None, None, f], tf.float32, "features"),
            tf.TensorSpec([None, self.encoder_state_size], tf.float32, "encoder_state")])
        self.decode_chunk = tf.function(self._decode_chunk, input_signature=[
            tf.TensorSpec([None, None, d], tf.float32, "frames"),
            tf.TensorSpec([None, self.decoder_state_size], tf.float32, "decoder_state")])
        self.transcribe = tf.function(self._transcribe, input_signature=[
            tf.TensorSpec([None, None], tf.float32, "audio"),
            tf.TensorSpec([None], tf.int32, "audio_lengths")])

    def _features(self, audio):
        return {"features": pipeline.log_mel(audio, self.feature_config)}

    def _flatten_decoder_state(self, state):
        return tf.concat([tf.reshape(tf.cast(x, tf.float32), [tf.shape(x)[0], w or 1])
                          for x, (w, _) in zip(state, self._decoder_specs)], axis=1)

    def _unflatten_decoder_state(self, flat):
        state = []
        for part, (width, dtype) in zip(
                tf.split(flat, [w or 1 for w, _ in self._decoder_specs], axis=1),
                self._decoder_specs):
            if width is None:  # one value per sample
                part = part[:, 0]
                if dtype.is_integer:
                    part = tf.cast(tf.round(part), dtype)
            state.append(part)
        return state

    def _decoder_state(self, batch_size):
        return self._flatten_decoder_state(
            decoding.initial_decoder_state(self.predictor, batch_size))

    def _initial_state(self, batch_size):
        encoder_state = self.encoder.flatten_state(self.encoder.initial_state(batch_size))
        return {"encoder_state": encoder_state, "decoder_state": self._decoder_state(batch_size)}

    def _encode_chunk(self, features, encoder_state):
        frames, state = self.encoder.stream(features, self.encoder.unflatten_state(encoder_state))
        return {"frames": frames, "encoder_state": self.encoder.flatten_state(state)}

    def _text(self, tokens):
        chars = tf.gather(self._characters, tf.maximum(tokens, 0))
        return tf.strings.reduce_join(chars, axis=-1)

    def _decode(self, frames, frame_lengths, decoder_state):
        state = self._unflatten_decoder_state(decoder_state)
        tokens, state = decoding.greedy_decode(self.joint, self.predictor, frames, frame_lengths,
                                               state, self.max_symbols)
        return tokens, self._flatten_decoder_state(state)

    def _decode_chunk(self, frames, decoder_state):
        lengths = tf.fill([tf.shape(frames)[0]], tf.shape(frames)[1])
        tokens, state = self._decode(frames, lengths, decoder_state)
        return {"tokens": tokens, "text": self._text(tokens), "decoder_state": state}

    def _transcribe(self, audio, audio_lengths):
        features = pipeline.log_mel(audio, self.feature_config)
        feature_lengths = pipeline.num_frames(audio_lengths, self.feature_config)
        batch = tf.shape(audio)[0]
        frames, _ = self.encoder.stream(features, self.encoder.initial_state(batch))
        tokens, _ = self._decode(frames, output_lengths(feature_lengths),
                                 self._decoder_state(batch))
        # Squeeze out the empty slots: a [B, K] matrix, K = the most tokens of any sample.
        keep = tokens >= 0
        ragged = tf.RaggedTensor.from_row_lengths(
            tf.boolean_mask(tokens, keep), tf.reduce_sum(tf.cast(keep, tf.int32), axis=1))
        dense = ragged.to_tensor(default_value=decoding.NO_TOKEN)
        return {"text": self._text(tokens), "tokens": dense}


def export_saved_model(model, path, feature_config=pipeline.FeatureConfig(), max_symbols=5):
    """Writes the streaming SavedModel of a `build_model` model to `path`."""
    module = StreamingTranscriber(model, feature_config, max_symbols)
    signatures = {name: getattr(module, name) for name in
                  ("features", "initial_state", "encode_chunk", "decode_chunk", "transcribe")}
    tf.saved_model.save(module, path, signatures=signatures)
    return module
