"""Keras training benchmark: RNNTJoint + FlashRNNTLoss against full logits.

The same transducer (Masking + Dense encoder, Embedding + LSTM predictor, joint of `--units`
over `--vocab` outputs) is trained with `model.fit` in each variant:

  flash           RNNTJoint(mode="tiled") + FlashRNNTLoss   (no [B, T, U+1, V] tensor)
  flash_untiled   RNNTJoint(mode="untiled") + FlashRNNTLoss
  logits_rnnt     full logits (RNNTJoint.logits) + tf_rnnt.keras.RNNTLoss (compiled loss op)
  reference       full logits + tf_rnnt.reference.rnnt_loss (pure TF, autodiff): what a
                  TensorFlow user writes today

Each variant runs in its own process (clean peak-memory statistics, an OOM stays contained).
After a warm-up epoch (tracing), `--steps` steps are timed as one epoch; the step time is that
epoch's wall time / steps and the peak memory is TensorFlow's allocator peak on each GPU during
it (`tf.config.experimental.get_memory_info`), reported as the maximum over GPUs. Without a GPU
the peak resident set size of the process is reported instead.

`--strategy mirrored` trains under tf.distribute.MirroredStrategy over all visible GPUs with the
same global batch (`--batch`); `--strategy both` runs each variant on one device and mirrored
and reports the scaling (mirrored throughput / single-device throughput).

Usage:
  python benchmarks/bench_keras.py --out benchmarks/results/keras_h200.md
  python benchmarks/bench_keras.py --strategy both --batch 32 \
      --out benchmarks/results/keras_2xh200.md
"""

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

VARIANTS = ("flash", "flash_untiled", "logits_rnnt", "reference")
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16, help="global batch size")
    parser.add_argument("--frames", type=int, default=200, help="padded frames T")
    parser.add_argument("--labels", type=int, default=40, help="padded labels U")
    parser.add_argument("--vocab", type=int, default=1024, help="vocabulary V (with blank)")
    parser.add_argument("--features", type=int, default=80)
    parser.add_argument("--encoder-dim", type=int, default=256)
    parser.add_argument("--predictor-dim", type=int, default=256)
    parser.add_argument("--units", type=int, default=320, help="joint hidden size H")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--min-length", type=float, default=0.6,
                        help="shortest sample as a fraction of T and U (lengths are uniform)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--strategy", choices=("none", "mirrored", "both"), default="none")
    parser.add_argument("--mixed-precision", choices=("none", "mixed_bfloat16", "mixed_float16"),
                        default="none")
    parser.add_argument("--tile-size", type=int, default=None)
    parser.add_argument("--memory-budget", type=int, default=None)
    parser.add_argument("--out", default=None, help="markdown table to write")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per variant run")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-strategy", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------------------------
# Worker: one variant, one strategy, in this process.
# ----------------------------------------------------------------------------------------------
def _build_model(args, variant, keras, tf, tf_rnnt_keras):
    blank = 0
    features = keras.Input((None, args.features), name="features")
    labels = keras.Input((None,), dtype="int32", name="labels")
    encoder = keras.layers.Masking(mask_value=0.0)(features)
    encoder = keras.layers.Dense(args.encoder_dim, activation="relu")(encoder)
    encoder = keras.layers.Dense(args.encoder_dim, activation="tanh")(encoder)

    class PredictorInput(keras.layers.Layer):
        def call(self, labels):
            labels = tf.where(labels < 0, blank, labels)
            return tf.pad(labels, [[0, 0], [1, 0]], constant_values=blank)

        def compute_output_shape(self, shape):
            return (shape[0], None if shape[1] is None else shape[1] + 1)

    predictor = PredictorInput()(labels)
    predictor = keras.layers.Embedding(args.vocab, args.predictor_dim)(predictor)
    predictor = keras.layers.LSTM(args.predictor_dim, return_sequences=True)(predictor)

    mode = "untiled" if variant == "flash_untiled" else "tiled"
    joint = tf_rnnt_keras.RNNTJoint(args.vocab, args.units, blank=blank, mode=mode,
                                    tile_size=args.tile_size, memory_budget=args.memory_budget,
                                    name="joint")
    if variant in ("flash", "flash_untiled"):
        output = joint([encoder, predictor, labels])
        loss = tf_rnnt_keras.FlashRNNTLoss(blank=blank)
    else:
        from keras_baselines import LogitsHead, ReferenceRNNTLoss

        output = LogitsHead(joint)([encoder, predictor])
        if variant == "logits_rnnt":
            loss = tf_rnnt_keras.RNNTLoss(blank=blank)
        else:
            loss = ReferenceRNNTLoss(blank=blank)
    model = keras.Model([features, labels], output)
    return model, loss


def _dataset(args, tf, np):
    rng = np.random.default_rng(0)
    num = args.batch * 4
    frames = rng.integers(max(1, int(args.min_length * args.frames)), args.frames + 1, size=num)
    frames[0] = args.frames
    num_labels = rng.integers(max(1, int(args.min_length * args.labels)), args.labels + 1,
                              size=num)
    num_labels[0] = args.labels
    features = rng.normal(size=(num, args.frames, args.features)).astype(np.float32)
    features[np.arange(args.frames)[None, :] >= frames[:, None]] = 0.0
    labels = rng.integers(1, args.vocab, size=(num, args.labels)).astype(np.int32)
    labels[np.arange(args.labels)[None, :] >= num_labels[:, None]] = -1
    dataset = tf.data.Dataset.from_tensor_slices(((features, labels), labels))
    return dataset.batch(args.batch, drop_remainder=True).repeat().prefetch(2)


def run_worker(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    import keras

    from tf_rnnt import keras as tf_rnnt_keras

    if args.mixed_precision != "none":
        keras.mixed_precision.set_global_policy(args.mixed_precision)
    keras.utils.set_random_seed(0)  # every variant starts from the same weights
    mirrored = args.worker_strategy == "mirrored"
    strategy = tf.distribute.MirroredStrategy() if mirrored else tf.distribute.get_strategy()
    with strategy.scope():
        model, loss = _build_model(args, args.worker, keras, tf, tf_rnnt_keras)
        optimizer = keras.optimizers.Adam(1e-4)
        if args.mixed_precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(optimizer=optimizer, loss=loss, jit_compile=False)
    dataset = _dataset(args, tf, np)

    gpu_names = [f"GPU:{i}" for i in range(len(gpus))]
    epoch_times, peaks, losses = [], [], []

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            for name in gpu_names:
                tf.config.experimental.reset_memory_stats(name)
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            epoch_times.append(time.perf_counter() - self.start)  # logs are synced values
            peaks.append(max((tf.config.experimental.get_memory_info(n)["peak"]
                              for n in gpu_names), default=0))
            losses.append(float(logs["loss"]))

    status = "ok"
    try:
        model.fit(dataset, epochs=2, steps_per_epoch=args.steps, verbose=0, callbacks=[Timer()])
    except tf.errors.ResourceExhaustedError:
        status = "OOM"
    result = {
        "variant": args.worker, "strategy": args.worker_strategy, "status": status,
        "replicas": strategy.num_replicas_in_sync, "gpus": len(gpus),
        "step_ms": 1e3 * epoch_times[1] / args.steps if len(epoch_times) == 2 else None,
        "peak_gpu_bytes": peaks[1] if len(peaks) == 2 and gpus else None,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "loss": losses[-1] if losses else None,
        "finite": bool(losses) and all(np.isfinite(losses)),
    }
    print("RESULT " + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------------------------
# Driver: one subprocess per (variant, strategy), then the table.
# ----------------------------------------------------------------------------------------------
def _run_variant(argv, variant, strategy, timeout):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([_REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, os.path.abspath(__file__)] + argv + [
        "--worker", variant, "--worker-strategy", strategy]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"variant": variant, "strategy": strategy, "status": f"timeout {timeout}s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    status = "OOM" if "ResourceExhausted" in proc.stderr or "OOM" in proc.stderr else "error"
    return {"variant": variant, "strategy": strategy, "status": status, "detail": " | ".join(tail)}


def _mib(value):
    return "-" if value is None else f"{value / 2**20:,.0f}"


def _ms(value):
    return "-" if value is None else f"{value:.1f}"


def render(args, results):
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    names = []
    for gpu in gpus:
        try:
            names.append(tf.config.experimental.get_device_details(gpu).get("device_name", "GPU"))
        except Exception:  # details are informative only
            names.append("GPU")
    device = f"{len(gpus)} x {names[0]}" if gpus else f"CPU only ({platform.processor() or 'cpu'})"
    lines = [
        "# Keras training: RNNTJoint + FlashRNNTLoss vs full logits",
        "",
        f"- Device: {device}; TensorFlow {tf.__version__}; precision policy: "
        f"{args.mixed_precision if args.mixed_precision != 'none' else 'float32'}",
        f"- Global batch B={args.batch}, T={args.frames}, U={args.labels}, V={args.vocab}, "
        f"joint H={args.units}, encoder {args.encoder_dim}, predictor {args.predictor_dim}; "
        f"lengths uniform in [{args.min_length:g}, 1] x max",
        f"- Step time: wall time of {args.steps} `model.fit` steps after a warm-up epoch, / steps. "
        f"Peak memory: TensorFlow allocator peak during those steps, max over GPUs "
        f"({'GPU' if gpus else 'no GPU: peak process RSS instead'}).",
        f"- Command: `python benchmarks/bench_keras.py {' '.join(sys.argv[1:])}`",
        "",
        "| variant | strategy | replicas | step (ms) | peak memory (MiB) | vs reference: speed | "
        "vs reference: memory | final loss | status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    baseline = {r["strategy"]: r for r in results
                if r["variant"] == "reference" and r.get("status") == "ok"}
    for r in results:
        memory = r.get("peak_gpu_bytes") if gpus else r.get("peak_rss_bytes")
        base = baseline.get(r["strategy"])
        speed = mem_ratio = "-"
        if base and r.get("status") == "ok" and r["variant"] != "reference":
            speed = f"{base['step_ms'] / r['step_ms']:.2f}x"
            base_memory = base.get("peak_gpu_bytes") if gpus else base.get("peak_rss_bytes")
            if memory and base_memory:
                mem_ratio = f"{memory / base_memory:.1%}"
        status = r.get("status", "?")
        if r.get("status") == "ok" and not r.get("finite", True):
            status = "non-finite loss"
        if r.get("detail"):
            status += f" ({r['detail'][:120]})"
        loss = "-" if r.get("loss") is None else f"{r['loss']:.3f}"
        lines.append(f"| {r['variant']} | {r['strategy']} | {r.get('replicas', '-')} | "
                     f"{_ms(r.get('step_ms'))} | {_mib(memory)} | {speed} | {mem_ratio} | {loss} | "
                     f"{status} |")
    single = {r["variant"]: r for r in results if r["strategy"] == "none" and r.get("step_ms")}
    multi = [r for r in results if r["strategy"] == "mirrored" and r.get("step_ms")]
    if single and multi:
        lines += ["", "Scaling (same global batch; mirrored throughput / single-device "
                      "throughput):", ""]
        for r in multi:
            if r["variant"] in single:
                lines.append(f"- {r['variant']}: {r['replicas']} replicas, "
                             f"{single[r['variant']]['step_ms'] / r['step_ms']:.2f}x")
    return "\n".join(lines) + "\n"


def main(argv=None):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        run_worker(args)
        return
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    strategies = ["none", "mirrored"] if args.strategy == "both" else [args.strategy]
    results = []
    for strategy in strategies:
        for variant in variants:
            result = _run_variant(argv, variant, strategy, args.timeout)
            print(json.dumps(result), flush=True)
            results.append(result)
    table = render(args, results)
    print(table)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
