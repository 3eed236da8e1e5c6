"""The speech model's streaming export: its pieces wired into `tf_rnnt.export`.

Signatures (see `tf_rnnt.export`): features (16 kHz audio -> log-mel; frame n reads samples
[160 n, 160 n + 400)), initial_state, encode_chunk (a multiple of 4 feature frames; the last
chunk may be any size), decode_chunk (greedy, at most 5 labels per frame) and transcribe. With
word tokens each word's text ends with a space.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pipeline  # noqa: E402
from model import SUBSAMPLING, output_lengths, parts  # noqa: E402

from tf_rnnt import export as streaming_export  # noqa: E402


def make_transcriber(model, feature_config=pipeline.FeatureConfig(), max_symbols=5,
                     tokenizer=pipeline.CHARACTERS):
    """The `tf_rnnt.export.StreamingTranscriber` of a `build_model` model trained with
    `tokenizer`'s ids."""
    encoder, predictor, joint = parts(model)
    return streaming_export.StreamingTranscriber(
        encoder, predictor, joint,
        feature_fn=lambda audio: pipeline.log_mel(audio, feature_config),
        num_features=feature_config.num_mel_bins, vocabulary=tokenizer.token_texts(),
        feature_lengths_fn=lambda samples: pipeline.num_frames(samples, feature_config),
        frame_lengths_fn=output_lengths, blank=pipeline.BLANK, max_symbols_per_frame=max_symbols)


def export_saved_model(model, path, feature_config=pipeline.FeatureConfig(), max_symbols=5,
                       tokenizer=pipeline.CHARACTERS):
    """Writes the streaming SavedModel of a `build_model` model to `path`."""
    transcriber = make_transcriber(model, feature_config, max_symbols, tokenizer)
    streaming_export.export_saved_model(transcriber, path)
    return transcriber


def export_tflite(model, path, chunk_features=8 * SUBSAMPLING,
                  feature_config=pipeline.FeatureConfig(), max_symbols=5,
                  tokenizer=pipeline.CHARACTERS):
    """Writes the TFLite streaming step (features chunk -> tokens) of a `build_model` model."""
    transcriber = make_transcriber(model, feature_config, max_symbols, tokenizer)
    flatbuffer = streaming_export.convert_streaming_step_to_tflite(transcriber, chunk_features)
    with open(path, "wb") as f:
        f.write(flatbuffer)
    return transcriber
