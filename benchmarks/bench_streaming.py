"""Real-time factor of the speech example's streaming step on one CPU core: SavedModel and TFLite.

    taskset -c 0 python benchmarks/bench_streaming.py --weights runs/speech/final.weights.h5

Builds the example's model (CPU default size, or `--large`), loads the weights (random weights
without `--weights`), exports the streaming SavedModel (`tf_rnnt.export`) and the TFLite
streaming step, and streams held-out audio through both in chunks of `--chunk` feature frames
(10 ms each), one thread each (`tf.config.threading`, `num_threads=1`). Real-time factor =
processing time / audio duration (below 1: faster than real time). The SavedModel time covers
features + encode_chunk + decode_chunk; the TFLite model takes features, so its row gives the
step alone and the step plus the SavedModel's features signature.
"""

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "examples", "speech"))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import export as speech_export  # noqa: E402
import pipeline  # noqa: E402
from model import LARGE, ModelConfig, build_model  # noqa: E402

from tf_rnnt import export  # noqa: E402


def held_out_audio(seconds):
    """Held-out synthesized utterances joined to at least `seconds` of 16 kHz audio."""
    paths, _ = pipeline.read_manifest(os.path.join(REPO, "examples", "speech", "data",
                                                   "test.tsv"))
    pieces, total = [], 0
    for path in paths:
        pieces.append(pipeline.load_audio(path).numpy())
        total += len(pieces[-1])
        if total >= seconds * pipeline.SAMPLE_RATE:
            break
    return np.concatenate(pieces)


def stream_saved_model(signatures, audio, chunk):
    """Audio in pieces of `chunk` feature frames through features, encode_chunk, decode_chunk."""
    step = 160 * chunk
    state = signatures["initial_state"](batch_size=tf.constant(1))
    enc_state, dec_state = state["encoder_state"], state["decoder_state"]
    tokens = []
    for start in range(0, len(audio) - (step + 240) + 1, step):
        piece = tf.constant(audio[None, start:start + step + 240])  # exactly `chunk` frames
        feats = signatures["features"](audio=piece)["features"]
        enc = signatures["encode_chunk"](features=feats, encoder_state=enc_state)
        dec = signatures["decode_chunk"](frames=enc["frames"], decoder_state=dec_state)
        enc_state, dec_state = enc["encoder_state"], dec["decoder_state"]
        tokens += [int(t) for t in dec["tokens"][0] if t >= 0]
    return tokens


def chunk_features(signatures, audio, chunk):
    step = 160 * chunk
    return [signatures["features"](audio=tf.constant(audio[None, s:s + step + 240]))
            ["features"].numpy() for s in range(0, len(audio) - (step + 240) + 1, step)]


def stream_tflite(runner, features, initial):
    enc_state, dec_state = initial
    tokens = []
    for feats in features:
        out = runner(features=feats, encoder_state=enc_state, decoder_state=dec_state)
        enc_state, dec_state = out["encoder_state"], out["decoder_state"]
        tokens += [int(t) for t in out["tokens"][0] if t >= 0]
    return tokens


def best_time(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", help="final.weights.h5 of a train.py run (default: random)")
    p.add_argument("--large", action="store_true")
    p.add_argument("--chunk", type=int, default=32, help="feature frames per step (10 ms each)")
    p.add_argument("--seconds", type=float, default=10.0, help="audio streamed per measurement")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    config = ModelConfig(vocab_size=pipeline.VOCAB_SIZE, **(LARGE if args.large else {}))
    model = build_model(config)
    if args.weights:
        model.load_weights(args.weights)
        model.get_layer("encoder").feature_norm.finalize_state()
    transcriber = speech_export.make_transcriber(model)
    audio = held_out_audio(args.seconds)
    duration = len(audio) / pipeline.SAMPLE_RATE
    with tempfile.TemporaryDirectory() as tmp:
        export.export_saved_model(transcriber, os.path.join(tmp, "saved_model"))
        signatures = tf.saved_model.load(os.path.join(tmp, "saved_model")).signatures
        flatbuffer = export.convert_streaming_step_to_tflite(transcriber, args.chunk)
        runner = export.tflite_interpreter(flatbuffer, num_threads=1).get_signature_runner()
        stream_saved_model(signatures, audio, args.chunk)  # warm-up (tracing, allocation)
        saved_seconds, saved_tokens = best_time(
            lambda: stream_saved_model(signatures, audio, args.chunk), args.repeats)
        features_seconds, features = best_time(
            lambda: chunk_features(signatures, audio, args.chunk), args.repeats)
        state = signatures["initial_state"](batch_size=tf.constant(1))
        initial = (state["encoder_state"].numpy(), state["decoder_state"].numpy())
        stream_tflite(runner, features, initial)
        lite_seconds, lite_tokens = best_time(lambda: stream_tflite(runner, features, initial),
                                              args.repeats)
    params = model.count_params()
    print(f"TensorFlow {tf.__version__}, 1 thread, {'large' if args.large else 'CPU default'} "
          f"model ({params / 1e6:.2f} M parameters, {'trained' if args.weights else 'random'} "
          f"weights), chunk {args.chunk} feature frames ({args.chunk * 10} ms), "
          f"{duration:.1f} s of audio, TFLite model {len(flatbuffer) / 1e6:.1f} MB")
    print(f"tokens equal: {saved_tokens == lite_tokens} ({len(saved_tokens)} tokens)")
    print("| path | seconds | real-time factor |")
    print("|---|---|---|")
    print(f"| SavedModel: features + encode_chunk + decode_chunk | {saved_seconds:.3f} | "
          f"{saved_seconds / duration:.4f} |")
    print(f"| TFLite streaming step (features excluded) | {lite_seconds:.3f} | "
          f"{lite_seconds / duration:.4f} |")
    print(f"| TFLite step + SavedModel features | {lite_seconds + features_seconds:.3f} | "
          f"{(lite_seconds + features_seconds) / duration:.4f} |")


if __name__ == "__main__":
    main()
