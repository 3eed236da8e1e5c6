"""benchmarks/report.py: the markdown it writes from bench_rnnt JSON, and --check.

Runs the script in a subprocess on a scratch directory. Expected cells are worked out here by
hand from the JSON values (seconds -> ms, bytes -> MiB/GiB, flops / seconds -> TFLOP/s).
"""

import json
import os
import subprocess
import sys

REPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "report.py")

RESULTS = {
    "meta": {"device": "Test GPU", "tensorflow": "2.21.0", "date": "2026-01-02",
             "command": "python benchmarks/bench_rnnt.py --suite flash",
             "matmul_tflops": {"bfloat16": 500}, "notes": ["A note."]},
    "flash": [
        # An old result: the medium profile under its former name.
        {"profile": "target", "lengths": "full", "dtype": "bfloat16", "method": "tiled",
         "seconds": 0.02, "peak_bytes": 3 * 2**20, "nodes": 1000, "gemm_flops": 6e12},
        {"profile": "target", "lengths": "full", "dtype": "bfloat16", "method": "reference",
         "seconds": 0.4, "peak_bytes": 3 * 2**30, "nodes": 1000, "gemm_flops": 6e12},
        {"profile": "short", "lengths": "ragged", "dtype": "float32", "method": "tiled",
         "seconds": 0.001, "peak_bytes": 0, "nodes": 10, "gemm_flops": 5e8},
    ],
}


def run(*args):
    return subprocess.run([sys.executable, REPORT, *args], capture_output=True, text=True,
                          timeout=120)


def test_writes_the_tables_and_checks_staleness(tmp_path):
    (tmp_path / "rnnt_test.json").write_text(json.dumps(RESULTS))
    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))  # not bench_rnnt output
    assert run("--check", "--results", str(tmp_path)).returncode == 1  # no .md yet
    assert run("--results", str(tmp_path)).returncode == 0
    assert sorted(os.listdir(tmp_path)) == ["other.json", "rnnt_test.json", "rnnt_test.md"]
    text = (tmp_path / "rnnt_test.md").read_text()
    assert "target" not in text
    # 6e12 flops in 20 ms: 300 TFLOP/s, 60% of 500; 3 MiB; 0.4 s / 0.02 s = 20x, 3 GiB / 3 MiB.
    assert ("| medium | full | bfloat16 | tiled | 20.0 ms | 3.0 MiB | 300.0 TFLOP/s (60% of "
            "matmul) | 20.00x the reference's speed, 1/1024 of its memory |") in text
    assert "| medium | full | bfloat16 | reference | 400.0 ms | 3.00 GiB |" in text
    # 5e8 flops in 1 ms: 500 GFLOP/s, no float32 matmul rate given; peak 0: not measured.
    assert "| short | ragged | float32 | tiled | 1.0 ms | - | 500.0 GFLOP/s |  |" in text
    assert text.index("| short | ragged") < text.index("| medium | full")
    assert "| medium | 32 | 400 | 128 | 640 | 1025 |" in text
    assert "Test GPU" in text and "A note." in text

    assert run("--check", "--results", str(tmp_path)).returncode == 0
    assert run("--results", str(tmp_path)).stdout == ""  # deterministic: nothing rewritten
    (tmp_path / "rnnt_test.md").write_text(text.replace("20.0 ms", "19.0 ms"))
    stale = run("--check", "--results", str(tmp_path))
    assert stale.returncode == 1 and "rnnt_test.md" in stale.stderr


def test_repository_results_are_current():
    proc = run("--check")
    assert proc.returncode == 0, proc.stderr
