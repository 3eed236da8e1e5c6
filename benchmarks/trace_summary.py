#!/usr/bin/env python3
"""Where a traced training step spends its time: a TensorFlow profiler trace summed by layer.

  python benchmarks/bench_model.py --profile /tmp/prof ...      # records DIR/<run>/...xplane.pb
  python benchmarks/trace_summary.py /tmp/prof/flash_mixed_bfloat16_fit1 --steps 3

On a GPU the kernels on the device's streams are summed by the TensorFlow op that launched them
(the profiler's `tf_op` statistic); on a CPU the executor's op events are summed. Each op's name
path is cut to its layer (`--depth` components after the model, gradient ops counted with the
layer whose gradient they are, digits folded so the 16 blocks of a Conformer form one row). The
sums are GPU (or CPU-thread) busy time: overlapping streams or threads count twice.

  python benchmarks/bench_rnnt.py --suite flash --profile medium --lengths full \
      --methods tiled-fused --dtypes bfloat16 --trace /tmp/trace
  python benchmarks/trace_summary.py /tmp/trace/medium_full_bfloat16_tiled-fused --idle

`--idle` shows instead when the GPU runs nothing: the trace's device activities (kernels, memsets,
copies on every stream) cut into steps after each device-to-host copy (a benchmark step ends by
copying its result back), and per step the span from its first activity to that copy, the time
some activity runs, the rest (idle), and the activities that the longest gaps wait for.
"""

import argparse
import collections
import glob
import os
import re
import sys

_WRAPPERS = re.compile(r"^(StatefulPartitionedCall|PartitionedCall|gradient_tape|while|cond|"
                       r"body|__inference.*|multi_step_on_iterator|one_step_on_data.*)(_\d+)?$")


def layer_key(op_name, depth=2):
    """`("backward" | "forward", layer path)` of an op name such as
    `StatefulPartitionedCall/gradient_tape/model/conformer_block_3/ffn/MatMul:MatMul`."""
    path = op_name.split(":")[0].split("/")
    backward = "gradient_tape" in path or any(p.startswith("gradients") for p in path)
    parts = [p for p in path[:-1] if not _WRAPPERS.match(p) and not p.startswith("gradients")]
    if not parts:
        return ("backward" if backward else "forward"), "(other)"
    if parts[0].startswith(("adam", "sgd", "optimizer", "Adam")):
        return "update", "optimizer"
    key = "/".join(re.sub(r"\d+", "*", p) for p in parts[1:1 + depth]) or parts[0]
    return ("backward" if backward else "forward"), key


def _load_space(path):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    return space


def _stream_lines(space):
    """(plane, line) of each GPU stream; the derived per-op and per-step lines repeat their
    time."""
    for plane in space.planes:
        if plane.name.startswith("/device:GPU:"):
            for line in plane.lines:
                if line.name.startswith("Stream #"):
                    yield plane, line


def _events(path):
    """(op name, seconds) per device kernel, or per host op event without a GPU plane."""
    space = _load_space(path)
    gpu_planes = [p for p in space.planes if p.name.startswith("/device:GPU:")]
    for plane, line in _stream_lines(space):
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        for event in line.events:
            op = ""
            for stat in event.stats:
                if stat_names.get(stat.metadata_id) == "tf_op":
                    op = stat.str_value or stat_names.get(stat.ref_value, "")
            name = op or plane.event_metadata[event.metadata_id].name
            yield plane.name, name, event.duration_ps * 1e-12
    if gpu_planes:
        return
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" in name and "::" not in name:
                    yield plane.name, name, event.duration_ps * 1e-12


def _trace_files(trace_dir):
    files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))
    if not files:
        raise SystemExit(f"no *.xplane.pb under {trace_dir}")
    return files


def device_activities(space):
    """Sorted (start ps, end ps, name) of every activity on a GPU plane's streams."""
    found = set()
    for plane, line in _stream_lines(space):
        for event in line.events:
            start = line.timestamp_ns * 1000 + event.offset_ps
            found.add((start, start + event.duration_ps,
                       plane.event_metadata[event.metadata_id].name))
    return sorted(found)


def idle_steps(activities):
    """Per step (the activities up to and including a device-to-host copy): (span, busy, gaps),
    in ps; busy is the union of the activities' intervals, gaps lists (idle ps, name of the
    activity that ends it)."""
    steps, current = [], []
    for activity in activities:
        current.append(activity)
        if "MemcpyD2H" in activity[2] or "DtoH" in activity[2]:
            steps.append(current)
            current = []
    result = []
    for step in steps:
        end, busy, gaps = step[0][0], 0, []
        for start, stop, name in step:
            if start > end:
                gaps.append((start - end, name))
            busy += max(0, stop - max(start, end))
            end = max(end, stop)
        result.append((end - step[0][0], busy, gaps))
    return result


def idle_summary(trace_dir, top=8):
    activities = []
    for path in _trace_files(trace_dir):
        activities += device_activities(_load_space(path))
    steps = idle_steps(sorted(activities))
    if not steps:
        return f"{trace_dir}: no GPU activity ending in a device-to-host copy"
    lines = [f"{trace_dir}: {len(steps)} steps", "",
             "| step | span | busy | idle | activities after the longest gaps |",
             "|---|---|---|---|---|"]
    for k, (span, busy, gaps) in enumerate(steps):
        longest = sorted(gaps, reverse=True)[:3]
        after = "; ".join(f"{g / 1e6:.0f} us: {n.split('(')[0][:48]}" for g, n in longest)
        lines.append(f"| {k} | {span / 1e9:.2f} ms | {busy / 1e9:.2f} ms | "
                     f"{(span - busy) / 1e9:.2f} ms | {after} |")
    by_name = collections.Counter()
    for _, _, gaps in steps:
        for g, n in gaps:
            by_name[n.split("(")[0][:70]] += g
    lines.append("")
    lines.append("Idle per step before: " + ", ".join(
        f"{n} {g / len(steps) / 1e9:.3f} ms" for n, g in by_name.most_common(top)))
    return "\n".join(lines)


def _layer_totals(trace_dir, depth):
    totals = collections.defaultdict(float)
    devices = set()
    for path in _trace_files(trace_dir):
        for device, name, seconds in _events(path):
            devices.add(device)
            totals[layer_key(name, depth)] += seconds
    return totals, devices


def layer_seconds(trace_dir, steps=1, depth=1):
    """`{(pass, layer): seconds per step}` of a trace of `steps` steps, summed over its devices
    (GPU streams, or the CPU's executor threads without a GPU): what `summarize` tabulates."""
    totals, _ = _layer_totals(trace_dir, depth)
    return {key: seconds / steps for key, seconds in totals.items()}


def summarize(trace_dir, steps=1, depth=2, top=25):
    totals, devices = _layer_totals(trace_dir, depth)
    per_device = 1.0 / (steps * max(1, len(devices)))
    total = sum(totals.values()) * per_device
    lines = [f"{trace_dir}: {', '.join(sorted(devices))}; busy time per step and device "
             f"{total * 1e3:.1f} ms ({steps} steps)", "",
             "| pass | layer | ms per step | share |", "|---|---|---|---|"]
    by_pass = collections.defaultdict(float)
    for (pass_, key), seconds in totals.items():
        by_pass[pass_] += seconds
    rows = sorted(totals.items(), key=lambda kv: -kv[1])
    for (pass_, key), seconds in rows[:top]:
        ms = seconds * per_device * 1e3
        lines.append(f"| {pass_} | {key} | {ms:.1f} | {ms / (total * 1e3):.1%} |")
    rest = sum(s for _, s in rows[top:]) * per_device * 1e3
    if rest:
        lines.append(f"| | ({len(rows) - top} more) | {rest:.1f} | {rest / (total * 1e3):.1%} |")
    lines.append("")
    lines.append("By pass: " + ", ".join(f"{p} {s * per_device * 1e3:.1f} ms"
                                         for p, s in sorted(by_pass.items())))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace_dir", nargs="+")
    parser.add_argument("--steps", type=int, default=3, help="steps in the trace")
    parser.add_argument("--depth", type=int, default=1, help="layer path components kept")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--idle", action="store_true",
                        help="the GPU's idle time per step instead of the busy time by layer")
    args = parser.parse_args(argv)
    for trace_dir in args.trace_dir:
        if args.idle:
            print(idle_summary(trace_dir))
        else:
            print(summarize(trace_dir, args.steps, args.depth, args.top))
        print()


if __name__ == "__main__":
    sys.exit(main())
