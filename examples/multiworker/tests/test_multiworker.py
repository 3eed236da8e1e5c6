"""MultiWorkerMirroredStrategy: 2 worker processes equal 1 process on the same global batch.

Two CPU workers on localhost (`TF_CONFIG` with free ports, `CUDA_VISIBLE_DEVICES=""`) run the
custom training loop of `examples/multiworker/train.py` (per-example `FlashRNNTLoss` costs,
`tf.nn.compute_average_loss` over the global batch, gradients all-reduced by the optimizer) on
a small `RNNTJoint` transducer; a third process runs the same loop without distribution on the
same global batches. Per-step losses and final weights must agree to 1e-5.
"""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

_EXAMPLE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # examples/multiworker
_REPO_ROOT = os.path.dirname(os.path.dirname(_EXAMPLE))
_TRAIN = os.path.join(_EXAMPLE, "train.py")
_STEPS = 3
_GLOBAL_BATCH = 8


def _train_module():
    spec = importlib.util.spec_from_file_location("multiworker_train", _TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env():
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
                PYTHONPATH=os.pathsep.join([_REPO_ROOT, os.environ.get("PYTHONPATH", "")]))


def _argv(out, strategy):
    return [sys.executable, _TRAIN, "--strategy", strategy, "--steps", str(_STEPS),
            "--global-batch", str(_GLOBAL_BATCH), "--communication", "ring", "--out", out]


def test_free_ports_and_tf_config():
    train = _train_module()
    ports = train.free_ports(3)
    assert len(set(ports)) == 3 and all(0 < p < 65536 for p in ports)
    config = json.loads(train.tf_config(["localhost:1", "localhost:2"], 1))
    assert config == {"cluster": {"worker": ["localhost:1", "localhost:2"]},
                      "task": {"type": "worker", "index": 1}}


@pytest.mark.slow
def test_two_workers_equal_one_process(tmp_path):
    train = _train_module()
    single_out = str(tmp_path / "single.json")
    multi_out = str(tmp_path / "multi.json")
    single = subprocess.Popen(_argv(single_out, "default"), env=_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        workers = train.launch_local_workers(lambda i: _argv(multi_out, "multiworker"), 2,
                                             env=_env(), timeout=150)
        single_stdout, single_stderr = single.communicate(timeout=150)
    finally:
        if single.poll() is None:
            os.killpg(single.pid, 9)
            single.wait()
    for i, (code, out, err) in enumerate(workers):
        assert code == 0, f"worker {i} exit {code}:\n{out[-2000:]}\n{err[-4000:]}"
    assert single.returncode == 0, f"single process failed:\n{single_stderr[-4000:]}"

    with open(single_out) as f:
        expected = json.load(f)
    with open(multi_out) as f:
        got = json.load(f)
    assert expected["num_replicas"] == 1 and got["num_replicas"] == 2
    assert len(got["losses"]) == len(expected["losses"]) == _STEPS
    assert np.all(np.isfinite(expected["losses"]))
    np.testing.assert_allclose(got["losses"], expected["losses"], rtol=1e-5)
    # Both workers report the same global mean loss.
    worker_losses = [json.loads(line[len("LOSSES "):]) for _, out, _ in workers
                     for line in out.splitlines() if line.startswith("LOSSES ")]
    assert len(worker_losses) == 2
    np.testing.assert_allclose(worker_losses[1], worker_losses[0], rtol=1e-6)

    assert got["paths"] == expected["paths"] and len(got["paths"]) > 0
    for path, initial, want, have in zip(expected["paths"], expected["initial_weights"],
                                         expected["weights"], got["weights"]):
        initial, want, have = (np.asarray(x, np.float64) for x in (initial, want, have))
        assert np.any(want != initial), f"{path} did not train"
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5 * np.max(np.abs(want)),
                                   err_msg=path)
