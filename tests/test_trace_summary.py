"""benchmarks/trace_summary.py: profiler traces summed by layer."""

import os
import re
import subprocess
import sys

import pytest

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_REPO_ROOT, "benchmarks"))

import trace_summary  # noqa: E402


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
    bench = os.path.join(_REPO_ROOT, "benchmarks", "bench_model.py")
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
