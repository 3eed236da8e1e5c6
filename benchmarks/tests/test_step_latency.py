"""benchmarks/step_latency.py on the CPU: each library in a process of its own, in turn, for
every round; a table row per library and profile with a time per round (the GPU figures come
from GPU runs, not from here)."""

import os
import re
import shutil
import subprocess
import sys

import pytest

import tf_rnnt

_BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REPO_ROOT = os.path.dirname(_BENCHMARKS)
_SCRIPT = os.path.join(_BENCHMARKS, "step_latency.py")


@pytest.mark.slow
def test_table_has_a_time_per_round_for_each_library(tmp_path):
    assert tf_rnnt.library_available()
    library = tf_rnnt.build_info()["library"]
    second = tmp_path / os.path.basename(library)
    shutil.copy(library, second)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([_REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, _SCRIPT, "--profiles", "cpu", "--dtype", "float32", "--libraries",
         f"{library},{second}", "--rounds", "2", "--repeats", "2", "--depth", "2"],
        env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in proc.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| library")]
    assert [(r[0], r[1]) for r in rows] == [(library, "cpu"), (str(second), "cpu")]
    for row in rows:
        for cell in row[2:]:
            times = [float(t) for t in re.fullmatch(r"(.*) ms", cell).group(1).split(" / ")]
            assert len(times) == 2 and all(t > 0 for t in times), cell
