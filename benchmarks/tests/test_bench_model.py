"""benchmarks/bench_model.py --tiny: the Conformer benchmark runs end to end on the CPU and
writes a complete table (the real-scale numbers come from GPU runs, not from here)."""

import json
import os
import re
import subprocess
import sys

import pytest
from rnnt_testing import load_module

_BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REPO_ROOT = os.path.dirname(_BENCHMARKS)
_BENCH = os.path.join(_BENCHMARKS, "bench_model.py")
_COLUMNS = ["GPU", "variant", "V", "dtype", "XLA", "GPUs", "per-GPU batch", "step ms",
            "compile s", "throughput (utt/s)", "scaling vs 1 GPU", "peak memory per GPU (MiB)",
            "largest batch", "encoder share", "encoder TFLOP/s"]


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
         "--json", str(tmp_path / "model.json"), "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = out.read_text()
    assert "CPU only" in text and "no GPU visible" in text
    header = next(line for line in text.splitlines() if line.startswith("| GPU"))
    assert [c.strip() for c in header.strip("|").split("|")] == _COLUMNS
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| CPU")]
    assert [r[1] for r in rows] == ["flash", "logits"]
    for row in rows:
        cells = dict(zip(_COLUMNS, row))
        assert cells["dtype"] == "float32" and cells["GPUs"] == "0 (CPU)"
        assert cells["per-GPU batch"] == "2" and cells["V"] == "17" and cells["XLA"] == "false"
        for column in ("step ms", "throughput (utt/s)", "scaling vs 1 GPU",
                       "peak memory per GPU (MiB)", "compile s"):
            value = _number(cells[column])
            assert value > 0 and value < float("inf"), (column, cells[column])
        assert cells["encoder share"] == "-"  # no profile
    runs = json.loads((tmp_path / "model.json").read_text())["runs"]
    # Both variants train the same model (same weights, different joint output).
    assert len({r["params"] for r in runs}) == 1
    # The searched variant: no OOM on the CPU up to the tiny search limit (2 x batch).
    assert dict(zip(_COLUMNS, rows[0]))["largest batch"] == ">=4"
    assert dict(zip(_COLUMNS, rows[1]))["largest batch"] == "-"
    assert all(r["status"] == "ok" and r["jit_compile"] is False for r in runs)
    assert "Flash against full logits" in text and "not evaluated" in text


def _bench_module():
    return load_module("bench_model_under_test", _BENCH)


@pytest.mark.parametrize("limit, start, search_max, expected", [
    (300, 32, 1024, (263, 300, "")),     # doubling to 256, fails at 512, bisection
    (40, 32, 1024, (36, 40, "")),        # fails at 64
    (5000, 32, 1024, (1024, 1024, ">=")),  # never fails up to the limit
    (20, 32, 1024, (18, 20, "")),        # --batch itself fails: halve, then bisect
])
def test_batch_search_brackets_the_limit(monkeypatch, limit, start, search_max, expected):
    bench = _bench_module()
    probes = []

    def fake_run(base_argv, spec, timeout, devices=None):
        probes.append(spec["batch"])
        ok = spec["batch"] <= limit
        return dict(spec, status="ok" if ok else "OOM", finite=ok)

    monkeypatch.setattr(bench, "run_subprocess", fake_run)
    args = bench.parse_args(["--batch", str(start), "--search-max", str(search_max)])
    found = bench.search_largest_batch([], args, "flash", "mixed_bfloat16", 1,
                                       known_ok=start <= limit, log=lambda text: None)
    low, high, bound = expected
    assert found["bound"] == bound
    assert low <= found["largest_batch"] <= high
    assert found["largest_batch"] <= limit
    if not bound:
        assert found["first_fail"] > limit
        assert found["first_fail"] - found["largest_batch"] <= max(1, found["largest_batch"] // 8)
    assert start not in probes or start > limit  # a known-good --batch is not probed again


def _conformer_module():
    return load_module("conformer_under_test",
                       os.path.join(_REPO_ROOT, "examples", "speech", "conformer.py"))


def test_conformer_frame_lengths_follow_the_subsampling():
    import numpy as np

    conformer = _conformer_module()
    lengths = np.arange(1, 50)
    got = np.asarray(conformer.output_lengths(lengths))
    # Each convolution: kernel 3, stride 2, one padding frame per side -> floor((L - 1) / 2) + 1.
    np.testing.assert_array_equal(got, -(-lengths // 4))


def test_conformer_ignores_padding():
    """The lattice of each sample's valid nodes is the same however much padding follows it
    (inference mode): attention, convolutions and the joint see the lengths."""
    import keras
    import numpy as np

    conformer = _conformer_module()
    sizes = dict(conformer.TINY, dropout=0.0)
    keras.utils.set_random_seed(3)
    model = conformer.build_conformer_transducer(**sizes)
    rng = np.random.default_rng(0)
    bins, vocab = sizes["num_mel_bins"], sizes["vocab_size"]
    feature_lengths = np.array([29, 18, 33], np.int32)
    label_lengths = np.array([4, 2, 3])
    labels = rng.integers(1, vocab, size=(3, 4)).astype(np.int32)
    labels[np.arange(4)[None, :] >= label_lengths[:, None]] = -1
    base = rng.normal(size=(3, 44, bins)).astype(np.float32)

    def lattice(num_frames, pad_value):
        features = np.full((3, num_frames, bins), pad_value, np.float32)
        for b, n in enumerate(feature_lengths):
            features[b, :n] = base[b, :n]
        return model({"features": features, "feature_lengths": feature_lengths,
                      "labels": labels}, training=False).numpy()

    short, long = lattice(33, 0.0), lattice(44, 7.0)  # 9 and 11 frames after subsampling
    frames = -(-feature_lengths // 4)
    assert short.shape == (3, 9, 5, 2) and long.shape == (3, 11, 5, 2)
    for b in range(3):
        valid = (slice(None, frames[b]), slice(None, label_lengths[b] + 1))
        # Log-probabilities: blank on every valid node, the next label before the last.
        assert np.all(short[b][valid][..., 0] <= 0)
        assert np.all(short[b][valid][:, :label_lengths[b], 1] <= 0)
        assert np.all(np.isfinite(short[b][valid]))
        np.testing.assert_allclose(long[b][valid], short[b][valid], rtol=1e-5, atol=1e-5)
        # The blank channel outside the valid rectangle is marked as padding for the loss.
        assert np.all(long[b, frames[b]:, :, 0] == 1.0)
        assert np.all(long[b, :, label_lengths[b] + 1:, 0] == 1.0)
