"""GPU checks of issue 7 for the H200 (no pytest there): long lattices, large logits in half
precision, bitwise determinism and concurrent calls. Prints PASS/FAIL per check; exits 1 on any
failure."""
import concurrent.futures
import sys

import numpy as np
import tensorflow as tf

import tf_rnnt

tf.config.experimental.enable_tensor_float_32_execution(False)
rng = np.random.default_rng(0)
failures = []


def check(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        failures.append(name)


def flash_inputs(B, T, U, H, V, dtype, kernel_scale=None):
    enc = tf.cast(rng.normal(0, 0.5, (B, T, H)), dtype)
    pred = tf.cast(rng.normal(0, 0.5, (B, U + 1, H)), dtype)
    kern = tf.cast(rng.normal(0, kernel_scale or 1 / np.sqrt(H), (H, V)), dtype)
    bias = tf.cast(np.zeros(V), dtype)
    labels = tf.constant(rng.integers(1, V, (B, U)), tf.int32)
    tl = tf.constant([T] + [T // 2] * (B - 1), tf.int32)
    ul = tf.constant([U] + [U // 2] * (B - 1), tf.int32)
    return enc, pred, kern, bias, labels, tl, ul


def flash_step(device, args, fn=tf_rnnt.flash_rnnt_loss, **kw):
    """[costs, d encoder, d predictor, d kernel, d bias] of fn (float32 NumPy)."""
    with tf.device(device):
        args = [tf.identity(a) for a in args]
        with tf.GradientTape() as tape:
            tape.watch(args[:4])
            costs = fn(*args, **kw)
        grads = tape.gradient(costs, args[:4])
    return [costs.numpy()] + [tf.cast(g, tf.float32).numpy() for g in grads]


def rnnt_loss_gpu(logits, labels, logit_lengths, label_lengths):
    """costs and d logits (float32 NumPy) of tf_rnnt.rnnt_loss on the GPU."""
    with tf.device("/GPU:0"):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            costs = tf_rnnt.rnnt_loss(logits, labels, logit_lengths, label_lengths)
        grads = tape.gradient(costs, logits)
    return costs.numpy(), tf.cast(grads, tf.float32).numpy()


def rel_diff(a, b):
    return max(float(np.max(np.abs(x - y)) / (1e-6 + np.max(np.abs(x)))) for x, y in zip(a, b))


# Long lattice: T=2000, U=500 (1M nodes per sample), GPU vs the CPU kernels.
args = flash_inputs(2, 2000, 500, 64, 64, tf.float32)
gpu = flash_step("/GPU:0", args)
cpu = flash_step("/CPU:0", args)
check("long lattice T=2000 U=500 finite", all(np.isfinite(x).all() for x in gpu),
      f"costs {gpu[0]}")
# Log-space values of magnitude ~cost carry 2^-24 * cost per recursion step; over T + U steps
# the occupation probabilities (and so the gradients) move by about sqrt(T + U) of those.
long_tolerance = 1e-5 + 4 * np.sqrt(2000 + 500) * 2.0**-24 * float(np.max(cpu[0]))
check("long lattice GPU == CPU (float32)", rel_diff(cpu, gpu) < long_tolerance,
      f"max rel diff {rel_diff(cpu, gpu):.2e} (tolerance {long_tolerance:.1e})")
logits = tf.constant(rng.normal(size=(2, 2000, 501, 16)).astype(np.float32))
lab = tf.constant(rng.integers(1, 16, (2, 500)), tf.int32)
c, g = rnnt_loss_gpu(logits, lab, [2000, 1500], [500, 300])
check("rnnt_loss T=2000 U=500 finite", np.isfinite(c).all() and np.isfinite(g).all(),
      f"costs {c}")

# Logits of magnitude 1e4 in half precision (float16 max 65504).
for dtype in (tf.float16, tf.bfloat16):
    big = tf.cast(rng.choice([-1e4, 1e4], size=(2, 30, 11, 32)), dtype)
    lab = tf.constant(rng.integers(1, 32, (2, 10)), tf.int32)
    c, g = rnnt_loss_gpu(big, lab, [30, 20], [10, 5])
    check(f"logits 1e4 {dtype.name} finite", np.isfinite(c).all() and np.isfinite(g).all())
    # tanh joint values in [-1, 1] and a kernel that makes logits of magnitude ~1e4. The true
    # d predictor (a sum over frames) can exceed float16's 65504; compare finiteness with the
    # reference run in the same precision.
    fargs = flash_inputs(2, 30, 10, 16, 32, dtype, kernel_scale=2.5e3)
    out = flash_step("/GPU:0", fargs)
    ref = flash_step("/GPU:0", fargs, fn=tf_rnnt.reference.flash_rnnt_loss)
    check(f"flash with logits ~1e4 {dtype.name} finite wherever the reference is",
          all(np.array_equal(np.isfinite(x), np.isfinite(y)) for x, y in zip(out, ref)))

# Bitwise determinism on the GPU (no atomics anywhere).
args = flash_inputs(8, 120, 40, 128, 257, tf.float32)
for mode in ("tiled", "untiled"):
    a = flash_step("/GPU:0", args, mode=mode, tile_size=1000)
    b = flash_step("/GPU:0", args, mode=mode, tile_size=1000)
    check(f"determinism {mode}", all(np.array_equal(x, y) for x, y in zip(a, b)))

# Concurrency: 4 threads x 3 calls with different shapes == sequential results.
cases = [flash_inputs(2 + i, 40 + 10 * i, 10 + i, 32, 65, tf.float32) for i in range(4)]
expected = [flash_step("/GPU:0", c) for c in cases]
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    futures = [pool.submit(flash_step, "/GPU:0", cases[i % 4]) for i in range(12)]
    got = [f.result() for f in futures]
check("concurrent calls from 4 threads", all(
    all(np.array_equal(x, y) for x, y in zip(got[i], expected[i % 4])) for i in range(12)))

print("FAILED: " + ", ".join(failures) if failures else "ALL PASS")
sys.exit(1 if failures else 0)
