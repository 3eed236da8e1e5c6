"""benchmarks/trace_summary.py: profiler traces summed by layer."""

import os
import re
import subprocess
import sys

import pytest
import trace_summary

_BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REPO_ROOT = os.path.dirname(_BENCHMARKS)


@pytest.mark.parametrize("name, depth, expected", [
    ("StatefulPartitionedCall/conformer/conformer_block_3/ffn/MatMul:MatMul", 1,
     ("forward", "conformer_block_*")),
    ("StatefulPartitionedCall/conformer/encoder/block12/ffn_1/MatMul:MatMul", 3,
     ("forward", "encoder/block*/ffn_*")),
    ("StatefulPartitionedCall/gradient_tape/conformer/joint/MatMul_1:MatMul", 1,
     ("backward", "joint")),
    ("StatefulPartitionedCall/adam/Sub_198/ReadVariableOp:ReadVariableOp", 1,
     ("update", "optimizer")),
    ("Add_1:AddV2", 1, ("forward", "(other)")),
])
def test_layer_key(name, depth, expected):
    assert trace_summary.layer_key(name, depth) == expected


@pytest.mark.slow
def test_summary_of_a_cpu_trace(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([_REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
    bench = os.path.join(_BENCHMARKS, "bench_model.py")
    proc = subprocess.run(
        [sys.executable, bench, "--tiny", "--variants", "flash", "--dtypes", "float32",
         "--skip-batch-search", "--profile", str(tmp_path / "prof"), "--profile-steps", "2",
         "--out", str(tmp_path / "model.md")],
        env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = trace_summary.summarize(str(tmp_path / "prof" / "flash_float32_fit1"), steps=2)
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| (forward|backward|update) \| (.+?) \| ([\d.]+) \|", line)
        if m:
            rows[(m.group(1), m.group(2))] = float(m.group(3))
    # The step's parts: the loss op forward and backward, the joint, the optimizer update.
    assert any(k[1] == "flash_rnnt_loss" for k in rows), text
    assert ("update", "optimizer") in rows, text
    assert any(k[0] == "backward" for k in rows), text
    total = float(re.search(r"per step and device ([\d.]+) ms", text).group(1))
    assert 0 < max(rows.values()) <= total + 0.05


_US = 10**6  # picoseconds


def _synthetic_space():
    """Two steps on a GPU: kernels on a compute stream whose line starts 1 us in, result copies
    on a copy stream, a derived line and a host plane that must be left out, and a kernel after
    the last copy (an unfinished step)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    gpu = space.planes.add(name="/device:GPU:0")
    for k, name in enumerate(["k1", "k2", "k3", "k4", "k5", "MemcpyD2H", "whole step"], 1):
        gpu.event_metadata[k].id = k
        gpu.event_metadata[k].name = name

    def add(line, metadata_id, start_us, duration_us):
        line.events.add(metadata_id=metadata_id,
                        offset_ps=start_us * _US - line.timestamp_ns * 1000,
                        duration_ps=duration_us * _US)

    compute = gpu.lines.add(name="Stream #13(Compute,Memset)", timestamp_ns=1000)
    add(compute, 1, 1000, 100)  # k1 [1000, 1100] us
    add(compute, 2, 1050, 100)  # k2 [1050, 1150]: overlaps k1
    add(compute, 3, 1400, 100)  # k3 after a 250 us gap
    add(compute, 4, 3000, 300)  # step 2
    add(compute, 5, 5000, 100)  # after the last copy
    copies = gpu.lines.add(name="Stream #15(MemcpyD2H)", timestamp_ns=0)
    add(copies, 6, 1700, 50)  # ends step 1 after a 200 us gap
    add(copies, 6, 3500, 100)  # ends step 2 after a 200 us gap
    derived = gpu.lines.add(name="XLA Ops", timestamp_ns=0)
    add(derived, 7, 0, 10000)
    host = space.planes.add(name="/host:CPU")
    host.event_metadata[1].name = "MemcpyD2H"
    add(host.lines.add(name="Stream #1", timestamp_ns=0), 1, 2000, 10)
    return space


def test_idle_steps_of_a_synthetic_trace():
    steps = trace_summary.idle_steps(trace_summary.device_activities(_synthetic_space()))
    # Step 1: from 1000 to 1750 us; busy [1000, 1150] + [1400, 1500] + [1700, 1750].
    # Step 2: from 3000 to 3600 us; busy [3000, 3300] + [3500, 3600].
    assert steps == [
        (750 * _US, 300 * _US, [(250 * _US, "k3"), (200 * _US, "MemcpyD2H")]),
        (600 * _US, 400 * _US, [(200 * _US, "MemcpyD2H")]),
    ]


def test_idle_summary_table(tmp_path):
    run = tmp_path / "plugins" / "profile" / "run"
    run.mkdir(parents=True)
    (run / "host.xplane.pb").write_bytes(_synthetic_space().SerializeToString())
    text = trace_summary.idle_summary(str(tmp_path))
    assert "| 0 | 0.75 ms | 0.30 ms | 0.45 ms | 250 us: k3; 200 us: MemcpyD2H |" in text, text
    assert "| 1 | 0.60 ms | 0.40 ms | 0.20 ms | 200 us: MemcpyD2H |" in text, text
    # 400 us before the copies and 250 us before k3 over two steps.
    assert "Idle per step before: MemcpyD2H 0.200 ms, k3 0.125 ms" in text, text
