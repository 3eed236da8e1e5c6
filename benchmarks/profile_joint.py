#!/usr/bin/env python3
"""Per-kernel GPU time of one flash_rnnt_loss forward+backward step, under Nsight Compute.

  ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \\
      --csv --page raw python benchmarks/profile_joint.py --dtype bfloat16 > prof.csv
  python benchmarks/profile_joint.py --summarize prof.csv

Lengths are full (every sample at the profile's T and U, as in the headline benchmark) unless
--lengths ragged. The step is warmed up first; only the third run lies between
cudaProfilerStart and cudaProfilerStop. The summary adds the kernels' durations by name (ncu
serializes kernels, so their sum is the step's GPU time without overlap or launch gaps).
"""

import argparse
import collections
import csv
import ctypes
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def summarize(path, top=None):
    text = open(path).read()
    start = text.find('"ID"')
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    totals = collections.defaultdict(lambda: [0.0, 0])
    for row in rows:
        value = row.get("gpu__time_duration.sum", "")
        try:
            ns = float(value.replace(",", ""))
        except ValueError:  # the units row
            continue
        name = row["Kernel Name"].replace("(anonymous namespace)::", "").replace("void ", "")
        name = name.split("(")[0]
        totals[name][0] += ns
        totals[name][1] += 1
    total = sum(v[0] for v in totals.values())
    print(f"{'kernel':60s} {'calls':>6s} {'ms':>9s} {'share':>6s}")
    for name, (ns, calls) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{name[:60]:60s} {calls:6d} {ns / 1e6:9.3f} {ns / total * 100:5.1f}%")
    print(f"{'total':60s} {sum(v[1] for v in totals.values()):6d} {total / 1e6:9.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="medium")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--mode", default="tiled")
    parser.add_argument("--lengths", choices=["full", "ragged"], default="full",
                        help="every sample at the profile's T and U (the headline), or ragged")
    parser.add_argument("--tile-size", type=int, default=None)
    parser.add_argument("--summarize", help="ncu CSV to summarize (no GPU run)")
    parser.add_argument("--top", type=int, default=None, help="summary: the N longest kernels")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize, args.top)
        return
    import bench_rnnt
    import tensorflow as tf

    p = bench_rnnt.PROFILES[args.profile]
    inputs, _ = bench_rnnt.make_inputs(p["B"], p["T"], p["U"], p["H"], p["V"],
                                       tf.as_dtype(args.dtype), ragged=args.lengths == "ragged")
    kw = {"tile_size": args.tile_size} if args.tile_size else {}
    step = bench_rnnt.joint_step(args.mode, inputs, **kw)
    step().numpy()
    step().numpy()
    cudart = ctypes.CDLL("libcudart.so.12")
    cudart.cudaDeviceSynchronize()
    cudart.cudaProfilerStart()
    step().numpy()
    cudart.cudaDeviceSynchronize()
    cudart.cudaProfilerStop()


if __name__ == "__main__":
    main()
