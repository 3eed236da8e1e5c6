"""Real-scale training benchmark: a ~110M-parameter Conformer transducer, RNNTJoint against
full logits, on one GPU, N GPUs (MirroredStrategy) and N worker processes
(MultiWorkerMirroredStrategy).

The model is `examples/speech/conformer.py` (16 Conformer blocks, d=512, LSTM predictor 640,
joint H=640, V=1025) trained on synthetic 16 s utterances: 1600 frames of 80 log-mels (T=400
after the 4x subsampling), U=128 labels, lengths uniform in [--min-length, 1] x max (the first
sample of each batch at the maximum). Variants:

  flash      RNNTJoint(mode="tiled") + FlashRNNTLoss   (no [B, T, U+1, V] tensor)
  untiled    RNNTJoint(mode="untiled") + FlashRNNTLoss
  logits     full logits (RNNTJoint.logits in a wrapper layer) + tf_rnnt.keras.RNNTLoss
  reference  full logits + tf_rnnt.reference.rnnt_loss (pure TensorFlow, autodiff)

Every run is its own subprocess (clean peak-memory statistics; an OOM stays contained):

  * step time: median over `--steps` steps after `--warmup` steps, each timed by a Keras
    callback from batch begin to batch end with the devices synced
    (`tf.test.experimental.sync_devices`); throughput = GPUs x per-GPU batch / step time.
  * peak memory: TensorFlow's allocator peak per GPU over the timed steps
    (`tf.config.experimental.get_memory_info`, reset after the warm-up), max over GPUs. Without
    a GPU the process' peak RSS is reported instead (marked "RSS").
  * largest batch: per-GPU batch doubled from `--batch` until a run fails with out-of-memory,
    then bisected (to `--search-resolution`); each probe is a subprocess running
    `--search-steps` steps. Only for `--search-variants` x `--search-dtypes`, on the smallest
    GPU count, after the timed runs; `--search-gpus 0,1` runs the searches side by side, one
    GPU each; `--skip-batch-search` turns it off.

`--gpus 1,2` runs `model.fit` on one GPU and under MirroredStrategy over 2 GPUs with the same
per-GPU batch; `--workers 2` runs the custom loop of `examples/multiworker/train.py` under
MultiWorkerMirroredStrategy in 2 local worker processes (one GPU each, TF_CONFIG on free
localhost ports, NCCL collectives); scaling is the throughput relative to the 1-GPU (1-worker)
run of the same kind in this invocation (for workers without a 1-worker run: the 1-GPU fit).
Without a GPU every run falls back to the CPU (said in the table).

`--profile DIR` records a TensorFlow profiler trace of `--profile-steps` steps after the timed
ones (TensorBoard's profile plugin reads DIR/<run>/).

Usage (H200):
  python benchmarks/bench_model.py --out benchmarks/results/model_h200.md
  python benchmarks/bench_model.py --gpus 1,2 --variants flash,logits --dtypes mixed_bfloat16 \\
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

VARIANTS = ("flash", "untiled", "logits", "reference")
DTYPES = ("float32", "mixed_bfloat16")
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONFORMER = os.path.join(_REPO_ROOT, "examples", "speech", "conformer.py")
_MULTIWORKER = os.path.join(_REPO_ROOT, "examples", "multiworker", "train.py")
COLUMNS = ("variant", "dtype", "GPUs", "per-GPU batch", "step ms", "throughput (utt/s)",
           "scaling vs 1 GPU", "peak memory per GPU (MiB)", "largest batch", "params")


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _int_list(text):
    return [int(x) for x in str(text).split(",") if x.strip()]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
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
    parser.add_argument("--vocab", type=int, default=1025)
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
    parser.add_argument("--jit-compile", choices=("false", "true", "auto"), default="false",
                        help="model.compile(jit_compile=...) for the model.fit runs")
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
    parser.add_argument("--timeout", type=int, default=900, help="seconds per subprocess")
    parser.add_argument("--tiny", action="store_true",
                        help="tiny model, T=8, U=4, batch 2, 2 steps (CPU smoke test)")
    parser.add_argument("--run", default=None, help=argparse.SUPPRESS)  # worker: JSON spec
    args = parser.parse_args(argv)
    if args.tiny:
        args.frames, args.labels, args.vocab, args.mel_bins = 8, 4, 17, 16
        args.d_model, args.blocks, args.heads, args.ff_dim = 32, 2, 4, 64
        args.kernel_size, args.subsampling_channels = 5, 8
        args.predictor_dim, args.joint_dim = 32, 24
        args.steps, args.warmup = 2, 1
        if "--batch" not in " ".join(argv or sys.argv[1:]):
            args.batch = 2
        args.search_max = min(args.search_max, 2 * args.batch)
        args.search_steps = 1
    return args


# ----------------------------------------------------------------------------------------------
# Worker: one run in this process.
# ----------------------------------------------------------------------------------------------
def _model_kwargs(args):
    return dict(vocab_size=args.vocab, num_mel_bins=args.mel_bins, d_model=args.d_model,
                num_blocks=args.blocks, num_heads=args.heads, ff_dim=args.ff_dim,
                conv_kernel_size=args.kernel_size,
                subsampling_channels=args.subsampling_channels,
                embedding_dim=args.predictor_dim, predictor_dim=args.predictor_dim,
                joint_dim=args.joint_dim)


def build(args, variant, reduction="sum_over_batch_size"):
    """(model, loss) of a variant under the current dtype policy."""
    from tf_rnnt import keras as tf_rnnt_keras

    conformer = _load("bench_conformer", _CONFORMER)
    output = "lattice" if variant in ("flash", "untiled") else "logits"
    model = conformer.build_conformer_transducer(
        output=output, joint_mode="untiled" if variant == "untiled" else "tiled",
        **_model_kwargs(args))
    if variant in ("flash", "untiled"):
        loss = tf_rnnt_keras.FlashRNNTLoss(reduction=reduction)
    elif variant == "logits":
        loss = tf_rnnt_keras.RNNTLoss(reduction=reduction)
    else:
        from keras_baselines import ReferenceRNNTLoss

        loss = ReferenceRNNTLoss(reduction=reduction)
    return model, loss


def synthetic_batch(args, batch, seed=0):
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
    labels = rng.integers(1, args.vocab, size=(batch, args.labels)).astype(np.int32)
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
    per_gpu = spec["batch"]
    with strategy.scope():
        model, loss = build(args, spec["variant"])
        model.compile(optimizer=keras.optimizers.Adam(1e-4), loss=loss,
                      jit_compile={"false": False, "true": True}.get(args.jit_compile, "auto"))
    inputs, labels = synthetic_batch(args, per_gpu * replicas)
    dataset = tf.data.Dataset.from_tensors((inputs, labels)).repeat().prefetch(2)
    gpu_names = [f"GPU:{i}" for i in range(len(devices))]
    warmup, steps = spec["warmup"], spec["steps"]
    profile_dir = spec.get("profile")
    profile_steps = args.profile_steps if profile_dir else 0
    total = warmup + steps + profile_steps
    times, losses, peaks = [], [], {}

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
            if warmup <= batch < warmup + steps:
                times.append(elapsed)
                losses.append(loss_value)
            if batch == warmup + steps - 1:
                peaks["gpu"] = _gpu_peaks(tf, gpu_names)
            if profile_dir and batch == total - 1:
                tf.profiler.experimental.stop()

    status = "ok"
    try:
        model.fit(dataset, epochs=1, steps_per_epoch=total, verbose=0, callbacks=[Timer()])
    except tf.errors.ResourceExhaustedError as e:
        status = "OOM"
        print(f"OOM: {str(e)[:300]}", file=sys.stderr)
    return {
        "status": status, "device": device, "replicas": replicas, "gpus": len(devices),
        "batch": per_gpu, "step_ms": 1e3 * statistics.median(times) if len(times) == steps
        else None,
        "peak_gpu_bytes": max(peaks["gpu"]) if peaks.get("gpu") else None,
        "peak_gpu_bytes_each": peaks.get("gpu"),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "jit_compile": bool(model.jit_compile),  # what Keras kept: False if a layer refused XLA
        "params": model.count_params(), "loss": losses[-1] if losses else None,
        "finite": bool(losses) and bool(np.all(np.isfinite(losses))),
    }


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
        model, loss = build(args, spec["variant"], reduction=None)
        optimizer = keras.optimizers.Adam(1e-4)
    trainer = train.DistributedTrainer(strategy, model, optimizer, global_batch, loss=loss)
    inputs, labels = synthetic_batch(args, global_batch)

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
                  "--search-gpus", "--search-variants", "--search-dtypes"}
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
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


def search_largest_batch(base_argv, args, variant, dtype, gpus, known_ok, log, devices=None):
    """Largest per-GPU batch that trains: doubling from --batch, then bisection. `known_ok`:
    --batch itself already trained (not probed again); `devices`: the probes'
    CUDA_VISIBLE_DEVICES."""
    def probe(batch):
        spec = {"mode": "fit", "variant": variant, "dtype": dtype, "gpus": gpus, "batch": batch,
                "warmup": 1 if args.search_steps > 1 else 0,
                "steps": max(1, args.search_steps - 1)}
        result = run_subprocess(base_argv, spec, args.timeout, devices)
        log(f"  probe {variant} {dtype} batch {batch}: {result.get('status')}")
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


def _device_summary(results):
    """(description, GPU memory measured?, TensorFlow version) from what the runs reported."""
    info = next((r for r in results if "visible_gpus" in r), None)
    if info is None:
        return "unknown (no run reported)", False, "?"
    if info["visible_gpus"]:
        text = f"{info['visible_gpus']} x {info['device_name']} visible"
    else:
        text = (f"CPU only ({platform.processor() or 'cpu'}): no GPU visible, every run uses "
                f"the CPU and peak memory is the process' peak RSS")
    return text, bool(info["visible_gpus"]), info["tf_version"]


def _count_gpus():
    """GPUs on this machine per `nvidia-smi -L` (0 without it), without initializing CUDA."""
    try:
        proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = sum(1 for line in proc.stdout.splitlines() if line.startswith("GPU "))
    if visible is not None:
        count = min(count, len([d for d in visible.split(",") if d.strip()]))
    return count


def _throughput(r):
    if not r.get("step_ms"):
        return None
    return max(1, r.get("replicas", 1)) * r["batch"] / (r["step_ms"] / 1e3)


def _comparison(results, searches, args, gpu_memory):
    """Flash against full logits at mixed_bfloat16, per-GPU B=32, one device."""
    def row(variant):
        for r in results:
            if (r["variant"] == variant and r["dtype"] == "mixed_bfloat16" and
                    r.get("mode") == "fit" and r.get("gpus_requested") == 1 and
                    r["batch"] == 32 and _ok(r)):
                return r
        return None

    flash, logits = row("flash"), row("logits")
    lines = ["", "Flash against full logits (flash = RNNTJoint tiled + FlashRNNTLoss, logits = "
             "full logits + RNNTLoss; mixed_bfloat16, per-GPU B=32, one device):", ""]
    if not flash or not logits:
        lines.append("- not evaluated: needs successful flash and logits runs at mixed_bfloat16, "
                     "--batch 32, --gpus including 1")
        return lines
    faster = 1 - flash["step_ms"] / logits["step_ms"]
    lines.append(f"- step time: {faster:.1%} faster "
                 f"({flash['step_ms']:.1f} vs {logits['step_ms']:.1f} ms)")
    mem_key = "peak_gpu_bytes" if gpu_memory else "peak_rss_bytes"
    if flash.get(mem_key) and logits.get(mem_key):
        lower = 1 - flash[mem_key] / logits[mem_key]
        lines.append(f"- peak memory: {lower:.1%} lower ({_mib(flash[mem_key])} vs "
                     f"{_mib(logits[mem_key])} MiB{'' if gpu_memory else ', RSS'})")
    else:
        lines.append("- peak memory: not evaluated (no peak)")
    f_s, l_s = searches.get(("flash", "mixed_bfloat16")), searches.get(("logits",
                                                                        "mixed_bfloat16"))
    if f_s and l_s and l_s["largest_batch"]:
        ratio = f_s["largest_batch"] / l_s["largest_batch"]
        note = (" (logits never ran out of memory up to --search-max)" if l_s["bound"] else
                " (flash never ran out of memory up to --search-max)" if f_s["bound"] else "")
        lines.append(f"- largest batch: {f_s['bound']}{f_s['largest_batch']} vs "
                     f"{l_s['bound']}{l_s['largest_batch']} ({f_s['bound']}{ratio:.2f}x){note}")
    else:
        lines.append("- largest batch: not evaluated (batch search skipped or failed)")
    return lines


def render(args, argv, results, searches):
    device, gpu_memory, tf_version = _device_summary(results)
    kept = sorted({str(r["jit_compile"]) for r in results if "jit_compile" in r})
    lines = [
        "# Conformer transducer training: RNNTJoint + FlashRNNTLoss vs full logits",
        "",
        f"- Device: {device}; TensorFlow {tf_version}",
        f"- Model: Conformer, {args.blocks} blocks, d={args.d_model}, {args.heads} heads, "
        f"feed-forward {args.ff_dim}, kernel {args.kernel_size}, LSTM predictor "
        f"{args.predictor_dim}, joint H={args.joint_dim}, V={args.vocab} "
        f"(examples/speech/conformer.py)",
        f"- Data: synthetic, {4 * args.frames} frames x {args.mel_bins} log-mels in "
        f"(T={args.frames} after subsampling), U={args.labels}; lengths uniform in "
        f"[{args.min_length:g}, 1] x max",
        f"- Training: model.fit, jit_compile={args.jit_compile} (model.jit_compile after "
        f"compile: {', '.join(kept) or '-'}; multi-worker: custom loop)",
        f"- Step: median of {args.steps} steps after {args.warmup} warm-up steps, synced; "
        f"throughput = replicas x per-GPU batch / step. Peak: TensorFlow allocator peak per GPU "
        f"over the timed steps, max over GPUs"
        f"{'' if gpu_memory else ' (no GPU: process peak RSS, MiB)'}. Largest batch: doubling "
        f"from {args.batch}, then bisection to {args.search_resolution:g} x, each probe "
        f"{args.search_steps} steps in its own process ('>=' : no OOM up to "
        f"{args.search_max}).",
        f"- Command: `python benchmarks/bench_model.py {' '.join(argv)}`",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    baselines = {}
    for r in results:
        if _ok(r) and r.get("gpus_requested") == 1:
            baselines[(r["variant"], r["dtype"], r["mode"], r["batch"])] = r
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
        base = (baselines.get((r["variant"], r["dtype"], r["mode"], r["batch"])) or
                baselines.get((r["variant"], r["dtype"], "fit", r["batch"])))
        scaling = "-"
        if throughput and base and base is not r:
            scaling = f"{throughput / _throughput(base):.2f}x"
        elif throughput and base is r:
            scaling = "1.00x"
        memory = r.get("peak_gpu_bytes") if gpu_memory else r.get("peak_rss_bytes")
        search = searches.get((r["variant"], r["dtype"])) if r.get("searched") else None
        largest = "-" if not search else f"{search['bound']}{search['largest_batch']}"
        status = r.get("status", "?")
        if status == "ok" and not r.get("finite", False):
            status = "non-finite loss"
        step_cell = f"{step:.1f}" if step and status == "ok" else status
        params = f"{r['params']:,}" if r.get("params") else "-"
        lines.append(f"| {r['variant']} | {r['dtype']} | {gpus_cell} | {r['batch']} | "
                     f"{step_cell} | {'-' if not throughput else f'{throughput:.1f}'} | "
                     f"{scaling} | {_mib(memory) if status == 'ok' else '-'} | {largest} | "
                     f"{params} |")
    failures = [r for r in results if r.get("detail")]
    if failures:
        lines += ["", "Failures:", ""]
        lines += [f"- {r['variant']} {r['dtype']} {r.get('mode')} x{r.get('gpus_requested')}: "
                  f"{r['status']}: {r['detail']}" for r in failures]
    lines += _comparison(results, searches, args, gpu_memory)
    if args.profile:
        lines += ["", f"Profiler traces: `{args.profile}/<variant>_<dtype>_<mode><N>` "
                      f"(`/worker<i>` for the workers; {args.profile_steps} steps after the "
                      f"timed ones; `tensorboard --logdir {args.profile}`)."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.run:
        run_worker(args)
        return
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for name, values, allowed in (("variants", variants, VARIANTS), ("dtypes", dtypes, DTYPES)):
        unknown = set(values) - set(allowed)
        if unknown:
            raise SystemExit(f"unknown {name} {sorted(unknown)}; choose from {allowed}")
    gpu_counts = [] if args.workers_only else _int_list(args.gpus)
    worker_counts = _int_list(args.workers)
    search_set = {(v, d) for v in args.search_variants.split(",")
                  for d in args.search_dtypes.split(",")}
    base_argv = _driver_argv(argv)
    gpus_visible = _count_gpus() if worker_counts else 0

    def log(text):
        print(text, file=sys.stderr, flush=True)

    results, searches, pending = [], {}, []
    runs = [("fit", n) for n in gpu_counts] + [("multiworker", n) for n in worker_counts]
    for dtype in dtypes:
        for variant in variants:
            for mode, count in runs:
                spec = {"mode": mode, "variant": variant, "dtype": dtype, "gpus": count,
                        "gpus_requested": count, "batch": args.batch, "warmup": args.warmup,
                        "steps": args.steps}
                if args.profile:
                    spec["profile"] = os.path.join(args.profile,
                                                   f"{variant}_{dtype}_{mode}{count}")
                start = time.perf_counter()
                if mode == "fit":
                    result = run_subprocess(base_argv, spec, args.timeout)
                else:
                    result = run_workers(base_argv, spec, count, gpus_visible, args.timeout)
                log(f"{variant} {dtype} {mode} x{count}: {result.get('status')} "
                    f"{result.get('step_ms')} ms ({time.perf_counter() - start:.0f} s)")
                search_here = (not args.skip_batch_search and mode == "fit" and gpu_counts and
                               count == min(gpu_counts) and (variant, dtype) in search_set)
                if search_here:
                    pending.append((variant, dtype, count, _ok(result)))
                    result["searched"] = True
                results.append(result)
                _write(args, render(args, argv, results, searches))  # partial: survives a kill
    search_gpus = [g for g in args.search_gpus.split(",") if g.strip()]
    if search_gpus and any(count != 1 for _, _, count, _ in pending):
        search_gpus = []  # a probe over several GPUs needs them all
    if len(search_gpus) > 1:
        # Independent searches side by side, each probe on one GPU of its own.
        free = queue.Queue()
        for g in search_gpus:
            free.put(g)

        def search_on_a_free_gpu(item):
            gpu = free.get()
            try:
                return item, search_largest_batch(base_argv, args, *item, log, devices=gpu)
            finally:
                free.put(gpu)

        with concurrent.futures.ThreadPoolExecutor(len(search_gpus)) as pool:
            for item, found in pool.map(search_on_a_free_gpu, pending):
                searches[item[:2]] = found
    else:
        for item in pending:
            searches[item[:2]] = search_largest_batch(base_argv, args, *item, log,
                                                      devices=search_gpus[0] if search_gpus
                                                      else None)
    table = render(args, argv, results, searches)
    print(table)
    _write(args, table)


def _write(args, table):
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
