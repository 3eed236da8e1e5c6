"""Tiled Flash RNN-T never holds the [B, T, U+1, V] logits, measured on the CPU.

In a fresh subprocess (so the peak RSS is this case's alone): B=4, T=300, U=120, V=4096,
H=64, whose float32 logits alone would take 4*300*121*4096*4 bytes = 2.38 GB, runs
flash_rnnt_loss forward + backward in tiled mode. The process's peak RSS (ru_maxrss) after
the step may exceed the peak measured after imports, a warm-up call and input creation by
less than 400 MB.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from rnnt_testing import REPO_ROOT

B, T, U, V, H = 4, 300, 120, 4096, 64
LOGITS_BYTES = B * T * (U + 1) * V * 4
MAX_GROWTH_BYTES = 400 * 2 ** 20

_SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    import tensorflow as tf
    import tf_rnnt

    B, T, U, V, H = (int(x) for x in sys.argv[1:6])

    def inputs(batch, max_t, max_u, hidden, vocab, seed):
        rng = np.random.default_rng(seed)
        encoder = tf.constant(rng.normal(0, 0.5, (batch, max_t, hidden)).astype(np.float32))
        predictor = tf.constant(rng.normal(0, 0.5, (batch, max_u + 1, hidden)).astype(np.float32))
        kernel = tf.constant(rng.normal(0, hidden ** -0.5, (hidden, vocab)).astype(np.float32))
        bias = tf.constant(np.zeros(vocab, np.float32))
        labels = tf.constant(rng.integers(1, vocab, (batch, max_u)).astype(np.int32))
        logit_lengths = tf.constant(np.full(batch, max_t, np.int32))
        label_lengths = tf.constant(np.full(batch, max_u, np.int32))
        return [encoder, predictor, kernel, bias], [labels, logit_lengths, label_lengths]

    def step(params, rest):
        with tf.GradientTape() as tape:
            tape.watch(params)
            costs = tf_rnnt.flash_rnnt_loss(*params, *rest, mode="tiled")
            total = tf.reduce_sum(costs)
        grads = tape.gradient(total, params)
        return costs.numpy(), [g.numpy() for g in grads]

    def peak_rss_bytes():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB

    step(*inputs(2, 5, 3, 8, 16, seed=1))  # load the op library and TF's kernels first
    params, rest = inputs(B, T, U, H, V, seed=0)
    before = peak_rss_bytes()
    costs, grads = step(params, rest)
    after = peak_rss_bytes()
    print("RESULT " + json.dumps({
        "growth_bytes": after - before,
        "before_bytes": before,
        "costs": costs.tolist(),
        "finite": bool(np.all(np.isfinite(costs))
                       and all(np.all(np.isfinite(g)) for g in grads)),
        "grad_shapes": [list(g.shape) for g in grads],
    }))
""")


@pytest.mark.slow
def test_tiled_flash_rnnt_loss_peak_memory():
    assert LOGITS_BYTES > 2 * 10 ** 9  # the case is one whose logits alone exceed 2 GB
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")  # CPU RSS only
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, *map(str, (B, T, U, V, H))],
                          capture_output=True, text=True, timeout=900, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"subprocess failed:\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["finite"], result
    assert result["grad_shapes"] == [[B, T, H], [B, U + 1, H], [H, V], [V]]
    # -log P(y|x) is positive.
    assert all(c > 0 for c in result["costs"]), result["costs"]
    growth_mb = result["growth_bytes"] / 2 ** 20
    assert result["growth_bytes"] < MAX_GROWTH_BYTES, (
        f"peak RSS grew by {growth_mb:.0f} MB (limit 400 MB; the logits alone are "
        f"{LOGITS_BYTES / 2 ** 20:.0f} MB)")
