"""bench_rnnt.py's tdt suite on the CPU (a tiny profile) and report.py's table of its rows.

The suite's own numbers are timings; what is checked is that every case ran (both losses, each
method) and that the rendered table shows the rows' ratios worked out here by hand.
"""

import json
import os
import subprocess
import sys

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(BENCHMARKS)


def test_tdt_suite_runs_both_losses_and_renders(tmp_path):
    out = tmp_path / "tdt_cpu.md"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, os.path.join(BENCHMARKS, "bench_rnnt.py"), "--loss", "tdt",
         "--profile", "cpu", "--lengths", "full", "--methods", "tiled,untiled,reference",
         "--durations", "0,1,2", "--warmup", "0", "--repeats", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "tdt_cpu.json").read_text())
    rows = results["tdt"]
    assert [r["method"] for r in rows] == ["tiled", "untiled", "reference"]
    for r in rows:
        assert r["durations"] == [0, 1, 2] and r["profile"] == "cpu"
        assert r["rnnt_seconds"] > 0 and r["tdt_seconds"] > 0, r
    report = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "report.py"),
                             "--results", str(tmp_path)], capture_output=True, text=True,
                            timeout=120)
    assert report.returncode == 0, report.stderr
    text = out.read_text()
    assert text.startswith("# flash_tdt_loss on the CPU")
    for r in rows:
        ratio = f"{r['tdt_seconds'] / r['rnnt_seconds']:.2f}x"
        assert (f"| cpu | full | float32 | {r['method']} | {r['rnnt_seconds'] * 1e3:.1f} ms | "
                f"{r['tdt_seconds'] * 1e3:.1f} ms | {ratio} |") in text
