"""The README's Python examples run as written, in order, in a fresh process."""

import os
import re
import subprocess
import sys

import pytest
from rnnt_testing import REPO_ROOT, pythonpath


def readme_blocks():
    with open(os.path.join(REPO_ROOT, "README.md")) as f:
        return re.findall(r"^```python\n(.*?)^```", f.read(), re.S | re.M)


def test_readme_has_the_documented_examples():
    blocks = readme_blocks()
    assert len(blocks) >= 3, "the quick example, the Keras recipe and the deployment path"
    text = "\n".join(blocks)
    for name in ("flash_rnnt_loss", "RNNTJoint", "greedy_search", "beam_search",
                 "StreamingTranscriber", "tflite"):
        assert name in text, name


@pytest.mark.slow
def test_readme_examples_run_as_written(tmp_path):
    script = tmp_path / "readme.py"
    script.write_text("\n\n".join(readme_blocks()))
    env = dict(os.environ, PYTHONPATH=pythonpath(), TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
