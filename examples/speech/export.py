"""The speech model's export: its pieces wired into `tf_rnnt.export`.

Streaming encoder (the default `model.StreamingEncoder`), signatures (see `tf_rnnt.export`):
features (16 kHz audio -> log-mel; frame n reads samples [160 n, 160 n + 400)), initial_state,
encode_chunk (a multiple of 4 feature frames; the last chunk may be any size), decode_chunk
(greedy, at most 5 labels per frame) and transcribe. With word tokens each word's text ends with
a space.

Full-context encoder (`conformer.SpeechConformerEncoder`, train.py --conformer): its frames
depend on the whole utterance, so there is no chunk-wise step; the SavedModel has features and
transcribe only (`UtteranceTranscriber`), and `export_tflite` refuses it.
"""

import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pipeline  # noqa: E402
from model import SUBSAMPLING, output_lengths, parts  # noqa: E402

from tf_rnnt import decoding  # noqa: E402
from tf_rnnt import export as streaming_export  # noqa: E402

UTTERANCE_SIGNATURES = ("features", "transcribe")


def is_streaming(model):
    """Whether the encoder of a `build_model` model runs chunk by chunk (has `stream`)."""
    return hasattr(parts(model)[0], "stream")


def make_transcriber(model, feature_config=pipeline.FeatureConfig(), max_symbols=5,
                     tokenizer=pipeline.CHARACTERS):
    """The `tf_rnnt.export.StreamingTranscriber` of a `build_model` model with a streaming
    encoder, trained with `tokenizer`'s ids."""
    encoder, predictor, joint = parts(model)
    return streaming_export.StreamingTranscriber(
        encoder, predictor, joint,
        feature_fn=lambda audio: pipeline.log_mel(audio, feature_config),
        num_features=feature_config.num_mel_bins, vocabulary=tokenizer.token_texts(),
        feature_lengths_fn=lambda samples: pipeline.num_frames(samples, feature_config),
        frame_lengths_fn=output_lengths, blank=pipeline.BLANK, max_symbols_per_frame=max_symbols)


def greedy_tokens(frames, frame_lengths, predictor, joint_fn, durations, max_symbols):
    """Greedy search over whole utterances: `tf_rnnt.decoding.greedy_search`, or with
    `durations` (a TDT joint) `tdt_greedy_search`; tokens `[B, T * max_symbols]`."""
    start = predictor.initial_state(tf.shape(frames)[0])
    if durations:
        state = decoding.tdt_greedy_initial_state(predictor.step, start, pipeline.BLANK)
        tokens, _ = decoding.tdt_greedy_search(frames, frame_lengths, state, joint_fn,
                                               predictor.step, durations, max_symbols,
                                               pipeline.BLANK)
        return tokens
    state = decoding.greedy_initial_state(predictor.step, start, pipeline.BLANK)
    tokens, _ = decoding.greedy_search(frames, frame_lengths, state, joint_fn, predictor.step,
                                       max_symbols, pipeline.BLANK)
    return tokens


class UtteranceTranscriber(tf.Module):
    """Whole-utterance signatures of a `build_model` model with a full-context encoder:

      features(audio [B, N]) -> {"features": [B, T, F]}
      transcribe(audio [B, N], audio_lengths [B] int32) -> {"text": [B] string,
          "tokens": [B, K] int32 (-1: none)}

    as the signatures of the same names of `tf_rnnt.export.StreamingTranscriber`. The encoder
    reads the feature lengths (`encoder([features, feature_lengths])`): the padding of a batch
    does not change a sample's result. Greedy search (`greedy_tokens`).
    """

    def __init__(self, model, feature_config=pipeline.FeatureConfig(), max_symbols=5,
                 tokenizer=pipeline.CHARACTERS, name="utterance_transducer"):
        super().__init__(name=name)
        self.encoder, self.predictor, self.joint = parts(model)
        self.feature_config = feature_config
        self.max_symbols = max_symbols
        self._joint_fn = decoding.joint_fn_from_layer(self.joint)
        self._texts = tf.constant(["" if i == pipeline.BLANK else text
                                   for i, text in enumerate(tokenizer.token_texts())])
        self.features = tf.function(
            self._features, input_signature=[tf.TensorSpec([None, None], tf.float32, "audio")])
        self.transcribe = tf.function(self._transcribe, input_signature=[
            tf.TensorSpec([None, None], tf.float32, "audio"),
            tf.TensorSpec([None], tf.int32, "audio_lengths")])

    def _features(self, audio):
        return {"features": pipeline.log_mel(audio, self.feature_config)}

    def _transcribe(self, audio, audio_lengths):
        features = pipeline.log_mel(audio, self.feature_config)
        feature_lengths = pipeline.num_frames(audio_lengths, self.feature_config)
        frames = self.encoder([features, feature_lengths], training=False)
        tokens = greedy_tokens(frames, self.encoder.frame_lengths(feature_lengths),
                               self.predictor, self._joint_fn, self.joint.durations,
                               self.max_symbols)
        text = tf.strings.reduce_join(tf.gather(self._texts, tf.maximum(tokens, 0)), axis=-1)
        return {"text": text, "tokens": decoding.compact_tokens(tokens)}


def export_saved_model(model, path, feature_config=pipeline.FeatureConfig(), max_symbols=5,
                       tokenizer=pipeline.CHARACTERS):
    """Writes the SavedModel of a `build_model` model to `path`: the streaming signatures, or
    with a full-context encoder the whole-utterance ones (`UtteranceTranscriber`). Core
    TensorFlow ops only: it loads without tf_rnnt."""
    if not is_streaming(model):
        transcriber = UtteranceTranscriber(model, feature_config, max_symbols, tokenizer)
        tf.saved_model.save(transcriber, path, signatures={
            name: getattr(transcriber, name) for name in UTTERANCE_SIGNATURES})
        return transcriber
    transcriber = make_transcriber(model, feature_config, max_symbols, tokenizer)
    streaming_export.export_saved_model(transcriber, path)
    return transcriber


def export_tflite(model, path, chunk_features=8 * SUBSAMPLING,
                  feature_config=pipeline.FeatureConfig(), max_symbols=5,
                  tokenizer=pipeline.CHARACTERS):
    """Writes the TFLite streaming step (features chunk -> tokens) of a `build_model` model with
    a streaming encoder."""
    if not is_streaming(model):
        raise ValueError(
            "export_tflite needs a streaming encoder (with `stream`): the Conformer encoder "
            "attends to the whole utterance, so it has no chunk-wise step. Export its "
            "whole-utterance SavedModel with export_saved_model instead.")
    transcriber = make_transcriber(model, feature_config, max_symbols, tokenizer)
    flatbuffer = streaming_export.convert_streaming_step_to_tflite(transcriber, chunk_features)
    with open(path, "wb") as f:
        f.write(flatbuffer)
    return transcriber
