#!/usr/bin/env python3
"""A flash step's latency when each step is waited for, and per step when steps run back to back.

  python benchmarks/step_latency.py --profiles short,medium,long
  python benchmarks/step_latency.py --libraries old.so,tf_rnnt/_tf_rnnt_ops.so --rounds 2

The step is bench_rnnt.py's: flash_rnnt_loss forward + backward (tiled) from projected encoder
and predictor outputs. "waited": the median of --repeats steps, each waited for (`.numpy()`), as
bench_rnnt.py times it. "back to back": --depth steps issued in a row and the last one waited
for, per step (the median of --repeats such runs). Host time that the GPU waits for shows in the
first; the second hides it behind the previous step's GPU work. Each library of --libraries (op
library files, TF_RNNT_LIBRARY) runs in a process of its own, in turn, --rounds times.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))


def _median_ms(run, repeats, steps_per_run=1):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) / steps_per_run)
    return statistics.median(times) * 1e3


def measure(profile, lengths, dtype, repeats, depth, warmup=3):
    """(waited ms, back-to-back ms per step) of the flash step at `profile`."""
    import tensorflow as tf

    sys.path.insert(0, _HERE)
    import bench_rnnt

    p = bench_rnnt.PROFILES[profile]
    inputs, _ = bench_rnnt.make_inputs(p["B"], p["T"], p["U"], p["H"], p["V"], tf.as_dtype(dtype),
                                       ragged=lengths == "ragged")
    step = bench_rnnt.joint_step("tiled", inputs)

    def back_to_back():
        for _ in range(depth):
            result = step()
        result.numpy()

    for _ in range(warmup):
        step().numpy()
    waited = _median_ms(lambda: step().numpy(), repeats)
    back_to_back()
    return waited, _median_ms(back_to_back, repeats, depth)


def _child(args):
    for profile in args.profiles.split(","):
        waited, pipelined = measure(profile, args.lengths, args.dtype, args.repeats, args.depth)
        print(json.dumps(dict(profile=profile, waited_ms=waited, back_to_back_ms=pipelined)),
              flush=True)


def run(args):
    """Rows (library, profile, [waited ms per round], [back-to-back ms per round])."""
    libraries = args.libraries.split(",") if args.libraries else [""]
    results = {}
    for _ in range(args.rounds):
        for library in libraries:
            env = dict(os.environ)
            if library:
                env["TF_RNNT_LIBRARY"] = os.path.abspath(library)
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--profiles",
                   args.profiles, "--lengths", args.lengths, "--dtype", args.dtype,
                   "--repeats", str(args.repeats), "--depth", str(args.depth)]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            for line in proc.stdout.splitlines():
                if line.startswith("{"):
                    row = json.loads(line)
                    waited, pipelined = results.setdefault((library, row["profile"]), ([], []))
                    waited.append(row["waited_ms"])
                    pipelined.append(row["back_to_back_ms"])
    return [(lib, prof, w, b) for (lib, prof), (w, b) in results.items()]


def table(rows, args):
    fmt = " / ".join
    lines = [f"flash step, {args.lengths} lengths, {args.dtype}; per round: the median of "
             f"{args.repeats} steps waited for each, and of {args.repeats} runs of {args.depth} "
             "steps back to back (per step)", "",
             "| library | profile | waited | back to back |", "|---|---|---|---|"]
    for library, profile, waited, pipelined in rows:
        lines.append(f"| {library or 'default'} | {profile} | "
                     f"{fmt(f'{t:.2f}' for t in waited)} ms | "
                     f"{fmt(f'{t:.2f}' for t in pipelined)} ms |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profiles", default="short,medium,long",
                        help="comma-separated profiles of bench_rnnt.py")
    parser.add_argument("--lengths", default="full", choices=["full", "ragged"])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--libraries", default="",
                        help="comma-separated op library files (default: the one tf_rnnt loads)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--depth", type=int, default=5, help="steps issued back to back")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return
    print(table(run(args), args))


if __name__ == "__main__":
    main()
