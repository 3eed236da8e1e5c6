"""GPU robustness checks; a standalone script, no pytest (tests/gpu/run.sh robustness).

  python tests/gpu/robustness_gpu.py            # every check
  python tests/gpu/robustness_gpu.py long oom   # some of them
  python tests/gpu/robustness_gpu.py --cpu-dry-run [checks]   # the script itself, CPU vs CPU

Checks (one PASS/FAIL line each, exit status 1 if any failed, 2 without a GPU):
  long         T=2000, U=500 (V=64, H=64, B=2, ragged): flash_rnnt_loss tiled/untiled and
               rnnt_loss on the GPU: costs and gradients finite and equal to the CPU op's.
  logits_1e4   logits of magnitude 1e4 in float16/bfloat16 (rnnt_loss against the float64
               oracle, and finite for logits of exactly +-1e4; flash_rnnt_loss finite, costs
               within the half-precision bound, and finite wherever tf_rnnt.reference is for a
               tanh joint scaled to logits ~1e4).
  concurrency  4 threads x 5 calls with their own shapes at once: bitwise the sequential
               results, which match the CPU op.
  oom          a workspace no GPU has: ResourceExhaustedError naming tile_size/memory_budget,
               then a normal call still works.
  determinism  two runs bitwise equal, without and then with op determinism enabled (last:
               enabling it cannot be undone in the process); also at V = 257 (padded rows).
TF32 is off (exact float32 GEMMs) so the GPU and CPU results are comparable.
"""

import math
import os
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tensorflow as tf

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(_HERE)), os.path.dirname(_HERE)]

import oracle  # noqa: E402  (tests/oracle.py: float64 NumPy)

import tf_rnnt  # noqa: E402

RTOL = 1e-5
U32 = 2.0 ** -24
UNIT_ROUNDOFF = {tf.float16: 2.0 ** -11, tf.bfloat16: 2.0 ** -8}
GPU, CPU = "/GPU:0", "/CPU:0"
CHECKS = {}


def check(fn):
    CHECKS[fn.__name__.replace("check_", "")] = fn
    return fn


class CheckFailed(AssertionError):
    pass


def expect(condition, message):
    if not condition:
        raise CheckFailed(message)


def max_relative_error(got, expected):
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    return float(np.max(np.abs(got - expected)) / max(float(np.max(np.abs(expected))), 1e-30))


def with_gradients(fn, params, device, dtype=tf.float32):
    with tf.device(device):
        tensors = [tf.cast(tf.constant(x), dtype) for x in params]
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            out = fn(*tensors)
            weights = np.linspace(0.5, 1.5, out.shape[0]).astype(np.float32)
            total = tf.reduce_sum(tf.cast(out, tf.float32) * weights)
        grads = tape.gradient(total, tensors)
    return [tf.cast(out, tf.float64).numpy()] + [tf.cast(g, tf.float64).numpy() for g in grads]


def all_finite(arrays):
    return all(bool(np.all(np.isfinite(a))) for a in arrays)


def long_lattice_tolerance(costs, steps):
    """Float32 log-space values of magnitude ~cost carry u32 * cost per recursion step; a random
    walk of `steps` such roundings, four standard deviations: the gradients' relative error."""
    return RTOL + 4.0 * math.sqrt(steps) * U32 * float(np.max(np.abs(costs)))


# ------------------------------------------------------------------------------ checks

@check
def check_long(log):
    rng = np.random.default_rng(0)
    B, T, U, H, V = 2, 2000, 500, 64, 64
    encoder = rng.normal(size=(B, T, H)).astype(np.float32)
    predictor = rng.normal(size=(B, U + 1, H)).astype(np.float32)
    kernel = (rng.normal(size=(H, V)) / np.sqrt(H)).astype(np.float32)
    bias = (0.1 * rng.normal(size=(V,))).astype(np.float32)
    labels = rng.integers(1, V, size=(B, U)).astype(np.int32)
    logit_lengths = np.array([T, 1700], np.int32)
    label_lengths = np.array([U, 420], np.int32)
    steps = T + U
    params = [encoder, predictor, kernel, bias]
    lines = log
    results = {}
    for name, fn in [
        ("flash_tiled", lambda *p: tf_rnnt.flash_rnnt_loss(*p, labels, logit_lengths,
                                                           label_lengths)),
        ("flash_untiled", lambda *p: tf_rnnt.flash_rnnt_loss(*p, labels, logit_lengths,
                                                             label_lengths, mode="untiled")),
        # rnnt_loss on the joint's full logits (512 MB), through TensorFlow's own joint.
        ("rnnt_loss", lambda *p: tf_rnnt.rnnt_loss(tf_rnnt.reference.joint_logits(*p), labels,
                                                   logit_lengths, label_lengths)),
    ]:
        for device in (GPU, CPU):
            start = time.time()
            results[(name, device)] = with_gradients(fn, params, device)
            lines.append(f"{name} {device[1:4]} {time.time() - start:.1f} s")
        gpu, cpu = results[(name, GPU)], results[(name, CPU)]
        expect(all_finite(gpu), f"{name}: non-finite GPU result")
        cost_error = max_relative_error(gpu[0], cpu[0])
        grad_error = max(max_relative_error(g, c) for g, c in zip(gpu[1:], cpu[1:]))
        tolerance = long_lattice_tolerance(cpu[0], steps)
        lines.append(f"{name}: costs {gpu[0]}, GPU vs CPU: costs {cost_error:.1e}, "
                     f"gradients {grad_error:.1e} (tolerance {tolerance:.1e})")
        expect(cost_error <= RTOL + 4 * math.sqrt(steps) * U32, f"{name}: costs differ")
        expect(grad_error <= tolerance, f"{name}: gradients differ")
    # Costs against the float64 oracle (NumPy joint and alpha/beta loops, ~20 s on one core).
    start = time.time()
    lattice = oracle.lattice_from_logits(oracle.joint_logits(*params), labels)
    exact_costs, _ = oracle.lattice_loss(lattice, logit_lengths, label_lengths)
    del lattice
    for name in ("flash_tiled", "flash_untiled", "rnnt_loss"):
        error = max_relative_error(results[(name, GPU)][0], exact_costs)
        lines.append(f"{name} GPU costs vs float64 oracle: {error:.1e} "
                     f"({time.time() - start:.0f} s for the oracle)")
        expect(error <= RTOL + 4 * math.sqrt(steps) * U32, f"{name}: costs vs oracle")
    # The three implementations agree with each other on the GPU, too.
    for name in ("flash_untiled", "rnnt_loss"):
        error = max(max_relative_error(a, b) for a, b in
                    zip(results[(name, GPU)], results[("flash_tiled", GPU)]))
        lines.append(f"{name} vs flash_tiled on the GPU: {error:.1e}")
        expect(error <= long_lattice_tolerance(results[("flash_tiled", CPU)][0], steps),
               f"{name} vs flash_tiled")


@check
def check_logits_1e4(log):
    lines = log
    rng = np.random.default_rng(1)
    B, T, U, H, V = 4, 50, 20, 64, 64
    labels = rng.integers(1, V, size=(B, U)).astype(np.int32)
    logit_lengths = np.array([T, 41, 50, 17], np.int32)
    label_lengths = np.array([U, 20, 3, 11], np.int32)
    steps = logit_lengths + label_lengths
    for dtype in (tf.float16, tf.bfloat16):
        u = UNIT_ROUNDOFF[dtype]
        logits = np.clip(1e4 * rng.normal(size=(B, T, U + 1, V)) / 2, -1e4, 1e4)
        logits = tf.cast(tf.cast(logits, dtype), tf.float64).numpy()
        got = with_gradients(lambda x: tf_rnnt.rnnt_loss(x, labels, logit_lengths,
                                                         label_lengths), [logits], GPU, dtype)
        weights = np.linspace(0.5, 1.5, B)
        costs, grads = oracle.rnnt_loss(logits, labels, logit_lengths, label_lengths,
                                        upstream=weights)
        expect(all_finite(got), f"rnnt_loss {dtype.name}: non-finite")
        cost_error = max_relative_error(got[0], costs)
        grad_error = max_relative_error(got[1], grads)
        grad_tolerance = RTOL + 4 * U32 * float(np.max(costs)) + 3 * u
        lines.append(f"rnnt_loss {dtype.name}: max |logit| {np.max(np.abs(logits)):.0f}, costs "
                     f"{cost_error:.1e}, d logits {grad_error:.1e} (tolerance "
                     f"{grad_tolerance:.1e}) vs float64 oracle")
        expect(cost_error <= RTOL, f"rnnt_loss {dtype.name} costs")
        expect(grad_error <= grad_tolerance, f"rnnt_loss {dtype.name} gradients")

        encoder = rng.normal(size=(B, T, H))
        predictor = rng.normal(size=(B, U + 1, H))
        kernel = rng.normal(size=(H, V))
        scale = 1e4 / np.max(np.abs(oracle.joint_logits(encoder, predictor, kernel,
                                                        np.zeros(V))))
        params = [tf.cast(tf.cast(x, dtype), tf.float64).numpy()
                  for x in (encoder, predictor, kernel * scale, 100 * rng.normal(size=V))]
        max_logit = float(np.max(np.abs(oracle.joint_logits(*params))))
        expected = oracle.flash_rnnt_loss(*params, labels, logit_lengths, label_lengths)
        for mode in ("tiled", "untiled"):
            got = with_gradients(lambda *p: tf_rnnt.flash_rnnt_loss(
                *p, labels, logit_lengths, label_lengths, mode=mode), params, GPU, dtype)
            expect(all_finite(got), f"flash {mode} {dtype.name}: non-finite")
            # Joint values rounded to the dtype move the logits by <= u * max|logit|; each of
            # a path's T + U lattice entries by twice that.
            cost_bound = RTOL * expected[0] + 4 * u * max_logit * steps
            worst = float(np.max(np.abs(got[0] - expected[0]) / cost_bound))
            lines.append(f"flash {mode} {dtype.name}: max |logit| {max_logit:.0f}, costs use "
                         f"{worst:.2f} of their bound, gradients finite")
            expect(worst <= 1.0, f"flash {mode} {dtype.name} costs")

        # Logits of exactly +-1e4: finite costs and gradients.
        extreme = rng.choice([-1e4, 1e4], size=(2, 30, 11, 32))
        extreme_labels = rng.integers(1, 32, size=(2, 10)).astype(np.int32)
        got = with_gradients(lambda x: tf_rnnt.rnnt_loss(x, extreme_labels, [30, 20], [10, 5]),
                             [extreme], GPU, dtype)
        lines.append(f"rnnt_loss {dtype.name} at logits +-1e4: finite {all_finite(got)}")
        expect(all_finite(got), f"rnnt_loss {dtype.name} at +-1e4: non-finite")
        # A tanh joint whose kernel makes logits ~1e4: the true d predictor (a sum over frames)
        # can exceed float16's 65504, so finiteness is compared with the reference run in the
        # same precision.
        joint_args = [0.5 * rng.normal(size=(2, 30, 16)), 0.5 * rng.normal(size=(2, 11, 16)),
                      2.5e3 * rng.normal(size=(16, 32)), np.zeros(32)]
        joint_args = [tf.cast(tf.cast(x, dtype), tf.float64).numpy() for x in joint_args]
        joint_lengths = (extreme_labels, [30, 15], [10, 5])
        out = with_gradients(lambda *p: tf_rnnt.flash_rnnt_loss(*p, *joint_lengths), joint_args,
                             GPU, dtype)
        ref = with_gradients(lambda *p: tf_rnnt.reference.flash_rnnt_loss(*p, *joint_lengths),
                             joint_args, GPU, dtype)
        same = all(np.array_equal(np.isfinite(x), np.isfinite(y)) for x, y in zip(out, ref))
        lines.append(f"flash {dtype.name} at logits ~1e4: finite wherever the reference is: "
                     f"{same}")
        expect(same, f"flash {dtype.name} at logits ~1e4: finiteness differs from the reference")


def _concurrency_jobs(i):
    rng = np.random.default_rng(10 + i)
    B, T, U, H, V = 2 + i % 2, 30 + 17 * i, 5 + 3 * i, 16 + 8 * i, 20 + 9 * i
    params = [rng.normal(size=(B, T, H)).astype(np.float32),
              rng.normal(size=(B, U + 1, H)).astype(np.float32),
              (rng.normal(size=(H, V)) / np.sqrt(H)).astype(np.float32),
              rng.normal(size=(V,)).astype(np.float32)]
    logits = rng.normal(size=(B, T, U + 1, V)).astype(np.float32)
    labels = rng.integers(1, V, size=(B, U)).astype(np.int32)
    t_len = rng.integers(1, T + 1, size=B).astype(np.int32)
    u_len = rng.integers(0, U + 1, size=B).astype(np.int32)
    t_len[0], u_len[-1] = T, U

    def joint(**options):
        return lambda device: with_gradients(
            lambda *p: tf_rnnt.flash_rnnt_loss(*p, labels, t_len, u_len, **options), params,
            device)

    def lattice(device):
        with tf.device(device):
            return [tf_rnnt.joint_lattice(*[tf.constant(x) for x in params], labels, t_len,
                                          u_len, tile_size=37).numpy()]

    return [
        ("rnnt_loss", lambda device: with_gradients(
            lambda x: tf_rnnt.rnnt_loss(x, labels, t_len, u_len), [logits], device)),
        ("flash_tiled", joint(tile_size=50)),
        ("flash_untiled", joint(mode="untiled")),
        ("joint_lattice", lattice),
        ("lattice_loss", lambda device: with_gradients(
            lambda x: tf_rnnt.lattice_loss(x, t_len, u_len),
            [oracle.lattice_from_logits(logits, labels).astype(np.float32)], device)),
    ]


@check
def check_concurrency(log):
    threads = 4
    jobs = {i: _concurrency_jobs(i) for i in range(threads)}
    sequential = {(i, name): run(GPU) for i in range(threads) for name, run in jobs[i]}
    barrier = threading.Barrier(threads)

    def worker(i):
        barrier.wait()
        return {(i, name, repeat): run(GPU) for repeat in range(2) for name, run in jobs[i]}

    with ThreadPoolExecutor(threads) as pool:
        concurrent = {}
        for results in pool.map(worker, range(threads)):
            concurrent.update(results)
    mismatches = [key for key, got in concurrent.items()
                  if not all(np.array_equal(a, b) for a, b in zip(got, sequential[key[:2]]))]
    expect(not mismatches, f"concurrent results differ from sequential ones: {mismatches}")
    worst = 0.0
    for i in range(threads):
        for name, run in jobs[i]:
            cpu = run(CPU)
            gpu = sequential[(i, name)]
            if name == "joint_lattice":  # the unused label entry at u = U_b may be -inf or 0
                keep = np.isfinite(cpu[0]) & np.isfinite(gpu[0])
                cpu, gpu = [np.where(keep, cpu[0], 0.0)], [np.where(keep, gpu[0], 0.0)]
            worst = max(worst, max(max_relative_error(g, c) for g, c in zip(gpu, cpu)))
    log.append(f"{threads} threads x 5 calls x 2 rounds bitwise equal to sequential calls; "
               f"GPU vs CPU max relative error {worst:.1e}")
    expect(worst <= 1e-4, f"GPU vs CPU: {worst:.1e}")


@check
def check_oom(log):
    lines = log
    rng = np.random.default_rng(3)
    B, T, U, H, V = 1, 32, 31, 2, 48 * 2 ** 20  # 1024 nodes x 48M vocabulary: ~200 GB
    with tf.device(GPU):
        params = [tf.constant(rng.normal(size=(B, T, H)), tf.float32),
                  tf.constant(rng.normal(size=(B, U + 1, H)), tf.float32),
                  tf.random.normal([H, V], stddev=0.01), tf.zeros([V])]
        labels = tf.constant(rng.integers(1, 1000, size=(B, U)), tf.int32)
        for options in (dict(tile_size=1024), dict(memory_budget=2 ** 40),
                        dict(mode="untiled")):
            try:
                tf_rnnt.flash_rnnt_loss(*params, labels, [T], [U], **options).numpy()
                raise CheckFailed(f"{options}: no error for a ~200 GB request")
            except tf.errors.ResourceExhaustedError as error:
                message = str(error)
                names = [n for n in ("tile_size", "memory_budget", "tiled") if n in message]
                lines.append(f"{options}: ResourceExhaustedError naming {names}: "
                             f"{message[:160]}")
                expect("tile_size" in message and "memory_budget" in message,
                       f"{options}: the message does not say which setting to change")
        del params
    rng = np.random.default_rng(4)
    small = [rng.normal(size=s).astype(np.float32) for s in [(3, 6, 8), (3, 4, 8), (8, 11),
                                                             (11,)]]
    labels = rng.integers(1, 11, size=(3, 3)).astype(np.int32)
    t_len, u_len = np.array([6, 4, 5], np.int32), np.array([3, 1, 0], np.int32)
    got = with_gradients(lambda *p: tf_rnnt.flash_rnnt_loss(*p, labels, t_len, u_len), small,
                         GPU)
    expected = oracle.flash_rnnt_loss(*small, labels, t_len, u_len,
                                      upstream=np.linspace(0.5, 1.5, 3))
    error = max(max_relative_error(g, e) for g, e in zip(got, expected))
    lines.append(f"afterwards a normal call is right: {error:.1e} vs the float64 oracle")
    expect(error <= 1e-5, "the process is not usable after the error")


@check
def check_determinism(log):
    rng = np.random.default_rng(5)
    B, T, U, H, V = 4, 300, 60, 64, 128
    params = [rng.normal(size=(B, T, H)).astype(np.float32) / 2,
              rng.normal(size=(B, U + 1, H)).astype(np.float32) / 2,
              (rng.normal(size=(H, V)) / np.sqrt(H)).astype(np.float32),
              rng.normal(size=(V,)).astype(np.float32)]
    logits = rng.normal(size=(B, T, U + 1, V)).astype(np.float32)
    labels = rng.integers(1, V, size=(B, U)).astype(np.int32)
    t_len, u_len = np.array([T, 250, 123, 300], np.int32), np.array([U, 60, 17, 0], np.int32)
    # V = 257: the GPU pads the logits rows to 264 columns.
    wide_params = params[:2] + [(rng.normal(size=(H, 257)) / np.sqrt(H)).astype(np.float32),
                                rng.normal(size=(257,)).astype(np.float32)]
    cases = {
        "rnnt_loss": lambda: with_gradients(
            lambda x: tf_rnnt.rnnt_loss(x, labels, t_len, u_len), [logits], GPU),
        "flash_default": lambda: with_gradients(
            lambda *p: tf_rnnt.flash_rnnt_loss(*p, labels, t_len, u_len), params, GPU),
        "flash_tile_1000": lambda: with_gradients(
            lambda *p: tf_rnnt.flash_rnnt_loss(*p, labels, t_len, u_len, tile_size=1000),
            params, GPU),
        "flash_untiled": lambda: with_gradients(
            lambda *p: tf_rnnt.flash_rnnt_loss(*p, labels, t_len, u_len, mode="untiled"),
            params, GPU),
        "flash_v257": lambda: with_gradients(
            lambda *p: tf_rnnt.flash_rnnt_loss(*p, labels, t_len, u_len, tile_size=1000),
            wide_params, GPU),
        "samplewise": lambda: with_gradients(
            lambda *p: tf_rnnt.samplewise_rnnt_loss(*p, labels, t_len, u_len,
                                                    parallel_iterations=4), params, GPU),
    }
    lines, failures = log, []
    for enabled in (False, True):
        if enabled:
            tf.config.experimental.enable_op_determinism()
        for name, run in cases.items():
            try:
                first, second = run(), run()
            except Exception as error:  # an op may refuse under op determinism, saying so
                text = f"{type(error).__name__}: {str(error)[:200]}"
                lines.append(f"determinism={enabled} {name}: {text}")
                if not (enabled and "determinis" in str(error).lower()):
                    failures.append(name)
                continue
            equal = all(np.array_equal(a, b) for a, b in zip(first, second))
            finite = all_finite(first)
            lines.append(f"determinism={enabled} {name}: bitwise equal {equal}, finite {finite}")
            # The compiled ops are deterministic without the flag too (no atomics); samplewise
            # runs TensorFlow's own kernels, which promise it only with the flag.
            if not finite or (not equal and (enabled or name != "samplewise")):
                failures.append(f"{name} (determinism={enabled})")
    expect(not failures, f"not deterministic: {failures}")


# ------------------------------------------------------------------------------ main

def main(argv):
    global GPU
    if "--cpu-dry-run" in argv:  # exercise the script where there is no GPU (CPU vs CPU)
        argv = [a for a in argv if a != "--cpu-dry-run"]
        GPU = CPU
    elif not tf.config.list_physical_devices("GPU"):
        print("FAIL robustness_gpu: TensorFlow sees no GPU (--cpu-dry-run runs it on the CPU)")
        return 2
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)
    tf.config.experimental.enable_tensor_float_32_execution(False)
    names = argv or list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        print(f"unknown checks {unknown}; choose from {list(CHECKS)}")
        return 2
    # Determinism last: op determinism cannot be switched off again.
    names = sorted(names, key=lambda n: n == "determinism")
    failed = []
    for name in names:
        start = time.time()
        log = []
        try:
            CHECKS[name](log)
            status = "PASS"
        except CheckFailed as error:
            status = "FAIL"
            log.append(f"FAILED: {error}")
        except Exception:  # report every check, whatever breaks
            status = "FAIL"
            log.extend(traceback.format_exc().splitlines()[-12:])
        if status == "FAIL":
            failed.append(name)
        print(f"{status} {name} ({time.time() - start:.1f} s)")
        for line in log:
            print(f"    {line}")
        sys.stdout.flush()
    print("FAILED: " + ", ".join(failed) if failed else "ALL PASSED")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
