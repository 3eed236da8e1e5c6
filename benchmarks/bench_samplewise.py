#!/usr/bin/env python3
"""Time and memory of tf_rnnt.samplewise_rnnt_loss as parallel_iterations grows.

  # the paper's setting (Braun et al. 2022) on a GPU: B=1024, T=1000, U=150, H=640, V=1024
  python benchmarks/bench_samplewise.py --profile paper --out benchmarks/results/samplewise_h200.md
  # a small CPU setting
  python benchmarks/bench_samplewise.py --profile cpu --out benchmarks/results/samplewise_cpu.md

Each setting (a parallel_iterations value, "auto", or a baseline: "reference" = the batched
pure-TF loss with full [B, T, U+1, V] logits, "flash" = the compiled tf_rnnt.flash_rnnt_loss)
runs in its own child process, so that peak memory is measured from a clean start and an
out-of-memory or a timeout loses only that row. A step is costs + the gradients of their
mean with respect to encoder, predictor, kernel and bias, inside one tf.function, ending in a
host read of a scalar that depends on all of them. Reported: the first call (trace, graph
optimization and one run), the median and min of --repeats steps after --warmup more, and
the peak memory above the inputs: on a GPU tf.config.experimental.get_memory_info peak after
a reset, minus what the inputs hold (TensorFlow's allocator statistics, on the GPU or the
CPU), over the warm-up and timed steps. The gradients themselves (as large as the inputs) are
part of the peak. On the CPU the table also gives the growth of the process's ru_maxrss from
after tracing, which includes the first call's graph instantiation and allocator caching.

The markdown table is rewritten to --out after every setting (and JSON next to it), so a run
cut short still leaves its finished rows. --time-budget stops starting new settings.
"""

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROFILES = {
    # The paper's long-utterance setting: 40 s of audio at 40 ms frames, 150 labels.
    # Most important first, in case --time-budget cuts the run short; "auto" is 1 here.
    "paper": dict(batch=1024, frames=1000, labels=150, hidden=640, vocab=1024,
                  settings="auto,2,4,8", warmup=1, repeats=2, baselines="flash"),
    # Short utterances on a GPU, where many samples run at once ("auto" is 16 here).
    "gpu-short": dict(batch=1024, frames=200, labels=30, hidden=640, vocab=1024,
                      settings="auto,1,4,64", warmup=1, repeats=3, baselines="flash"),
    # Small enough for a 2-core CPU in a few minutes.
    "cpu": dict(batch=32, frames=150, labels=30, hidden=256, vocab=512,
                settings="1,2,4,8,16,auto", warmup=1, repeats=3, baselines="reference,flash"),
}


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None,
                        help="sizes and settings (default: paper with a GPU, else cpu)")
    parser.add_argument("--parallel-iterations", default=None,
                        help="comma list of ints and/or 'auto' (default: the profile's)")
    parser.add_argument("--baselines", default=None,
                        help="comma list of 'reference' (batched full logits) and 'flash' "
                             "(compiled op); '' for none (default: the profile's)")
    for name in ("batch", "frames", "labels", "hidden", "vocab", "warmup", "repeats"):
        parser.add_argument(f"--{name}", type=int, default=None, help="override the profile")
    parser.add_argument("--ragged", action="store_true",
                        help="random lengths in [half, full] instead of all full")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--activation", default="tanh", choices=["tanh", "relu", "identity"])
    parser.add_argument("--memory-budget", type=float, default=None,
                        help="bytes for 'auto' (default: tf_rnnt.samplewise.DEFAULT_MEMORY_BUDGET)")
    parser.add_argument("--tf32", choices=["default", "on", "off"], default="default",
                        help="TensorFloat-32 GEMMs on a GPU (TensorFlow's default is on)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the settings round-robin this many times and pool the "
                             "timings (robust to load drift on a shared machine)")
    parser.add_argument("--time-budget", type=float, default=540.0,
                        help="seconds; no new setting starts after this (default 540)")
    parser.add_argument("--out", default=None, help="markdown file to write (and .json)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return args


def _resolve(args, has_gpu):
    profile = args.profile or ("paper" if has_gpu else "cpu")
    config = dict(PROFILES[profile])
    for name in ("batch", "frames", "labels", "hidden", "vocab", "warmup", "repeats"):
        if getattr(args, name) is not None:
            config[name] = getattr(args, name)
    if args.parallel_iterations is not None:
        config["settings"] = args.parallel_iterations
    if args.baselines is not None:
        config["baselines"] = args.baselines
    settings = [s.strip() for s in config["settings"].split(",") if s.strip()]
    for s in settings:
        if s != "auto" and not (s.isdigit() and int(s) >= 1):
            raise SystemExit(f"--parallel-iterations: {s!r} is neither a positive int nor auto")
    baselines = [s.strip() for s in config["baselines"].split(",") if s.strip()]
    for s in baselines:
        if s not in ("reference", "flash"):
            raise SystemExit(f"--baselines: unknown {s!r}")
    config.update(profile=profile, settings=settings + baselines, ragged=args.ragged,
                  dtype=args.dtype, activation=args.activation,
                  memory_budget=args.memory_budget, tf32=args.tf32)
    return config


# ---------------------------------------------------------------------------------- child

def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _child(config, setting):
    """Runs one setting; returns a dict (printed as JSON by main)."""
    sys.path.insert(0, _REPO_ROOT)
    import numpy as np
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if config["tf32"] != "default":
        tf.config.experimental.enable_tensor_float_32_execution(config["tf32"] == "on")
    import tf_rnnt
    from tf_rnnt import reference, samplewise

    device = "/GPU:0" if gpus else "/CPU:0"
    batch, frames, labels_len = config["batch"], config["frames"], config["labels"]
    hidden, vocab = config["hidden"], config["vocab"]
    dtype = tf.as_dtype(config["dtype"])
    rng = np.random.default_rng(0)
    if config["ragged"]:
        logit_lengths = rng.integers((frames + 1) // 2, frames + 1, size=batch)
        label_lengths = rng.integers((labels_len + 1) // 2, labels_len + 1, size=batch)
        logit_lengths[0], label_lengths[0] = frames, labels_len
    else:
        logit_lengths = np.full(batch, frames)
        label_lengths = np.full(batch, labels_len)
    with tf.device(device):
        seeds = [[1, 2], [3, 4], [5, 6], [7, 8]]
        encoder = tf.cast(tf.random.stateless_normal([batch, frames, hidden], seeds[0]), dtype)
        predictor = tf.cast(tf.random.stateless_normal([batch, labels_len + 1, hidden],
                                                       seeds[1]), dtype)
        kernel = tf.cast(tf.random.stateless_normal([hidden, vocab], seeds[2])
                         / np.sqrt(hidden), dtype)
        bias = tf.cast(tf.random.stateless_normal([vocab], seeds[3]) * 0.1, dtype)
        labels = tf.random.stateless_uniform([batch, labels_len], [9, 10], minval=1,
                                             maxval=vocab, dtype=tf.int32)
        logit_lengths = tf.constant(logit_lengths, tf.int32)
        label_lengths = tf.constant(label_lengths, tf.int32)
    params = [encoder, predictor, kernel, bias]
    input_bytes = sum(int(np.prod(p.shape)) * p.dtype.size for p in params)

    if setting == "reference":
        def loss_fn(*a):
            return reference.flash_rnnt_loss(*a, activation=config["activation"])
    elif setting == "flash":
        if not tf_rnnt.ops.library_available():
            return {"status": "skipped: op library not built"}

        def loss_fn(*a):
            return tf_rnnt.flash_rnnt_loss(*a, activation=config["activation"])
    else:
        parallel_iterations = setting if setting == "auto" else int(setting)

        def loss_fn(*a):
            return tf_rnnt.samplewise_rnnt_loss(*a, activation=config["activation"],
                                                parallel_iterations=parallel_iterations,
                                                memory_budget=config["memory_budget"])

    @tf.function
    def step(encoder, predictor, kernel, bias):
        with tf.GradientTape() as tape:
            tape.watch([encoder, predictor, kernel, bias])
            costs = loss_fn(encoder, predictor, kernel, bias, labels, logit_lengths,
                            label_lengths)
            loss = tf.reduce_mean(costs)
        grads = tape.gradient(loss, [encoder, predictor, kernel, bias])
        return loss, tf.add_n([tf.reduce_sum(tf.cast(g, tf.float32)) for g in grads])

    result = {"status": "ok", "input_bytes": input_bytes, "device": device}
    if setting not in ("reference", "flash"):
        result["auto_choice"] = int(samplewise.auto_parallel_iterations(
            logit_lengths, label_lengths, hidden, vocab, config["memory_budget"]))
        result["working_set_bytes"] = float(samplewise.sample_working_set_bytes(
            logit_lengths, label_lengths, hidden, vocab))
    memory_device = device[1:]
    with tf.device(device):
        step.get_concrete_function(*params)  # trace outside the timed/measured region
        rss_base = _rss_bytes()
        start = time.perf_counter()
        loss, check = step(*params)
        loss = float(loss.numpy())
        result["first_call_s"] = time.perf_counter() - start
        # Tensor memory from TensorFlow's allocator (GPU or CPU), from after the first call
        # (whose graph optimization may hold temporary constants).
        tf.config.experimental.reset_memory_stats(memory_device)
        base = tf.config.experimental.get_memory_info(memory_device)["current"]
        for _ in range(config["warmup"]):
            step(*params)[0].numpy()
        times = []
        for _ in range(config["repeats"]):
            start = time.perf_counter()
            step(*params)[0].numpy()
            times.append(time.perf_counter() - start)
        peak = tf.config.experimental.get_memory_info(memory_device)["peak"]
    result.update(loss=loss, check=float(check.numpy()), times_s=times,
                  median_s=statistics.median(times) if times else None,
                  min_s=min(times) if times else None, peak_above_inputs_bytes=peak - base,
                  allocator_base_bytes=base)
    if not gpus:
        # The whole process (graphs, allocator caches, first call included).
        result["rss_growth_bytes"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
                                      - rss_base)
    if gpus:
        result["device_name"] = tf.config.experimental.get_device_details(gpus[0]).get(
            "device_name", "GPU")
        result["tf32"] = tf.config.experimental.tensor_float_32_execution_enabled()
    return result


# ---------------------------------------------------------------------------------- parent

def _mib(x):
    if x is None:
        return ""
    x /= 2 ** 20
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}"


def _markdown(config, rows, environment, command):
    lines = [f"# Sample-wise RNN-T: time and memory vs parallel_iterations ({config['profile']})",
             "",
             f"`{command}`", "",
             f"- B={config['batch']}, T={config['frames']}, U={config['labels']}, "
             f"H={config['hidden']}, V={config['vocab']}, {config['dtype']}, "
             f"activation {config['activation']}, "
             f"{'ragged lengths (half to full)' if config['ragged'] else 'all lengths full'}",
             f"- {environment}",
             f"- step = costs + gradients of their mean w.r.t. encoder, predictor, kernel, bias; "
             f"time: median (min) of {config['repeats']} steps after {config['warmup']} warm-up "
             f"step(s) and the first call, pooled over {config.get('rounds', 1)} round-robin "
             "round(s) of fresh processes; memory: peak above the inputs, gradients included "
             "(largest over the rounds)",
             ""]
    auto = next((r["result"].get("auto_choice") for r in rows
                 if r["result"].get("auto_choice") is not None), None)
    working = next((r["result"].get("working_set_bytes") for r in rows
                    if r["result"].get("working_set_bytes") is not None), None)
    if auto is not None:
        budget = config["memory_budget"]
        lines += [f"- \"auto\" picks parallel_iterations = **{auto}** here: estimated per-sample "
                  f"working set {_mib(working)} MiB, memory budget "
                  f"{'default 2048' if budget is None else _mib(budget)} MiB", ""]
    cpu = not any(r["result"].get("device_name") for r in rows)
    lines += ["| setting | parallel_iterations | step time median (min) [s] | first call [s] | "
              "peak above inputs [MiB] | inputs [MiB] |"
              + (" process RSS growth [MiB] |" if cpu else "") + " status |",
              "|---|---|---|---|---|---|" + ("---|" if cpu else "") + "---|"]
    for row in rows:
        r = row["result"]
        setting = row["setting"]
        if setting == "auto":
            name, p = "samplewise auto", f"auto -> {r.get('auto_choice', '?')}"
        elif setting in ("reference", "flash"):
            name = {"reference": "reference (batched, full logits)",
                    "flash": "flash op (compiled)"}[setting]
            p = "-"
        else:
            name, p = "samplewise", setting
        if r.get("status") == "ok":
            timing = f"{r['median_s']:.3f} ({r['min_s']:.3f})" if r["median_s"] else ""
            rss = f" {_mib(r.get('rss_growth_bytes'))} |" if cpu else ""
            lines.append(f"| {name} | {p} | {timing} | {r['first_call_s']:.2f} | "
                         f"{_mib(r['peak_above_inputs_bytes'])} | {_mib(r['input_bytes'])} |"
                         f"{rss} ok |")
        else:
            lines.append(f"| {name} | {p} | | | | |" + (" |" if cpu else "")
                         + f" {r.get('status', 'failed')} |")
    lines.append("")
    return "\n".join(lines)


def _environment(rows):
    import tensorflow as tf

    device = next((r["result"].get("device_name") for r in rows
                   if r["result"].get("device_name")), None)
    if device is None:
        device = f"CPU ({os.cpu_count()} cores, {platform.processor() or platform.machine()})"
    else:
        tf32 = next((r["result"]["tf32"] for r in rows if "tf32" in r["result"]), None)
        device += f", TF32 GEMMs {'on' if tf32 else 'off'}"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{device}; TensorFlow {tf.__version__}; Python {platform.python_version()}; "
            f"{datetime.date.today().isoformat()}; load average (1/5/15 min) at the last row: "
            f"{load}")


def _write(config, rows, command, out):
    text = _markdown(config, rows, _environment(rows), command)
    print(text, flush=True)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            f.write(text)
        with open(os.path.splitext(out)[0] + ".json", "w") as f:
            json.dump({"config": config, "command": command, "rows": rows}, f, indent=1)


def main(argv=None):
    args = _parse_args(argv)
    if args.child is not None:
        config = json.loads(os.environ["BENCH_SAMPLEWISE_CONFIG"])
        result = _child(config, args.child)
        print("RESULT " + json.dumps(result), flush=True)
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    has_gpu = bool(tf.config.list_physical_devices("GPU"))
    config = _resolve(args, has_gpu)
    if config["profile"] != "cpu" and not has_gpu:
        print(f"warning: profile {config['profile']} without a GPU will be very slow",
              file=sys.stderr)
    command = "python benchmarks/bench_samplewise.py " + " ".join(sys.argv[1:] if argv is None
                                                                  else argv)
    env = dict(os.environ, BENCH_SAMPLEWISE_CONFIG=json.dumps(config))
    deadline = time.monotonic() + args.time_budget
    config["rounds"] = args.rounds
    rows = [{"setting": setting, "runs": []} for setting in config["settings"]]
    for _, row in [(r, row) for r in range(args.rounds) for row in rows]:
        setting = row["setting"]
        left = deadline - time.monotonic()
        if left <= 0:
            if not row["runs"]:
                row["result"] = {"status": "not run (time budget)"}
            continue
        print(f"--- {setting}", file=sys.stderr, flush=True)
        try:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", setting],
                                  env=env, capture_output=True, text=True, timeout=left)
            lines = [s for s in proc.stdout.splitlines() if s.startswith("RESULT ")]
            if proc.returncode == 0 and lines:
                result = json.loads(lines[-1][len("RESULT "):])
            else:
                tail = (proc.stderr.strip().splitlines() or ["?"])[-1][:160]
                oom = "ResourceExhausted" in proc.stderr or proc.returncode in (-9, 137)
                result = {"status": ("out of memory: " if oom else "failed: ") + tail}
                sys.stderr.write(proc.stderr[-4000:])
        except subprocess.TimeoutExpired:
            result = {"status": "timed out (time budget)"}
        row["runs"].append(result)
        row["result"] = _pool(row["runs"])
        _write(config, [r for r in rows if "result" in r], command, args.out)


def _pool(runs):
    """One result from a setting's rounds: all timings pooled, the largest peak."""
    ok = [r for r in runs if r.get("status") == "ok"]
    if not ok:
        return runs[-1]
    pooled = dict(ok[-1])
    times = [t for r in ok for t in r["times_s"]]
    pooled.update(times_s=times, median_s=statistics.median(times), min_s=min(times),
                  first_call_s=min(r["first_call_s"] for r in ok), rounds=len(ok),
                  peak_above_inputs_bytes=max(r["peak_above_inputs_bytes"] for r in ok))
    if "rss_growth_bytes" in pooled:
        pooled["rss_growth_bytes"] = max(r["rss_growth_bytes"] for r in ok)
    return pooled


if __name__ == "__main__":
    main()
