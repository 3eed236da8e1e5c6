"""The framework-free core's own tests (custom_ops/tests/core_test.cc), built and run.

`python custom_ops/build.py --tests` links the core's launchers with a test program that checks
them, without TensorFlow, against float64 brute force (every alignment of the lattice loss, the
log-softmax and the joint written out as loops). Its CPU half must pass here; its GPU half runs
where a GPU and CUDA are present (tests/gpu/run.sh core), else it reports itself skipped.
"""

import os
import re
import subprocess
import sys

import pytest
from rnnt_testing import REPO_ROOT

PROGRAM = os.path.join(REPO_ROOT, "build", "tests", "core_test")


@pytest.fixture(scope="module")
def core_test_program():
    if not os.path.exists(os.path.join(REPO_ROOT, "custom_ops", "build.py")):
        pytest.skip("needs the source tree's custom_ops/ (this run tests an installed wheel)")
    build = subprocess.run(
        [sys.executable, os.path.join(REPO_ROOT, "custom_ops", "build.py"), "--tests"],
        cwd=REPO_ROOT, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    return PROGRAM


@pytest.mark.slow
def test_core_launchers_match_float64_brute_force(core_test_program):
    result = subprocess.run([core_test_program], capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    cpu = re.search(r"^CPU: (\d+) passed, (\d+) failed$", output, re.M)
    assert cpu, output
    assert int(cpu.group(1)) >= 30 and int(cpu.group(2)) == 0, output
    assert re.search(r"^GPU: (SKIPPED|\d+ passed, 0 failed)", output, re.M), output
    assert output.rstrip().endswith("PASSED"), output
