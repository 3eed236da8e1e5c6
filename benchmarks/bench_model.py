"""Real-scale training benchmark: a ~110M-parameter Conformer transducer, RNNTJoint against
full logits, on one GPU, N GPUs (MirroredStrategy) and N worker processes
(MultiWorkerMirroredStrategy).

The model is `examples/speech/conformer.py` (16 Conformer blocks, d=512, LSTM predictor 640,
joint H=640, V=1025) trained on synthetic 16 s utterances: 1600 frames of 80 log-mels (T=400
after the 4x subsampling), U=128 labels, lengths uniform in [--min-length, 1] x max (the first
sample of each batch at the maximum). Variants (same model, data and batch):

  flash          RNNTJoint(mode="tiled") + FlashRNNTLoss   (no [B, T, U+1, V] tensor)
  flash-untiled  RNNTJoint(mode="untiled") + FlashRNNTLoss ("untiled" is an alias)
  logits         full logits (RNNTJoint.logits, compute dtype) + tf_rnnt.keras.RNNTLoss
  tfasr          full float32 logits of the same joint + TensorFlowASR's pure-TF RNN-T loss
                 (log-softmax and hand-written gradient inside it; benchmarks/tfasr_baseline.py).
                 Without TensorFlowASR installed the row runs tf_rnnt.reference.rnnt_loss on the
                 float32 logits instead, and the table says so.
  reference      full logits + tf_rnnt.reference.rnnt_loss (pure TensorFlow, autodiff)

`--vocab 1025,4097` and `--jit-compile false,true` repeat every run per vocabulary and XLA
setting (`true`: `model.compile(jit_compile=True)`, the whole training step one XLA cluster).

Every run is its own subprocess (clean peak-memory statistics; an OOM stays contained):

  * step time: median over `--steps` steps after `--warmup` steps, each timed by a Keras
    callback from batch begin to batch end with the devices synced
    (`tf.test.experimental.sync_devices`); throughput = GPUs x per-GPU batch / step time.
  * compile time: the first step's wall time (tracing, graph optimization and, with XLA, the
    compilation) minus the median step.
  * peak memory: TensorFlow's allocator peak per GPU over the timed steps
    (`tf.config.experimental.get_memory_info`, reset after the warm-up), max over GPUs. Without
    a GPU the process' peak RSS is reported instead (marked "RSS").
  * largest batch: per-GPU batch doubled from `--batch` until a run fails with out-of-memory,
    then bisected (to `--search-resolution`); each probe is a subprocess running
    `--search-steps` steps with the row's settings (XLA too). Only for `--search-variants` x
    `--search-dtypes`, on the smallest GPU count, after the timed runs; `--search-gpus 0,1` runs
    the searches side by side, one GPU each; `--skip-batch-search` turns it off.
  * encoder: with `--profile DIR`, a TensorFlow profiler trace of `--profile-steps` steps after
    the timed ones; the GPU time of the ops under the model's "encoder" layer (forward and
    backward, `trace_summary.layer_seconds`) per step is the encoder's time, its share of the
    step is that over the median step, and its rate is `encoder_flops` (analytic) over that
    time, also as a share of a bfloat16 `tf.matmul` of `--matmul-size`^3 timed in the same
    process after the steps.

`--gpus 1,2` runs `model.fit` on one GPU and under MirroredStrategy over 2 GPUs with the same
per-GPU batch; `--workers 2` runs the custom loop of `examples/multiworker/train.py` under
MultiWorkerMirroredStrategy in 2 local worker processes (one GPU each, TF_CONFIG on free
localhost ports, NCCL collectives); scaling is the throughput relative to the 1-GPU (1-worker)
run of the same kind in this invocation (for workers without a 1-worker run: the 1-GPU fit).
Without a GPU every run falls back to the CPU (said in the table).

Results: `--json FILE` merges this invocation's runs into FILE (a run replaces an earlier one
with the same variant, V, dtype, XLA setting, mode, GPU count and batch, keeping its batch
search if the new run has none), so that several commands build one table; the markdown
(`--out`) is rendered from the merged runs. `--save` is `--json
benchmarks/results/model_<gpu>.json --out benchmarks/results/model_<gpu>.md` (`<gpu>` from
nvidia-smi: h100, h200, ...; cpu without a GPU). `--merge A.json B.json --json C.json --out
C.md` merges results files written elsewhere (e.g. one per machine session).

Usage (one H100/H200; TensorFlowASR from `pip install --no-deps --target DIR
TensorFlowASR==2.1.0` with TFASR_PATH=DIR, or in <venv>/tfasr):
  python benchmarks/bench_model.py --variants flash,flash-untiled --vocab 1025 \
      --dtypes mixed_bfloat16 --skip-batch-search --profile /tmp/prof --save
  python benchmarks/bench_model.py --variants flash --jit-compile true --encoder-alone \
      --dtypes mixed_bfloat16 --skip-batch-search --profile /tmp/prof --save
  python benchmarks/bench_model.py --gpus 1,2 --variants flash,logits --dtypes mixed_bfloat16 \
      --skip-batch-search --out benchmarks/results/model_2xh200.md
  python benchmarks/bench_model.py --tiny     # CPU smoke run: tiny model, 2 steps
"""

import argparse
import concurrent.futures
import importlib.util
import json
import os
import platform
import queue
import resource
import statistics
import subprocess
import sys
import time

VARIANTS = ("flash", "flash-untiled", "logits", "tfasr", "reference")
DEFAULT_VARIANTS = ("flash", "flash-untiled", "logits", "tfasr")
VARIANT_ALIASES = {"untiled": "flash-untiled"}
DTYPES = ("float32", "mixed_bfloat16")
JIT_SETTINGS = ("false", "true", "auto")
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONFORMER = os.path.join(_REPO_ROOT, "examples", "speech", "conformer.py")
_MULTIWORKER = os.path.join(_REPO_ROOT, "examples", "multiworker", "train.py")
COLUMNS = ("GPU", "variant", "V", "dtype", "XLA", "GPUs", "per-GPU batch", "step ms",
           "compile s", "throughput (utt/s)", "scaling vs 1 GPU", "peak memory per GPU (MiB)",
           "largest batch", "encoder share", "encoder TFLOP/s")


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _int_list(text):
    return [int(x) for x in str(text).split(",") if x.strip()]


def _str_list(text):
    return [x.strip() for x in str(text).split(",") if x.strip()]


def _variant_list(text):
    return [VARIANT_ALIASES.get(v, v) for v in _str_list(text)]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help=f"comma list of {', '.join(VARIANTS)}")
    parser.add_argument("--dtypes", default=",".join(DTYPES),
                        help="comma list of float32, mixed_bfloat16")
    parser.add_argument("--batch", type=int, default=32, help="per-GPU batch")
    parser.add_argument("--gpus", default="1", help="comma list of GPU counts (MirroredStrategy)")
    parser.add_argument("--workers", default="",
                        help="comma list of worker counts (MultiWorkerMirroredStrategy, one GPU "
                             "per worker, custom loop)")
    parser.add_argument("--workers-only", action="store_true",
                        help="skip the model.fit runs (--gpus) and run only --workers")
    parser.add_argument("--frames", type=int, default=400, help="T after the 4x subsampling")
    parser.add_argument("--labels", type=int, default=128, help="U")
    parser.add_argument("--vocab", default="1025", help="comma list of vocabulary sizes V")
    parser.add_argument("--mel-bins", type=int, default=80)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--ff-dim", type=int, default=2048)
    parser.add_argument("--kernel-size", type=int, default=31)
    parser.add_argument("--subsampling-channels", type=int, default=512)
    parser.add_argument("--predictor-dim", type=int, default=640)
    parser.add_argument("--joint-dim", type=int, default=640)
    parser.add_argument("--min-length", type=float, default=0.6,
                        help="shortest sample as a fraction of T and U")
    parser.add_argument("--jit-compile", default="false",
                        help="comma list of false, true, auto: model.compile(jit_compile=...) "
                             "for the model.fit runs (true: the whole step under XLA)")
    parser.add_argument("--attention", default="keras", choices=("keras", "dot_product"),
                        help="the Conformer's attention (examples/speech/conformer.py)")
    parser.add_argument("--lstm", default="auto", choices=("auto", "loop", "unrolled"),
                        help="the predictor LSTM: auto (cuDNN unless mixed_bfloat16), loop "
                             "(use_cudnn=False: a while loop XLA compiles), unrolled")
    parser.add_argument("--encoder-alone", action="store_true",
                        help="also time the encoder's forward + backward alone after the steps "
                             "(compiled as the step; under XLA a second compile): the encoder "
                             "columns' source where the trace has no per-layer GPU time")
    parser.add_argument("--matmul-size", type=int, default=8192,
                        help="N of the N^3 bfloat16 tf.matmul timed after the steps (0: none)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--skip-batch-search", action="store_true")
    parser.add_argument("--search-variants", default="flash,logits")
    parser.add_argument("--search-dtypes", default="mixed_bfloat16")
    parser.add_argument("--search-max", type=int, default=1024, help="largest per-GPU batch tried")
    parser.add_argument("--search-resolution", type=float, default=0.125,
                        help="bisection stops when (fail - ok) <= resolution x ok")
    parser.add_argument("--search-steps", type=int, default=2, help="steps per probe")
    parser.add_argument("--search-gpus", default="",
                        help="comma list of GPU ids: run the batch searches side by side, each "
                             "probe on one of these GPUs (one-GPU probes only)")
    parser.add_argument("--profile", default=None, help="directory for profiler traces")
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument("--out", default=None, help="markdown file to write")
    parser.add_argument("--json", default=None,
                        help="JSON file to merge this invocation's runs into (the markdown is "
                             "rendered from all of its runs)")
    parser.add_argument("--merge", nargs="+", default=None, metavar="FILE",
                        help="run nothing: merge these results files (e.g. from several "
                             "machines) into --json and render --out")
    parser.add_argument("--save", action="store_true",
                        help="--json/--out benchmarks/results/model_<gpu>.json/.md (both "
                             "rewritten from the merged runs)")
    parser.add_argument("--timeout", type=int, default=1800,
                        help="seconds per subprocess (an XLA compile of the full model alone "
                             "takes minutes)")
    parser.add_argument("--tiny", action="store_true",
                        help="tiny model, T=8, U=4, batch 2, 2 steps (CPU smoke test)")
    parser.add_argument("--run", default=None, help=argparse.SUPPRESS)  # worker: JSON spec
    args = parser.parse_args(argv)
    given = " ".join(argv if argv is not None else sys.argv[1:])
    if args.tiny:
        args.frames, args.labels, args.mel_bins = 8, 4, 16
        if "--vocab" not in given:
            args.vocab = "17"
        if "--matmul-size" not in given:
            args.matmul_size = 256
        args.d_model, args.blocks, args.heads, args.ff_dim = 32, 2, 4, 64
        args.kernel_size, args.subsampling_channels = 5, 8
        args.predictor_dim, args.joint_dim = 32, 24
        args.steps, args.warmup = 2, 1
        if "--batch" not in given:
            args.batch = 2
        args.search_max = min(args.search_max, 2 * args.batch)
        args.search_steps = 1
    args.vocabs = _int_list(args.vocab)
    args.variant_list = _variant_list(args.variants)
    args.dtype_list = _str_list(args.dtypes)
    args.jit_list = _str_list(args.jit_compile)
    for name, values, allowed in (("variants", args.variant_list, VARIANTS),
                                  ("dtypes", args.dtype_list, DTYPES),
                                  ("--jit-compile", args.jit_list, JIT_SETTINGS)):
        unknown = set(values) - set(allowed)
        if unknown:
            parser.error(f"unknown {name} {sorted(unknown)}; choose from {allowed}")
    if not args.vocabs or min(args.vocabs) < 2:
        parser.error(f"--vocab needs sizes of at least 2, got {args.vocab!r}")
    return args


def encoder_flops(batch, frames_in, mel_bins=80, d_model=512, blocks=16, heads=8, ff_dim=2048,
                  kernel_size=31, subsampling_channels=512, training=True):
    """Multiply-add FLOPs (2 per multiply-add) of the Conformer encoder of
    `examples/speech/conformer.py` on a padded `[batch, frames_in, mel_bins]` batch.

    Counted: the matrix products and convolutions, on the padded tensors (what the GPU
    computes); not counted: normalization, activations, softmax, masking, biases.

      * subsampling: two 3x3 convolutions with stride 2 after one zero frame/bin on each side,
        `T1 = (frames_in - 1) // 2 + 1`, `F1 = (mel_bins - 1) // 2 + 1` (and again for T, F2):
        `2 B T1 F1 C 9 + 2 B T F2 C 9 C`, then the projection `2 B T (F2 C) d`;
      * per block, with `N = B T`:
          - two feed-forward modules: `2 x (2 N d ff + 2 N ff d)`;
          - attention: Q, K, V and output projections `4 x 2 N d d`; the scores `Q K^T` and
            their product with `V`, summed over the heads: `2 x 2 B T T d` (`heads` does not
            change the count);
          - convolution module: pointwise in `2 N d 2d`, depthwise `2 N d kernel_size`,
            pointwise out `2 N d d`.

    Training (`training=True`): forward + backward, the backward counted as 2x the forward
    (the gradients of both operands of every product), i.e. 3x the forward.

    Returns:
      FLOPs as a Python int.
    """
    def halve(n):
        return (n - 1) // 2 + 1

    t1, f1 = halve(frames_in), halve(mel_bins)
    t, f2 = halve(t1), halve(f1)
    c, d, n = subsampling_channels, d_model, batch * t
    subsampling = 2 * batch * t1 * f1 * c * 9 + 2 * batch * t * f2 * c * 9 * c
    projection = 2 * n * f2 * c * d
    feed_forward = 2 * (2 * n * d * ff_dim + 2 * n * ff_dim * d)
    attention = 4 * 2 * n * d * d + 2 * 2 * batch * t * t * d
    conv = 2 * n * d * 2 * d + 2 * n * d * kernel_size + 2 * n * d * d
    forward = subsampling + projection + blocks * (feed_forward + attention + conv)
    del heads  # the scores' FLOPs are the same for any head count
    return 3 * forward if training else forward


def model_encoder_flops(args, batch, training=True):
    """`encoder_flops` of the benchmark's model sizes (`args`) at `batch`."""
    return encoder_flops(batch, 4 * args.frames, args.mel_bins, args.d_model, args.blocks,
                         args.heads, args.ff_dim, args.kernel_size, args.subsampling_channels,
                         training)


# ----------------------------------------------------------------------------------------------
# Worker: one run in this process.
# ----------------------------------------------------------------------------------------------
def _model_kwargs(args, vocab):
    lstm = {"auto": {}, "loop": {"lstm_use_cudnn": False},
            "unrolled": {"lstm_unroll": True, "max_labels": args.labels}}[args.lstm]
    return dict(vocab_size=vocab, num_mel_bins=args.mel_bins, d_model=args.d_model,
                num_blocks=args.blocks, num_heads=args.heads, ff_dim=args.ff_dim,
                conv_kernel_size=args.kernel_size,
                subsampling_channels=args.subsampling_channels,
                embedding_dim=args.predictor_dim, predictor_dim=args.predictor_dim,
                joint_dim=args.joint_dim, attention=args.attention, **lstm)


def tfasr_loss_or_fallback(reduction="sum_over_batch_size"):
    """(loss, description) for the tfasr variant: TensorFlowASR's RNN-T loss where it loads,
    else `tf_rnnt.reference.rnnt_loss` (keras_baselines.ReferenceRNNTLoss), with the reason."""
    import tfasr_baseline

    found, why = tfasr_baseline.available()
    if found:
        return (tfasr_baseline.make_loss_class()(reduction=reduction),
                f"TensorFlowASR {why} rnnt_loss (pure TF)")
    from keras_baselines import ReferenceRNNTLoss

    return (ReferenceRNNTLoss(reduction=reduction),
            f"tf_rnnt.reference.rnnt_loss (fallback: {why})")


LOSS_DESCRIPTIONS = {
    "flash": "RNNTJoint tiled + FlashRNNTLoss",
    "flash-untiled": "RNNTJoint untiled + FlashRNNTLoss",
    "logits": "full logits (compute dtype) + tf_rnnt.keras.RNNTLoss",
    "reference": "full logits (compute dtype) + tf_rnnt.reference.rnnt_loss",
}


def build(args, variant, vocab, reduction="sum_over_batch_size"):
    """(model, loss, loss description) of a variant under the current dtype policy."""
    import keras

    from tf_rnnt import keras as tf_rnnt_keras

    conformer = _load("bench_conformer", _CONFORMER)
    flash = variant in ("flash", "flash-untiled")
    model = conformer.build_conformer_transducer(
        output="lattice" if flash else "logits",
        joint_mode="untiled" if variant == "flash-untiled" else "tiled",
        **_model_kwargs(args, vocab))
    description = LOSS_DESCRIPTIONS.get(variant)
    if flash:
        loss = tf_rnnt_keras.FlashRNNTLoss(reduction=reduction)
    elif variant == "logits":
        loss = tf_rnnt_keras.RNNTLoss(reduction=reduction)
    elif variant == "tfasr":
        # Full float32 logits (what TensorFlowASR's loss takes); the Activation keeps the mask.
        out = keras.layers.Activation("linear", dtype="float32", name="logits_float32")(
            model.output)
        model = keras.Model(model.input, out, name=model.name)
        loss, description = tfasr_loss_or_fallback(reduction)
        description = "full float32 logits + " + description
    else:
        from keras_baselines import ReferenceRNNTLoss

        loss = ReferenceRNNTLoss(reduction=reduction)
    return model, loss, description


def synthetic_batch(args, batch, vocab, seed=0):
    """One batch `({"features", "feature_lengths", "labels"}, labels)` as numpy arrays."""
    import numpy as np

    rng = np.random.default_rng(seed)
    frames_in = 4 * args.frames
    lengths = rng.integers(max(1, int(args.min_length * frames_in)), frames_in + 1, size=batch)
    lengths[0] = frames_in
    num_labels = rng.integers(max(1, int(args.min_length * args.labels)), args.labels + 1,
                              size=batch)
    num_labels[0] = args.labels
    features = rng.normal(size=(batch, frames_in, args.mel_bins)).astype(np.float32)
    features[np.arange(frames_in)[None, :] >= lengths[:, None]] = 0.0
    labels = rng.integers(1, vocab, size=(batch, args.labels)).astype(np.int32)
    labels[np.arange(args.labels)[None, :] >= num_labels[:, None]] = -1
    inputs = {"features": features, "feature_lengths": lengths.astype(np.int32),
              "labels": labels}
    return inputs, labels


def _sync(tf):
    sync = getattr(getattr(tf.test, "experimental", None), "sync_devices", None)
    if sync is not None:
        sync()


def _gpu_peaks(tf, names):
    return [tf.config.experimental.get_memory_info(n)["peak"] for n in names]


def _reset_peaks(tf, names):
    for n in names:
        tf.config.experimental.reset_memory_stats(n)


def matmul_rate(tf, size, dtype="bfloat16", repeats=10):
    """FLOP/s of a `[size, size] x [size, size]` `tf.matmul` in `dtype` on the default device
    (median of `repeats` synced calls after one untimed call)."""
    a = tf.random.normal([size, size], dtype=tf.float32)
    a, b = tf.cast(a, dtype), tf.cast(tf.transpose(a), dtype)
    product = tf.function(lambda x, y: tf.matmul(x, y))
    product(a, b).numpy()
    times = []
    for _ in range(repeats):
        _sync(tf)
        start = time.perf_counter()
        result = product(a, b)
        _sync(tf)
        result.numpy()[:1, :1]  # a host copy of one value: the product has finished
        times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times)


def time_encoder_alone(tf, model, inputs, jit, repeats=5):
    """Milliseconds of the model's encoder forward + backward alone (the gradients of its
    summed output with respect to its weights) on `inputs`, compiled as the run's step is
    (`jit` "true": XLA): median of `repeats` synced calls after a first (compiling) call."""
    encoder = model.get_layer("encoder")
    features = tf.constant(inputs["features"])
    lengths = tf.constant(inputs["feature_lengths"])
    weights = encoder.trainable_weights

    @tf.function(jit_compile=jit == "true")
    def forward_backward():
        with tf.GradientTape() as tape:
            total = tf.reduce_sum(tf.cast(encoder([features, lengths], training=True),
                                          tf.float32))
        grads = tape.gradient(total, weights)
        # Every gradient feeds the result, so that none is pruned.
        return total + tf.add_n([tf.reduce_sum(tf.cast(g, tf.float32)) for g in grads])

    forward_backward().numpy()
    times = []
    for _ in range(repeats):
        _sync(tf)
        start = time.perf_counter()
        forward_backward().numpy()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def profile_encoder_seconds(profile_dir, steps):
    """(encoder seconds per step, busy seconds per step) from a trace of `steps` steps: the
    device time of the ops under the model's "encoder" layer, forward and backward
    (`trace_summary.layer_seconds`); (None, busy) if no op in the trace names that layer."""
    import trace_summary

    totals = trace_summary.layer_seconds(profile_dir, steps, depth=1)
    busy = sum(totals.values())
    encoder = sum(seconds for (pass_, key), seconds in totals.items()
                  if pass_ in ("forward", "backward") and key.startswith("encoder"))
    return (encoder or None), busy


def run_fit(args, spec):
    """`model.fit` under MirroredStrategy over `spec["gpus"]` GPUs (the CPU without a GPU)."""
    import numpy as np
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    import keras

    keras.mixed_precision.set_global_policy(spec["dtype"])
    keras.utils.set_random_seed(0)
    if gpus:
        if len(gpus) < spec["gpus"]:
            return {"status": f"needs {spec['gpus']} GPUs, {len(gpus)} visible"}
        devices = [f"/gpu:{i}" for i in range(spec["gpus"])]
        if spec["gpus"] > 1:
            strategy = tf.distribute.MirroredStrategy(devices)
            device = f"{spec['gpus']} x GPU (MirroredStrategy)"
        else:
            # One GPU: plain model.fit, as users train on one device. (Under a tf.distribute
            # strategy Keras does not hand the logits' mask to the loss, which RNNTLoss needs.)
            strategy = tf.distribute.get_strategy()
            device = "1 x GPU"
    else:
        devices = []
        strategy = tf.distribute.get_strategy()
        device = "CPU (no GPU visible; --gpus ignored)"
    replicas = strategy.num_replicas_in_sync
    per_gpu, vocab = spec["batch"], spec["vocab"]
    jit = spec.get("jit", "false")
    with strategy.scope():
        model, loss, loss_description = build(args, spec["variant"], vocab)
        model.compile(optimizer=keras.optimizers.Adam(1e-4), loss=loss,
                      jit_compile={"false": False, "true": True}.get(jit, "auto"))
    inputs, labels = synthetic_batch(args, per_gpu * replicas, vocab)
    dataset = tf.data.Dataset.from_tensors((inputs, labels)).repeat().prefetch(2)
    gpu_names = [f"GPU:{i}" for i in range(len(devices))]
    warmup, steps = spec["warmup"], spec["steps"]
    profile_dir = spec.get("profile")
    profile_steps = args.profile_steps if profile_dir else 0
    total = warmup + steps + profile_steps
    times, losses, peaks, first = [], [], {}, []

    class Timer(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == warmup:
                _reset_peaks(tf, gpu_names)
            if profile_dir and batch == warmup + steps:
                tf.profiler.experimental.start(profile_dir)
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            _sync(tf)
            loss_value = float(logs["loss"])  # a host copy: the step has finished
            elapsed = time.perf_counter() - self.start
            if batch == 0:
                first.append(elapsed)
            if warmup <= batch < warmup + steps:
                times.append(elapsed)
                losses.append(loss_value)
            if batch == warmup + steps - 1:
                peaks["gpu"] = _gpu_peaks(tf, gpu_names)
            if profile_dir and batch == total - 1:
                tf.profiler.experimental.stop()

    status = "ok"
    start = time.perf_counter()
    try:
        model.fit(dataset, epochs=1, steps_per_epoch=total, verbose=0, callbacks=[Timer()])
    except tf.errors.ResourceExhaustedError as e:
        status = "OOM"
        print(f"OOM: {str(e)[:300]}", file=sys.stderr)
    fit_seconds = time.perf_counter() - start
    step_ms = 1e3 * statistics.median(times) if len(times) == steps else None
    result = {
        "status": status, "device": device, "replicas": replicas, "gpus": len(devices),
        "batch": per_gpu, "step_ms": step_ms, "loss_impl": loss_description,
        # The first step's tracing, graph optimization and (XLA) compilation.
        "compile_s": first[0] - step_ms / 1e3 if first and step_ms else None,
        "first_step_s": first[0] if first else None, "fit_s": fit_seconds,
        "peak_gpu_bytes": max(peaks["gpu"]) if peaks.get("gpu") else None,
        "peak_gpu_bytes_each": peaks.get("gpu"),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "jit_compile": bool(model.jit_compile),  # what Keras kept: False if a layer refused XLA
        "params": model.count_params(), "loss": losses[-1] if losses else None,
        "finite": bool(losses) and bool(np.all(np.isfinite(losses))),
        "encoder_flops": model_encoder_flops(args, per_gpu * replicas),
    }
    if status == "ok" and profile_dir and profile_steps:
        encoder_s, busy_s = profile_encoder_seconds(profile_dir, profile_steps)
        result.update(encoder_ms=encoder_s and 1e3 * encoder_s / max(1, len(devices)),
                      busy_ms=1e3 * busy_s / max(1, len(devices)))
    if status == "ok" and args.encoder_alone and spec.get("matmul"):
        try:
            result["encoder_alone_ms"] = time_encoder_alone(tf, model, inputs, jit)
        except tf.errors.ResourceExhaustedError:
            result["encoder_alone_ms"] = None
    if status == "ok" and spec.get("matmul") and args.matmul_size:
        try:
            result["matmul_flops_per_s"] = matmul_rate(tf, args.matmul_size)
            result["matmul_size"] = args.matmul_size
        except tf.errors.ResourceExhaustedError:
            result["matmul_flops_per_s"] = None
    return result


def run_multiworker(args, spec):
    """The custom loop of examples/multiworker/train.py under MultiWorkerMirroredStrategy
    (this process is one worker; TF_CONFIG and CUDA_VISIBLE_DEVICES are set by the driver)."""
    import numpy as np
    import tensorflow as tf

    train = _load("bench_multiworker_train", _MULTIWORKER)
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    strategy = train.make_strategy("multiworker", "nccl" if gpus else "ring")
    import keras

    keras.mixed_precision.set_global_policy(spec["dtype"])
    keras.utils.set_random_seed(0)
    per_gpu = spec["batch"]
    global_batch = per_gpu * strategy.num_replicas_in_sync
    with strategy.scope():
        model, loss, _ = build(args, spec["variant"], spec["vocab"], reduction=None)
        optimizer = keras.optimizers.Adam(1e-4)
    trainer = train.DistributedTrainer(strategy, model, optimizer, global_batch, loss=loss)
    inputs, labels = synthetic_batch(args, global_batch, spec["vocab"])

    def dataset_fn(context):
        batch = context.get_per_replica_batch_size(global_batch)
        start = context.input_pipeline_id * batch
        part = ({k: v[start:start + batch] for k, v in inputs.items()},
                labels[start:start + batch])
        return tf.data.Dataset.from_tensors(part).repeat().prefetch(2)

    gpu_names = [f"GPU:{i}" for i in range(len(gpus))]
    warmup, steps = spec["warmup"], spec["steps"]
    task_index = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)
    profile_dir = spec.get("profile")
    if profile_dir:
        profile_dir = os.path.join(profile_dir, f"worker{task_index}")
    total = warmup + steps + (args.profile_steps if profile_dir else 0)
    times, losses, peaks = [], [], []

    def on_step(step, loss_value, seconds):
        if step == warmup - 1:
            _reset_peaks(tf, gpu_names)
        if warmup <= step < warmup + steps:
            times.append(seconds)
            losses.append(loss_value)
        if step == warmup + steps - 1:
            peaks.extend(_gpu_peaks(tf, gpu_names))
            if profile_dir:
                tf.profiler.experimental.start(profile_dir)
        if profile_dir and step == total - 1:
            tf.profiler.experimental.stop()

    status = "ok"
    try:
        trainer.fit(dataset_fn, total, on_step=on_step)
    except tf.errors.ResourceExhaustedError as e:
        status = "OOM"
        print(f"OOM: {str(e)[:300]}", file=sys.stderr)
    workers = len(json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
                  .get("worker", [None]))
    return {
        "status": status,
        "device": (f"{workers} workers x 1 GPU (MultiWorkerMirroredStrategy, custom loop)"
                   if gpus else f"{workers} CPU workers (no GPU visible)"),
        "replicas": strategy.num_replicas_in_sync, "gpus": workers if gpus else 0,
        "workers": workers, "batch": per_gpu,
        "step_ms": 1e3 * statistics.median(times) if len(times) == steps else None,
        "peak_gpu_bytes": max(peaks) if peaks else None,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "params": model.count_params(), "loss": losses[-1] if losses else None,
        "finite": bool(losses) and bool(np.all(np.isfinite(losses))),
    }


def run_worker(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    spec = json.loads(args.run)
    result = run_multiworker(args, spec) if spec.get("mode") == "multiworker" else \
        run_fit(args, spec)
    result.update(spec)
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    name = "-"
    if gpus:
        try:
            name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
        except Exception:  # informative only
            name = "GPU"
    result.update(visible_gpus=len(gpus), device_name=name, tf_version=tf.__version__)
    print("RESULT " + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------------------------
# Driver.
# ----------------------------------------------------------------------------------------------
_OOM_MARKERS = ("ResourceExhausted", "OOM", "out of memory", "Out of memory",
                "CUDA_ERROR_OUT_OF_MEMORY")


def _driver_argv(argv):
    """The driver's flags, minus the ones the driver alone uses."""
    drop_value = {"--out", "--gpus", "--workers", "--variants", "--dtypes", "--profile",
                  "--search-gpus", "--search-variants", "--search-dtypes", "--json",
                  "--vocab", "--jit-compile"}
    drop_flag = {"--save"}
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in drop_flag:
            continue
        if name in drop_value:
            skip = "=" not in a
            continue
        out.append(a)
    return out


def _parse_result(proc_stdout, proc_stderr, returncode):
    for line in proc_stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    text = proc_stderr or proc_stdout or ""
    tail = " | ".join(text.strip().splitlines()[-3:])
    status = "OOM" if any(m in text for m in _OOM_MARKERS) else f"error (exit {returncode})"
    return {"status": status, "detail": tail[-300:]}


def _env():
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
                PYTHONPATH=os.pathsep.join([_REPO_ROOT, os.environ.get("PYTHONPATH", "")]))


def run_subprocess(base_argv, spec, timeout, devices=None):
    """One run in a subprocess; `devices`: its CUDA_VISIBLE_DEVICES (None: inherited)."""
    cmd = [sys.executable, os.path.abspath(__file__)] + base_argv + ["--run", json.dumps(spec)]
    env = _env() if devices is None else dict(_env(), CUDA_VISIBLE_DEVICES=str(devices))
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(spec, status=f"timeout {timeout}s")
    return dict(spec, **_parse_result(proc.stdout, proc.stderr, proc.returncode))


def run_workers(base_argv, spec, num_workers, gpus_visible, timeout):
    if 0 < gpus_visible < num_workers:
        return dict(spec, status=f"needs {num_workers} GPUs, {gpus_visible} visible")
    train = _load("bench_multiworker_train", _MULTIWORKER)
    cmd = [sys.executable, os.path.abspath(__file__)] + base_argv + ["--run", json.dumps(spec)]
    results = train.launch_local_workers(
        lambda i: cmd, num_workers, gpus=list(range(num_workers)) if gpus_visible else None,
        env=_env(), timeout=timeout)
    if any(code is None for code, _, _ in results):
        return dict(spec, status=f"timeout {timeout}s")
    parsed = [_parse_result(out, err, code) for code, out, err in results]
    chief = parsed[0]
    if chief.get("status") == "ok" and any(p.get("status") != "ok" for p in parsed[1:]):
        chief = next(p for p in parsed[1:] if p.get("status") != "ok")
    if chief.get("status") == "ok":
        others = [p["peak_gpu_bytes"] for p in parsed if p.get("peak_gpu_bytes") is not None]
        chief["peak_gpu_bytes"] = max(others) if others else None
    return dict(spec, **chief)


def _ok(result):
    return result.get("status") == "ok" and result.get("finite", False)


def search_largest_batch(base_argv, args, variant, dtype, gpus, known_ok, log, devices=None,
                         vocab=None, jit="false"):
    """Largest per-GPU batch that trains: doubling from --batch, then bisection. `known_ok`:
    --batch itself already trained (not probed again); `devices`: the probes'
    CUDA_VISIBLE_DEVICES; `vocab` (default: the first of --vocab) and `jit`: the row's
    settings."""
    vocab = args.vocabs[0] if vocab is None else vocab

    def probe(batch):
        spec = {"mode": "fit", "variant": variant, "dtype": dtype, "gpus": gpus, "batch": batch,
                "vocab": vocab, "jit": jit, "warmup": 1 if args.search_steps > 1 else 0,
                "steps": max(1, args.search_steps - 1)}
        result = run_subprocess(base_argv, spec, args.timeout, devices)
        log(f"  probe {variant} V={vocab} {dtype} jit={jit} batch {batch}: "
            f"{result.get('status')}")
        return _ok(result)

    ok, fail = None, None
    batch = args.batch
    if known_ok:
        ok, batch = batch, 2 * batch
    while batch <= args.search_max:
        if probe(batch):
            ok, batch = batch, 2 * batch
        else:
            fail = batch
            break
    if ok is None:  # even --batch failed: halve down
        batch = fail // 2 if fail else args.batch // 2
        while batch >= 1 and not probe(batch):
            fail, batch = batch, batch // 2
        ok = batch if batch >= 1 else 0
    if fail is None:
        return {"largest_batch": ok, "bound": ">="}
    while fail - ok > max(1, int(args.search_resolution * ok)):
        mid = (ok + fail) // 2
        if probe(mid):
            ok = mid
        else:
            fail = mid
    return {"largest_batch": ok, "bound": "", "first_fail": fail}


def _mib(value):
    return "-" if value is None else f"{value / 2**20:,.0f}"


def _count_gpus():
    """GPUs on this machine per `nvidia-smi -L` (0 without it), without initializing CUDA."""
    return len(_gpu_names())


def _gpu_names():
    """Names of the visible GPUs per `nvidia-smi -L` ([] without it), CUDA not initialized."""
    try:
        proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    names = [line.split(":", 1)[1].split("(UUID")[0].strip()
             for line in proc.stdout.splitlines() if line.startswith("GPU ") and ":" in line]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        names = names[:len([d for d in visible.split(",") if d.strip()])]
    return names


def gpu_slug(name):
    """Short file-name form of a GPU name: "NVIDIA H100 80GB HBM3" -> "h100"; "cpu" for none."""
    if not name or name in ("-", "CPU"):
        return "cpu"
    for token in name.replace("-", " ").split():
        low = token.lower()
        if low[:1].isalpha() and any(ch.isdigit() for ch in low) and "gb" not in low:
            return low
    return "gpu"


def _throughput(r):
    if not r.get("step_ms"):
        return None
    return max(1, r.get("replicas", 1)) * r["batch"] / (r["step_ms"] / 1e3)


def run_key(r):
    """What identifies a run in the merged results: a later run with the same key replaces it."""
    return (r.get("variant"), r.get("vocab"), r.get("dtype"), r.get("jit", "false"),
            r.get("mode"), r.get("gpus_requested"), r.get("batch"), r.get("attention", "keras"),
            r.get("lstm", "auto"))


def _gpu_cell(r):
    if r.get("visible_gpus"):
        return r.get("device_name") or "GPU"
    if r.get("visible_gpus") == 0:
        return "CPU"
    return r.get("gpu_name") or "CPU"  # a run that reported nothing: what nvidia-smi named


def encoder_time(r):
    """(encoder ms per step, source): the profile's encoder GPU time, else the encoder timed
    alone ("alone"), else (None, "")."""
    if r.get("encoder_ms"):
        return r["encoder_ms"], ""
    if r.get("encoder_alone_ms"):
        return r["encoder_alone_ms"], "alone"
    return None, ""


def _share_cell(r):
    encoder_ms, source = encoder_time(r)
    if not encoder_ms or not _ok(r) or not r.get("step_ms"):
        return "-"
    return f"{encoder_ms / r['step_ms']:.0%}" + (f" ({source})" if source else "")


def _tflops_cell(r):
    flops, (encoder_ms, source) = r.get("encoder_flops"), encoder_time(r)
    if not flops or not encoder_ms or not _ok(r):
        return "-"
    rate = flops / (encoder_ms / 1e3) / max(1, r.get("replicas", 1))
    text = f"{rate / 1e12:.3g}"
    if r.get("matmul_flops_per_s"):
        text += f" ({rate / r['matmul_flops_per_s']:.0%} of {r['matmul_flops_per_s'] / 1e12:.3g})"
    return text + (f" ({source})" if source else "")


def _variant_cell(r):
    if r.get("variant") == "tfasr" and "fallback" in str(r.get("loss_impl", "")):
        return "tfasr (reference loss: TensorFlowASR not installed)"
    return r.get("variant", "?")


def _jit_cell(r):
    jit = r.get("jit", "false")
    if jit == "true" and r.get("jit_compile") is False:
        return "true (refused by Keras)"
    return jit


def _comparison(results):
    """Flash against full logits (and TensorFlowASR) at mixed_bfloat16, per-GPU B=32, one
    device, per V and XLA setting."""
    def row(variant, vocab, jit):
        for r in results:
            if (r["variant"] == variant and r["dtype"] == "mixed_bfloat16" and
                    r.get("mode") == "fit" and r.get("gpus_requested") == 1 and
                    r.get("vocab") == vocab and r.get("jit", "false") == jit and
                    r["batch"] == 32 and _ok(r)):
                return r
        return None

    lines = ["", "Flash against full logits (flash = RNNTJoint tiled + FlashRNNTLoss; logits = "
             "full logits + RNNTLoss; tfasr = full float32 logits + TensorFlowASR's loss; "
             "mixed_bfloat16, per-GPU B=32, one device):", ""]
    groups = sorted({(r.get("vocab"), r.get("jit", "false")) for r in results
                     if r.get("vocab") is not None})
    found = False
    for vocab, jit in groups:
        flash = row("flash", vocab, jit)
        for other_name in ("logits", "tfasr"):
            other = row(other_name, vocab, jit)
            if not flash or not other:
                continue
            found = True
            faster = other["step_ms"] / flash["step_ms"]
            text = (f"- V={vocab}, XLA {jit}, flash vs {other_name}: step {flash['step_ms']:.1f} "
                    f"vs {other['step_ms']:.1f} ms ({faster:.2f}x the speed)")
            if flash.get("peak_gpu_bytes") and other.get("peak_gpu_bytes"):
                lower = 1 - flash["peak_gpu_bytes"] / other["peak_gpu_bytes"]
                text += (f", peak memory {_mib(flash['peak_gpu_bytes'])} vs "
                         f"{_mib(other['peak_gpu_bytes'])} MiB ({lower:.1%} lower)")
            f_s, o_s = flash.get("largest_batch"), other.get("largest_batch")
            if f_s and o_s:
                text += (f", largest batch {flash.get('bound', '')}{f_s} vs "
                         f"{other.get('bound', '')}{o_s}")
            lines.append(text)
    if not found:
        lines.append("- not evaluated: needs successful flash and logits (or tfasr) runs at "
                     "mixed_bfloat16, --batch 32, --gpus including 1, with the same V and XLA "
                     "setting")
    return lines


def render(data):
    """The markdown table of merged results `{"meta": ..., "runs": [...]}`."""
    meta, results = data["meta"], data["runs"]
    m = meta["model"]
    gpu_memory = any(r.get("visible_gpus") for r in results)
    devices = sorted({_gpu_cell(r) for r in results})
    tf_versions = sorted({r["tf_version"] for r in results if r.get("tf_version")})
    losses = {}
    for r in results:
        if r.get("loss_impl"):
            losses.setdefault(r["variant"], r["loss_impl"])
    lines = [
        "# Conformer transducer training: RNNTJoint + FlashRNNTLoss vs full logits",
        "",
        (f"- Device: {', '.join(devices)}" if gpu_memory else
         f"- Device: CPU only ({platform.processor() or 'cpu'}): no GPU visible, every run "
         f"uses the CPU and peak memory is the process' peak RSS")
        + f"; TensorFlow {', '.join(tf_versions) or '?'}",
        f"- Model: Conformer, {m['blocks']} blocks, d={m['d_model']}, {m['heads']} heads, "
        f"feed-forward {m['ff_dim']}, kernel {m['kernel_size']}, LSTM predictor "
        f"{m['predictor_dim']}, joint H={m['joint_dim']} (examples/speech/conformer.py)",
        f"- Data: synthetic, {4 * m['frames']} frames x {m['mel_bins']} log-mels in "
        f"(T={m['frames']} after subsampling), U={m['labels']}; lengths uniform in "
        f"[{m['min_length']:g}, 1] x max",
        "- Losses: " + "; ".join(f"{v}: {d}" for v, d in sorted(losses.items())),
        "- Encoder attention: " + ", ".join(sorted({r.get("attention", "keras") for r in results}))
        + " (examples/speech/conformer.py); predictor LSTM: "
        + ", ".join(sorted({r.get("lstm", "auto") for r in results})),
        "- Step: median of the timed steps after warm-up steps, synced; throughput = replicas x "
        "per-GPU batch / step. Compile: first step minus the median step (tracing, graph "
        "optimization, XLA compilation). Peak: TensorFlow allocator peak per GPU over the timed "
        "steps, max over GPUs. Largest batch: doubling from the row's batch, then bisection, "
        "each probe in its own process with the row's settings ('>=': no OOM up to the "
        "search's limit).",
        "- Encoder: GPU time of the ops under the model's encoder layer (forward + backward) "
        "in a profiler trace of steps after the timed ones, or '(alone)': the encoder's "
        "forward + backward timed by itself in the same process, compiled as the step; share "
        "= that over the step; TFLOP/s = the analytic encoder FLOPs per step "
        "(bench_model.encoder_flops) over that time, with its share of a bfloat16 tf.matmul's "
        "rate (TFLOP/s) measured in the same process ('-': not measured).",
        "- Commands:",
    ] + [f"  - `python benchmarks/bench_model.py {c}`" for c in meta.get("commands", [])] + [
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    baselines = {}
    for r in results:
        if _ok(r) and r.get("gpus_requested") == 1:
            baselines[run_key(dict(r, gpus_requested=None))] = r
    for r in results:
        if r.get("mode") == "multiworker":
            gpus_cell = f"{r.get('gpus_requested')} ({'workers' if gpu_memory else 'CPU workers'})"
        elif gpu_memory:
            gpus_cell = str(r.get("gpus_requested"))
        else:
            gpus_cell = "0 (CPU)"
        step = r.get("step_ms")
        throughput = _throughput(r) if _ok(r) else None
        # The 1-GPU run of the same kind, else (workers without a 1-worker run) the 1-GPU fit.
        base = (baselines.get(run_key(dict(r, gpus_requested=None))) or
                baselines.get(run_key(dict(r, gpus_requested=None, mode="fit"))))
        scaling = "-"
        if throughput and base and base is not r:
            scaling = f"{throughput / _throughput(base):.2f}x"
        elif throughput and base is r:
            scaling = "1.00x"
        memory = r.get("peak_gpu_bytes") if gpu_memory else r.get("peak_rss_bytes")
        largest = "-" if not r.get("largest_batch") and r.get("largest_batch") != 0 else \
            f"{r.get('bound', '')}{r['largest_batch']}"
        status = r.get("status", "?")
        if status == "ok" and not r.get("finite", False):
            status = "non-finite loss"
        ok = status == "ok"
        step_cell = f"{step:.1f}" if step and ok else status
        compile_cell = f"{r['compile_s']:.1f}" if ok and r.get("compile_s") is not None else "-"
        share = _share_cell(r)
        cells = [_gpu_cell(r), _variant_cell(r), str(r.get("vocab", "-")), r["dtype"],
                 _jit_cell(r), gpus_cell, str(r["batch"]), step_cell, compile_cell,
                 "-" if not throughput else f"{throughput:.1f}", scaling,
                 _mib(memory) if ok else "-", largest, share, _tflops_cell(r)]
        lines.append("| " + " | ".join(cells) + " |")
    failures = [r for r in results if r.get("detail")]
    if failures:
        lines += ["", "Failures:", ""]
        lines += [f"- {r['variant']} V={r.get('vocab')} {r['dtype']} XLA {r.get('jit')} "
                  f"{r.get('mode')} x{r.get('gpus_requested')}: {r['status']}: {r['detail']}"
                  for r in failures]
    lines += _comparison(results)
    profiles = sorted({r["profile"] for r in results if r.get("profile")})
    if profiles:
        lines += ["", "Profiler traces (`python benchmarks/trace_summary.py DIR --steps N "
                      "--depth 1`): " + ", ".join(f"`{p}`" for p in profiles) + "."]
    return "\n".join(lines) + "\n"


def model_meta(args):
    """The model and data sizes a results file holds (runs of other sizes do not merge)."""
    return {"frames": args.frames, "labels": args.labels, "mel_bins": args.mel_bins,
            "d_model": args.d_model, "blocks": args.blocks, "heads": args.heads,
            "ff_dim": args.ff_dim, "kernel_size": args.kernel_size,
            "subsampling_channels": args.subsampling_channels,
            "predictor_dim": args.predictor_dim, "joint_dim": args.joint_dim,
            "min_length": args.min_length}


def merge_results(path, meta, results):
    """The runs of `path` (if it exists and holds the same model) with `results` put in:
    a run replaces an earlier one with the same `run_key`."""
    old = None
    if path and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
    return merge_data(old, meta, results, path)


_SEARCH_KEYS = ("largest_batch", "bound", "first_fail", "searched")


def merge_data(old, meta, results, name="the results"):
    """`merge_results` on loaded data `old` (None: none yet)."""
    data = {"meta": dict(meta, commands=[]), "runs": []}
    if old is not None:
        if old.get("meta", {}).get("model") != meta["model"]:
            raise SystemExit(f"{name} holds runs of another model or data size "
                             f"({old.get('meta', {}).get('model')}); use another --json file")
        data = old
    data["meta"].update({k: v for k, v in meta.items() if k != "commands"})
    for command in meta.get("commands", []):
        if command not in data["meta"].setdefault("commands", []):
            data["meta"]["commands"].append(command)
    new = {run_key(r): r for r in results}
    for old_run in data["runs"]:
        # A run without a batch search keeps the search of the run it replaces.
        run = new.get(run_key(old_run))
        if run is not None and "largest_batch" not in run and "largest_batch" in old_run:
            run.update({k: old_run[k] for k in _SEARCH_KEYS if k in old_run})
    data["runs"] = [r for r in data["runs"] if run_key(r) not in new] + list(results)
    return data


def main(argv=None):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.run:
        run_worker(args)
        return
    if args.merge:
        merge_files(args.merge, args.json, args.out)
        return
    gpu_counts = [] if args.workers_only else _int_list(args.gpus)
    worker_counts = _int_list(args.workers)
    search_set = {(VARIANT_ALIASES.get(v, v), d) for v in _str_list(args.search_variants)
                  for d in _str_list(args.search_dtypes)}
    base_argv = _driver_argv(argv)
    gpu_names = _gpu_names()
    gpus_visible = len(gpu_names)
    if args.save:
        stem = os.path.join(_REPO_ROOT, "benchmarks", "results",
                            f"model_{gpu_slug(gpu_names[0] if gpu_names else None)}")
        args.json = args.json or stem + ".json"
        args.out = args.out or stem + ".md"
    meta = {"model": model_meta(args), "commands": [" ".join(argv)]}
    several_vocabs, several_jit = len(args.vocabs) > 1, len(args.jit_list) > 1

    def log(text):
        print(text, file=sys.stderr, flush=True)

    def publish(results):
        data = merge_results(args.json, meta, results)
        table = render(data)
        if args.json:
            _write_text(args.json, json.dumps(data, indent=1, sort_keys=True) + "\n")
        if args.out:
            _write_text(args.out, table)
        return table

    results, pending = [], []
    runs = [("fit", n) for n in gpu_counts] + [("multiworker", n) for n in worker_counts]
    for vocab in args.vocabs:
        for jit in args.jit_list:
            for dtype in args.dtype_list:
                for variant in args.variant_list:
                    for mode, count in runs:
                        spec = {"mode": mode, "variant": variant, "dtype": dtype, "gpus": count,
                                "gpus_requested": count, "batch": args.batch,
                                "warmup": args.warmup, "steps": args.steps, "vocab": vocab,
                                "jit": jit, "attention": args.attention, "lstm": args.lstm,
                                "matmul": True,
                                "gpu_name": gpu_names[0] if gpu_names else None}
                        if args.profile:
                            name = f"{variant}_{dtype}_{mode}{count}"
                            name += f"_v{vocab}" if several_vocabs else ""
                            name += f"_xla-{jit}" if several_jit or jit != "false" else ""
                            spec["profile"] = os.path.join(args.profile, name)
                        start = time.perf_counter()
                        if mode == "fit":
                            result = run_subprocess(base_argv, spec, args.timeout)
                        else:
                            result = run_workers(base_argv, spec, count, gpus_visible,
                                                 args.timeout)
                        log(f"{variant} V={vocab} {dtype} jit={jit} {mode} x{count}: "
                            f"{result.get('status')} {result.get('step_ms')} ms "
                            f"({time.perf_counter() - start:.0f} s)")
                        search_here = (not args.skip_batch_search and mode == "fit" and
                                       gpu_counts and count == min(gpu_counts) and
                                       (variant, dtype) in search_set)
                        if search_here:
                            pending.append((result, (variant, dtype, count, _ok(result)),
                                            vocab, jit))
                        results.append(result)
                        publish(results)  # partial: survives a kill
    search_gpus = [g for g in args.search_gpus.split(",") if g.strip()]
    if search_gpus and any(item[2] != 1 for _, item, _, _ in pending):
        search_gpus = []  # a probe over several GPUs needs them all

    def search(entry, devices):
        _, item, vocab, jit = entry
        return search_largest_batch(base_argv, args, *item, log, devices=devices, vocab=vocab,
                                    jit=jit)

    if len(search_gpus) > 1:
        # Independent searches side by side, each probe on one GPU of its own.
        free = queue.Queue()
        for g in search_gpus:
            free.put(g)

        def search_on_a_free_gpu(entry):
            gpu = free.get()
            try:
                return search(entry, gpu)
            finally:
                free.put(gpu)

        with concurrent.futures.ThreadPoolExecutor(len(search_gpus)) as pool:
            found = list(pool.map(search_on_a_free_gpu, pending))
    else:
        found = [search(entry, search_gpus[0] if search_gpus else None) for entry in pending]
    for (result, _, _, _), searched in zip(pending, found):
        result.update(searched)
        result["searched"] = True
        publish(results)
    table = publish(results)
    print(table)


def merge_files(paths, json_path, out):
    """Merges the results files `paths`, in order, into `json_path` (if it exists, its runs
    first) and renders the markdown to `out`."""
    data = None
    if json_path and os.path.exists(json_path):
        with open(json_path) as f:
            data = json.load(f)
    for path in paths:
        with open(path) as f:
            part = json.load(f)
        data = merge_data(data, part["meta"], part["runs"], path)
    if json_path:
        _write_text(json_path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    if out:
        _write_text(out, render(data))


def _write_text(path, text):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
