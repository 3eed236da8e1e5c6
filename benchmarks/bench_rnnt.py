#!/usr/bin/env python3
"""Speed and memory of tf_rnnt's ops against the pure-TensorFlow reference.

  python benchmarks/bench_rnnt.py --suite loss    # rnnt_loss vs reference.rnnt_loss
  python benchmarks/bench_rnnt.py --suite flash   # flash tiled/untiled vs reference
  python benchmarks/bench_rnnt.py --suite scaling # time/memory vs T*U and tile size
  python benchmarks/bench_rnnt.py --suite tdt     # flash_tdt_loss vs flash_rnnt_loss
  python benchmarks/bench_rnnt.py --suite all --out /tmp/rnnt_h200.md

The flash suite runs each profile with all lengths full (the headline: every lattice node is
real work) and with ragged lengths (uniform in [T/2, T] and [U/2, U], about 56% of the nodes);
--lengths picks one of them. --methods takes tiled, untiled, reference, and tiled-cublas /
tiled-fused: the tiled op on one GPU kernel path (its gpu_kernel option).

Each case times forward + backward inside one tf.function: the median of --repeats runs after
--warmup runs, each ending in a host read of the result. Peak memory is
tf.config.experimental.get_memory_info(...)["peak"] after a reset, minus the memory held
before the step (inputs and weights): "peak above the inputs". On the CPU it reports
ru_maxrss growth instead. GEMM rates count the four GEMMs of the fused joint (forward,
recompute, d joint, d kernel): 4 * 2 * N * H * V flops, N = valid lattice nodes.

The tdt suite (also `--loss tdt`) times flash_tdt_loss (durations --durations, a kernel of V + D
columns) beside flash_rnnt_loss at the same shape, method and dtype, in one run, and the
pure-TensorFlow reference of the TDT loss (full logits) where it fits.

--trace DIR records a TensorFlow profiler trace of --trace-steps more runs of each flash case in
DIR/<profile>_<lengths>_<dtype>_<method>/; `benchmarks/trace_summary.py --idle` reads it.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from report import fmt_bytes, fmt_rate  # noqa: E402

import tf_rnnt  # noqa: E402
from tf_rnnt import reference  # noqa: E402

PROFILES = {
    "short": dict(B=32, T=128, U=32, H=640, V=1025),
    "medium": dict(B=32, T=400, U=128, H=640, V=1025),
    "long": dict(B=32, T=800, U=256, H=640, V=1025),
    "cpu": dict(B=4, T=60, U=20, H=128, V=257),
    # The speech example's CPU default: a batch of 4 s utterances (40 ms frames), characters.
    "speech": dict(B=32, T=100, U=40, H=192, V=29),
}


def device_name():
    return "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"


def memory_now():
    if device_name().startswith("GPU"):
        return tf.config.experimental.get_memory_info("GPU:0")["current"]
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak():
    if device_name().startswith("GPU"):
        tf.config.experimental.reset_memory_stats("GPU:0")


def peak():
    if device_name().startswith("GPU"):
        return tf.config.experimental.get_memory_info("GPU:0")["peak"]
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def time_fn(fn, warmup, repeats):
    for _ in range(warmup):
        fn().numpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn().numpy()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(step, warmup, repeats):
    """(median seconds, peak bytes above what was allocated before the first call)."""
    base = memory_now()
    reset_peak()
    step().numpy()
    used = peak() - base
    seconds = time_fn(step, warmup, repeats)
    return seconds, used


def record_trace(step, directory, steps):
    """A TensorFlow profiler trace of `steps` more runs of a warmed-up step, in `directory`."""
    tf.profiler.experimental.start(directory)
    try:
        for _ in range(steps):
            step().numpy()
    finally:
        tf.profiler.experimental.stop()


def make_inputs(B, T, U, H, V, dtype, seed=0, ragged=True, durations=0):
    """The joint's inputs; `durations` > 0 adds that many duration columns to the output layer
    (a TDT joint: kernel [H, V + D], labels in [1, V))."""
    rng = np.random.default_rng(seed)
    logit_lengths = np.full([B], T, np.int32)
    label_lengths = np.full([B], U, np.int32)
    if ragged:  # the first sample keeps the maximum so shapes stay as profiled
        logit_lengths[1:] = rng.integers(T // 2, T + 1, B - 1)
        label_lengths[1:] = rng.integers(U // 2, U + 1, B - 1)
    with tf.device(device_name()):
        enc = tf.constant(rng.normal(0, 0.5, (B, T, H)), dtype)
        pred = tf.constant(rng.normal(0, 0.5, (B, U + 1, H)), dtype)
        kernel = tf.constant(rng.normal(0, 1 / np.sqrt(H), (H, V + durations)), dtype)
        bias = tf.constant(np.zeros(V + durations), dtype)
        labels = tf.constant(rng.integers(1, V, (B, U)), tf.int32)
        tl = tf.constant(logit_lengths)
        ul = tf.constant(label_lengths)
    nodes = int(np.sum(logit_lengths.astype(np.int64) * (label_lengths + 1)))
    return (enc, pred, kernel, bias, labels, tl, ul), nodes


def joint_step(method, args, durations=None, **kw):
    """Forward + backward of flash_rnnt_loss (or with `durations`, flash_tdt_loss) by `method`:
    "tiled", "untiled" or "reference"."""
    enc, pred, kernel, bias, labels, tl, ul = args

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            tape.watch([enc, pred, kernel, bias])
            if durations is not None:
                if method == "reference":
                    costs = reference.flash_tdt_loss(enc, pred, kernel, bias, labels, tl, ul,
                                                     durations)
                else:
                    costs = tf_rnnt.flash_tdt_loss(enc, pred, kernel, bias, labels, tl, ul,
                                                   durations, mode=method, **kw)
            elif method == "reference":
                costs = reference.flash_rnnt_loss(enc, pred, kernel, bias, labels, tl, ul)
            else:
                costs = tf_rnnt.flash_rnnt_loss(
                    enc, pred, kernel, bias, labels, tl, ul, mode=method, **kw
                )
            loss = tf.reduce_sum(costs)
        grads = tape.gradient(loss, [enc, pred, kernel, bias])
        return loss + sum(tf.cast(tf.reduce_sum(g), tf.float32) for g in grads)

    return step


def matmul_rate(dtype, n=8192, repeats=10):
    """Measured dense GEMM rate (flop/s) of tf.matmul in `dtype` on n x n x n."""
    with tf.device(device_name()):
        a = tf.random.normal([n, n], dtype=tf.float32)
        a = tf.cast(a, dtype)
        b = tf.cast(tf.random.normal([n, n]), dtype)

    @tf.function
    def mm():
        c = a
        for _ in range(4):
            c = tf.matmul(c, b) * tf.cast(1e-2, dtype)
        return tf.reduce_sum(tf.cast(c[:1, :1], tf.float32))

    seconds = time_fn(mm, 2, repeats)
    return 4 * 2 * n**3 / seconds


def suite_loss(args, lines, results):
    p = dict(PROFILES["medium"] if args.profile == "auto" else PROFILES[args.profile])
    B, T, U, V = p["B"], p["T"], p["U"], p["V"]
    rng = np.random.default_rng(0)
    with tf.device(device_name()):
        logits = tf.constant(rng.normal(size=(B, T, U + 1, V)).astype(np.float32))
        labels = tf.constant(rng.integers(1, V, (B, U)).astype(np.int32))
        tl = tf.constant(np.full([B], T, np.int32))
        ul = tf.constant(np.full([B], U, np.int32))

    def step_for(fn):
        @tf.function
        def step():
            with tf.GradientTape() as tape:
                tape.watch(logits)
                loss = tf.reduce_sum(fn(logits, labels, tl, ul))
            return loss + tf.reduce_sum(tape.gradient(loss, logits))
        return step

    lines.append(f"\n### rnnt_loss on logits, B={B} T={T} U={U} V={V} float32 ({device_name()})\n")
    lines.append("| implementation | time (median) | peak above inputs |")
    lines.append("|---|---|---|")
    rows = {}
    for name, fn in (("tf_rnnt.rnnt_loss", tf_rnnt.rnnt_loss),
                     ("tf_rnnt.reference.rnnt_loss", reference.rnnt_loss)):
        seconds, used = measure(step_for(fn), args.warmup, args.repeats)
        rows[name] = (seconds, used)
        lines.append(f"| {name} | {seconds * 1e3:.1f} ms | {fmt_bytes(used)} |")
        print(lines[-1], flush=True)
    (ts, ms), (tr, mr) = rows["tf_rnnt.rnnt_loss"], rows["tf_rnnt.reference.rnnt_loss"]
    lines.append(f"\nspeed-up {tr / ts:.1f}x, memory ratio {ms / mr:.2f}")
    results["loss"] = {k: {"seconds": v[0], "peak_bytes": v[1]} for k, v in rows.items()}


def suite_flash(args, lines, results):
    profiles = ["short", "medium", "long"] if args.profile == "auto" else [args.profile]
    dtypes = [tf.as_dtype(d) for d in args.dtypes.split(",")] if args.dtypes else (
        [tf.float32, tf.bfloat16] if device_name().startswith("GPU") else [tf.float32])
    rates = {}
    if device_name().startswith("GPU"):
        for dt in dtypes:
            rates[dt.name] = matmul_rate(dt)
        tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
        results.setdefault("meta", {})["matmul_tflops"] = {
            k: round(v / 1e12, 1) for k, v in rates.items()}
        lines.append(
            "\nMeasured tf.matmul rate (8192^3): "
            + ", ".join(f"{k}: {v / 1e12:.0f} TFLOP/s" for k, v in rates.items())
            + f" (float32 with TF32 {'on' if tf32 else 'off'})"
        )
    lines.append(f"\n### flash_rnnt_loss forward+backward ({device_name()})\n")
    lines.append(
        "| profile | lengths | dtype | method | time | peak above inputs | GEMM rate (4 GEMMs) "
        "| vs reference |"
    )
    lines.append("|---|---|---|---|---|---|---|---|")
    results["flash"] = []
    length_kinds = ["full", "ragged"] if args.lengths == "both" else [args.lengths]
    for prof, lengths, dt in [(p, k, d) for p in profiles for k in length_kinds for d in dtypes]:
        p = PROFILES[prof]
        inputs, nodes = make_inputs(p["B"], p["T"], p["U"], p["H"], p["V"], dt,
                                    ragged=lengths == "ragged")
        flops = 4 * 2 * nodes * p["H"] * p["V"]
        ref = None
        for method in args.methods.split(","):
            if method == "reference" and prof == "long" and not args.long_reference:
                continue
            # "tiled-fused" / "tiled-cublas": the tiled op on one GPU kernel path.
            mode, _, kernel_path = method.partition("-")
            options = {} if mode == "reference" else dict(gpu_kernel=kernel_path or "auto")
            try:
                step = joint_step(mode, inputs, **options)
                seconds, used = measure(step, args.warmup, args.repeats)
                if args.trace:
                    record_trace(step, os.path.join(
                        args.trace, f"{prof}_{lengths}_{dt.name}_{method}"), args.trace_steps)
            except tf.errors.ResourceExhaustedError:
                lines.append(f"| {prof} | {lengths} | {dt.name} | {method} | OOM | | | |")
                continue
            except tf.errors.InvalidArgumentError as e:  # no fused kernel for this case
                lines.append(f"| {prof} | {lengths} | {dt.name} | {method} | n/a: "
                             f"{e.message.splitlines()[0][:60]} | | | |")
                continue
            if method == "reference":
                ref = (seconds, used)
            rate = flops / seconds
            frac = f" ({rate / rates[dt.name] * 100:.0f}% of matmul)" if dt.name in rates else ""
            row = dict(profile=prof, lengths=lengths, dtype=dt.name, method=method, seconds=seconds,
                       peak_bytes=used, nodes=nodes, gemm_flops=flops)
            results["flash"].append(row)
            lines.append(
                f"| {prof} | {lengths} | {dt.name} | {method} | {seconds * 1e3:.1f} ms "
                f"| {fmt_bytes(used)} "
                f"| {fmt_rate(rate)}{frac} | |"
            )
            print(lines[-1], flush=True)
        if ref:
            for row in results["flash"]:
                if (row["profile"], row["lengths"], row["dtype"]) == (prof, lengths, dt.name) \
                        and row["method"] != "reference":
                    # On the CPU the process's high-water mark only grows: a later case
                    # shows no growth, so there is no ratio to give.
                    memory = (f"1/{ref[1] / row['peak_bytes']:.0f} of reference memory"
                              if ref[1] > 0 and row["peak_bytes"] > 0 else "-")
                    lines.append(
                        f"| {prof} | {lengths} | {dt.name} | {row['method']} vs reference | "
                        f"{ref[0] / row['seconds']:.2f}x the reference's speed | {memory} | | |"
                    )


def suite_tdt(args, lines, results):
    """flash_tdt_loss beside flash_rnnt_loss, same shape, dtype and method, in one run."""
    profiles = ["short", "medium", "long"] if args.profile == "auto" else [args.profile]
    dtypes = [tf.as_dtype(d) for d in args.dtypes.split(",")] if args.dtypes else (
        [tf.float32, tf.bfloat16] if device_name().startswith("GPU") else [tf.float32])
    durations = [int(d) for d in args.durations.split(",")]
    lines.append(f"\n### flash_tdt_loss (durations {durations}) and flash_rnnt_loss, "
                 f"forward+backward ({device_name()})\n")
    lines.append("| profile | lengths | dtype | method | RNN-T time | TDT time | TDT / RNN-T "
                 "| RNN-T peak | TDT peak |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    results["tdt"] = []
    length_kinds = ["full", "ragged"] if args.lengths == "both" else [args.lengths]
    methods = [m for m in args.methods.split(",")]
    for prof, lengths, dt in [(p, k, d) for p in profiles for k in length_kinds for d in dtypes]:
        p = PROFILES[prof]
        shape = (p["B"], p["T"], p["U"], p["H"], p["V"], dt)
        rnnt_inputs, nodes = make_inputs(*shape, ragged=lengths == "ragged")
        tdt_inputs, _ = make_inputs(*shape, ragged=lengths == "ragged",
                                    durations=len(durations))
        for method in methods:
            if method == "reference" and prof == "long" and not args.long_reference:
                continue
            mode, _, kernel_path = method.partition("-")
            options = {} if mode == "reference" else dict(gpu_kernel=kernel_path or "auto")
            row = dict(profile=prof, lengths=lengths, dtype=dt.name, method=method,
                       durations=durations, nodes=nodes)
            for loss, inputs, extra in (("rnnt", rnnt_inputs, {}),
                                        ("tdt", tdt_inputs, dict(durations=durations))):
                try:
                    seconds, used = measure(joint_step(mode, inputs, **extra, **options),
                                            args.warmup, args.repeats)
                except (tf.errors.ResourceExhaustedError, tf.errors.InvalidArgumentError) as e:
                    seconds, used = None, None
                    row[f"{loss}_error"] = type(e).__name__
                row[f"{loss}_seconds"], row[f"{loss}_peak_bytes"] = seconds, used
            results["tdt"].append(row)
            ratio = (f"{row['tdt_seconds'] / row['rnnt_seconds']:.2f}x"
                     if row["tdt_seconds"] and row["rnnt_seconds"] else "-")
            cells = [f"{row[k] * 1e3:.1f} ms" if row[k] else row.get(k.replace("seconds", "error"))
                     for k in ("rnnt_seconds", "tdt_seconds")]
            lines.append(f"| {prof} | {lengths} | {dt.name} | {method} | {cells[0]} | {cells[1]} "
                         f"| {ratio} | {fmt_bytes(row['rnnt_peak_bytes'] or 0)} "
                         f"| {fmt_bytes(row['tdt_peak_bytes'] or 0)} |")
            print(lines[-1], flush=True)


def suite_scaling(args, lines, results):
    gpu = device_name().startswith("GPU")
    base = PROFILES["medium"] if gpu else PROFILES["cpu"]
    lines.append(f"\n### Scaling with T*U (tiled, default tile, float32, {device_name()})\n")
    lines.append("| T | U | nodes | time | peak above inputs |")
    lines.append("|---|---|---|---|---|")
    results["scaling_tu"] = []
    for scale in (0.25, 0.5, 1.0, 2.0):
        T, U = max(2, int(base["T"] * scale ** 0.5)), max(1, int(base["U"] * scale ** 0.5))
        inputs, nodes = make_inputs(base["B"], T, U, base["H"], base["V"], tf.float32, ragged=False)
        seconds, used = measure(joint_step("tiled", inputs), args.warmup, args.repeats)
        results["scaling_tu"].append(dict(T=T, U=U, nodes=nodes, seconds=seconds, peak_bytes=used))
        lines.append(f"| {T} | {U} | {nodes} | {seconds * 1e3:.1f} ms | {fmt_bytes(used)} |")
        print(lines[-1], flush=True)
    lines.append(
        f"\n### Tile size (tiled, B={base['B']} T={base['T']} U={base['U']}, {device_name()})\n"
    )
    lines.append("| dtype | tile_size (nodes) | time | peak above inputs |")
    lines.append("|---|---|---|---|")
    results["scaling_tile"] = []
    tile_dtypes = args.dtypes.split(",") if args.dtypes else ["float32"]
    for dtype in tile_dtypes:
        inputs, nodes = make_inputs(base["B"], base["T"], base["U"], base["H"], base["V"],
                                    tf.as_dtype(dtype))
        for tile in (4096, 16384, 32768, 65536, 131072, 262144) if gpu else (256, 1024, 4096):
            seconds, used = measure(joint_step("tiled", inputs, tile_size=tile), args.warmup,
                                    args.repeats)
            results["scaling_tile"].append(dict(dtype=dtype, tile=tile, seconds=seconds,
                                                peak_bytes=used))
            lines.append(f"| {dtype} | {tile} | {seconds * 1e3:.1f} ms | {fmt_bytes(used)} |")
            print(lines[-1], flush=True)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--suite", choices=["loss", "flash", "scaling", "tdt", "all"],
                        default="all")
    parser.add_argument("--loss", choices=["rnnt", "tdt"], default="rnnt",
                        help="tdt: the tdt suite (flash_tdt_loss beside flash_rnnt_loss)")
    parser.add_argument("--durations", default="0,1,2,3,4", help="tdt suite: TDT durations")
    parser.add_argument("--profile", default="auto", choices=["auto"] + list(PROFILES))
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--long-reference", action="store_true", help="also run the reference at 'long'"
    )
    parser.add_argument("--methods", default="tiled,untiled,reference",
                        help="flash suite: comma-separated subset of tiled,untiled,reference,"
                        "tiled-cublas,tiled-fused")
    parser.add_argument(
        "--dtypes",
        default=None,
        help="flash suite and tile table: comma-separated dtypes (default: float32, "
        "plus bfloat16 on the GPU)",
    )
    parser.add_argument("--lengths", default="both", choices=["full", "ragged", "both"],
                        help="flash suite: all lengths full, ragged, or both (default)")
    parser.add_argument("--trace", default=None,
                        help="flash suite: directory for profiler traces of each case")
    parser.add_argument("--trace-steps", type=int, default=3)
    parser.add_argument("--out", help="markdown file to write (a .json beside it too)")
    args = parser.parse_args()
    gpu_name = ""
    if device_name().startswith("GPU"):
        gpu = tf.config.list_physical_devices("GPU")[0]
        details = tf.config.experimental.get_device_details(gpu)
        gpu_name = f": {details.get('device_name')}"
    lines = [
        f"# tf_rnnt benchmarks ({time.strftime('%Y-%m-%d')}, TensorFlow {tf.__version__}, "
        f"device {device_name()}{gpu_name})"
    ]
    # What benchmarks/report.py needs to render the results without this run's markdown.
    results = {"meta": {"device": gpu_name[2:] or "CPU", "tensorflow": tf.__version__,
                        "date": time.strftime("%Y-%m-%d"),
                        "command": "python benchmarks/bench_rnnt.py " + " ".join(sys.argv[1:])}}
    suites = ["loss", "flash", "scaling", "tdt"] if args.suite == "all" else [args.suite]
    if args.loss == "tdt":
        suites = ["tdt"]
    for suite in suites:
        {"loss": suite_loss, "flash": suite_flash, "scaling": suite_scaling,
         "tdt": suite_tdt}[suite](
            args, lines, results
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
