"""Small GPU workload for compute-sanitizer: every CUDA kernel of tf_rnnt, all dtypes, both modes,
ragged lengths, blank first and last, RNN-T and TDT joints. Exits non-zero if results disagree
with the CPU kernels."""
import argparse

import numpy as np
import tensorflow as tf

import tf_rnnt

tf.config.experimental.enable_tensor_float_32_execution(False)  # exact float32 GEMMs for parity

parser = argparse.ArgumentParser()
parser.add_argument("--dtypes", default="float32,float16,bfloat16")
parser.add_argument("--joint-dtypes", default=None,
                    help="dtypes that also run the fused joint (default: all of --dtypes); the "
                         "others run only the cuBLAS-free lattice ops")
cli = parser.parse_args()
dtypes = [tf.as_dtype(d) for d in cli.dtypes.split(",")]
joint_dtypes = [tf.as_dtype(d) for d in (cli.joint_dtypes or cli.dtypes).split(",") if d]
rng = np.random.default_rng(0)
B, T, U, H, V = 3, 7, 4, 8, 11
labels = rng.integers(1, V - 1, (B, U)).astype(np.int32)
tl = np.array([7, 3, 5], np.int32)
ul = np.array([4, 0, 2], np.int32)
failed = False
for dtype in dtypes:
    enc = rng.normal(size=(B, T, H)).astype(np.float32)
    pred = rng.normal(size=(B, U + 1, H)).astype(np.float32)
    kern = rng.normal(size=(H, V)).astype(np.float32) * 0.3
    bias = rng.normal(size=(V,)).astype(np.float32)
    logits = rng.normal(size=(B, T, U + 1, V)).astype(np.float32)
    results = {}
    for dev in ("/CPU:0", "/GPU:0"):
        with tf.device(dev):
            args = [tf.cast(x, dtype) for x in (enc, pred, kern, bias)]
            lg = tf.cast(logits, dtype)
            out = []
            for blank in (0, -1):
                lab = labels if blank == 0 else labels - 1
                for mode, tile in (
                    (("tiled", 5), ("untiled", None)) if dtype in joint_dtypes else ()
                ):
                    with tf.GradientTape() as tape:
                        tape.watch(args)
                        c = tf_rnnt.flash_rnnt_loss(
                            *args, lab, tl, ul, blank=blank, mode=mode, tile_size=tile
                        )
                    out += [c] + tape.gradient(c, args)
                with tf.GradientTape() as tape:
                    tape.watch(lg)
                    c = tf_rnnt.rnnt_loss(lg, lab, tl, ul, blank=blank, fastemit_lambda=0.1)
                out += [c, tape.gradient(c, lg)]
            results[dev] = [tf.cast(x, tf.float32).numpy() for x in out]
    worst = max(float(np.max(np.abs(a - b) / (1 + np.abs(a))))
                for a, b in zip(results["/CPU:0"], results["/GPU:0"]))
    tol = 1e-4 if dtype == tf.float32 else 5e-2  # TF32 is off by default in this check below
    failed |= not worst < tol
    print(dtype.name, "max |cpu - gpu| / (1 + |cpu|) =", worst, "tolerance", tol)
# The TDT lattice loss (durations with and without 0) and the input-check op.
durations_cases = ([0, 1, 2], [1, 2])
for durations in durations_cases:
    tdt_logits = rng.normal(size=(B, T, U + 1, V + len(durations))).astype(np.float32)
    results = {}
    for dev in ("/CPU:0", "/GPU:0"):
        with tf.device(dev):
            lg = tf.constant(tdt_logits)
            with tf.GradientTape() as tape:
                tape.watch(lg)
                c = tf_rnnt.tdt_loss(lg, labels, tl, ul, durations, blank=0, sigma=0.05)
            results[dev] = [c.numpy(), tape.gradient(c, lg).numpy()]
    worst = max(float(np.max(np.abs(np.nan_to_num(a) - np.nan_to_num(b)) / (1 + np.abs(
        np.nan_to_num(a))))) for a, b in zip(results["/CPU:0"], results["/GPU:0"]))
    failed |= not worst < 1e-4
    print("tdt", durations, "max |cpu - gpu| / (1 + |cpu|) =", worst, "tolerance", 1e-4)
# The fused TDT joint (duration columns beside the token columns), tiled and untiled, 16-bit.
durations = [0, 1, 2, 3, 4]
for dtype in [d for d in joint_dtypes if d != tf.float32]:
    enc = rng.normal(size=(B, T, H)).astype(np.float32)
    pred = rng.normal(size=(B, U + 1, H)).astype(np.float32)
    kern = rng.normal(size=(H, V + len(durations))).astype(np.float32) * 0.3
    bias = rng.normal(size=(V + len(durations),)).astype(np.float32)
    results = {}
    for dev in ("/CPU:0", "/GPU:0"):
        with tf.device(dev):
            args = [tf.cast(x, dtype) for x in (enc, pred, kern, bias)]
            out = []
            for mode, tile in (("tiled", 5), ("untiled", None)):
                with tf.GradientTape() as tape:
                    tape.watch(args)
                    c = tf_rnnt.flash_tdt_loss(*args, labels, tl, ul, durations, blank=-1,
                                               sigma=0.05, mode=mode, tile_size=tile)
                out += [c] + tape.gradient(c, args)
            results[dev] = [tf.cast(x, tf.float32).numpy() for x in out]
    worst = max(float(np.max(np.abs(a - b) / (1 + np.abs(a))))
                for a, b in zip(results["/CPU:0"], results["/GPU:0"]))
    failed |= not worst < 5e-2
    print("flash tdt", dtype.name, "max |cpu - gpu| / (1 + |cpu|) =", worst, "tolerance", 5e-2)
with tf.device("/GPU:0"):
    checked = tf_rnnt.ops.check(tf.constant(tl), tf.constant([True, True, True]), "sanitizer")
    failed |= not np.array_equal(checked.numpy(), tl)
    try:
        tf_rnnt.ops.check(tf.constant(tl), tf.constant([True, False, True]), "sanitizer: bad")
        failed = True
        print("check op: a false condition passed")
    except tf.errors.InvalidArgumentError:
        print("check op: a false condition raised")
print("MISMATCH" if failed else "OK")
raise SystemExit(1 if failed else 0)
