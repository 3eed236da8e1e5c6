"""benchmarks/bench_model.py --tiny: the Conformer benchmark runs end to end on the CPU and
writes a complete table (the real-scale numbers come from GPU runs, not from here)."""

import os
import re
import subprocess
import sys

import pytest

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BENCH = os.path.join(_REPO_ROOT, "benchmarks", "bench_model.py")
_COLUMNS = ["variant", "dtype", "GPUs", "per-GPU batch", "step ms", "throughput (utt/s)",
            "scaling vs 1 GPU", "peak memory per GPU (MiB)", "largest batch", "params"]


def _number(cell):
    return float(re.sub(r"^>=|x$", "", cell).replace(",", ""))


@pytest.mark.slow
def test_tiny_benchmark_table(tmp_path):
    out = tmp_path / "model.md"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([_REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, _BENCH, "--tiny", "--variants", "flash,logits", "--dtypes", "float32",
         "--gpus", "1", "--search-variants", "flash", "--search-dtypes", "float32",
         "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = out.read_text()
    assert "CPU only" in text and "no GPU visible" in text
    header = next(line for line in text.splitlines() if line.startswith("| variant"))
    assert [c.strip() for c in header.strip("|").split("|")] == _COLUMNS
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| flash") or line.startswith("| logits")]
    assert [r[0] for r in rows] == ["flash", "logits"]
    params = set()
    for row in rows:
        cells = dict(zip(_COLUMNS, row))
        assert cells["dtype"] == "float32" and cells["GPUs"] == "0 (CPU)"
        assert cells["per-GPU batch"] == "2"
        for column in ("step ms", "throughput (utt/s)", "scaling vs 1 GPU",
                       "peak memory per GPU (MiB)", "params"):
            value = _number(cells[column])
            assert value > 0 and value < float("inf"), (column, cells[column])
        params.add(cells["params"])
    # Both variants train the same model (same weights, different joint output).
    assert len(params) == 1
    # The searched variant: no OOM on the CPU up to the tiny search limit (2 x batch).
    assert dict(zip(_COLUMNS, rows[0]))["largest batch"] == ">=4"
    assert dict(zip(_COLUMNS, rows[1]))["largest batch"] == "-"
    assert "Targets" in text and "not evaluated" in text
