"""tf_rnnt's XLA kernels on the GPU: each op under tf.function(jit_compile=True) on /GPU:0 against
the same op without XLA (costs and gradients), then a small Keras model trained with
model.compile(jit_compile=True). Prints PASS/FAIL per case; exit status 1 on any failure.

    python tests/gpu/xla_gpu_check.py
"""

import os
import sys
import traceback
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_rnnt  # noqa: E402
from tf_rnnt import ops as rnnt_ops  # noqa: E402
from tf_rnnt.keras import FlashRNNTLoss, RNNTJoint  # noqa: E402

tf.get_logger().setLevel("ERROR")  # retracing notes
# Exact float32 GEMMs, so that XLA and non-XLA runs compare tightly.
tf.config.experimental.enable_tensor_float_32_execution(False)
for _gpu in tf.config.list_physical_devices("GPU"):
    tf.config.experimental.set_memory_growth(_gpu, True)

B, T, U, V, H = 4, 40, 12, 96, 64
DEVICE = os.environ.get("XLA_CHECK_DEVICE", "/GPU:0")  # "/CPU:0": the same checks on the CPU
FAILURES = []
LOSS = ("tf_rnnt_lattice_loss",)
LOGITS = ("tf_rnnt_logits_to_lattice", "tf_rnnt_logits_to_lattice_grad")
JOINT = ("tf_rnnt_joint_lattice", "tf_rnnt_joint_lattice_grad")


def _problem(dtype, seed=0):
    rng = np.random.default_rng(seed)
    logit_lengths = np.array([T, 31, 17, 1], np.int32)
    label_lengths = np.array([U, 9, 0, 3], np.int32)
    labels = rng.integers(1, V - 1, size=(B, U)).astype(np.int32)  # blank is 0 or V - 1
    c = lambda x: tf.constant(x, dtype)  # noqa: E731
    return dict(encoder=c(rng.normal(size=(B, T, H))), predictor=c(rng.normal(size=(B, U + 1, H))),
                kernel=c(rng.normal(size=(H, V)) / np.sqrt(H)), bias=c(rng.normal(size=V) * 0.1),
                logits=c(rng.normal(size=(B, T, U + 1, V))),
                lattice=tf.constant(-rng.uniform(0.01, 3.0, size=(B, T, U + 1, 2)), tf.float32),
                labels=labels, logit_lengths=logit_lengths, label_lengths=label_lengths)


def _cases(p):
    """(name, custom-call targets, loss of the differentiated inputs, those inputs)."""
    lengths = (p["logit_lengths"], p["label_lengths"])
    flash = (p["encoder"], p["predictor"], p["kernel"], p["bias"])

    def flash_loss(**kwargs):
        return lambda e, q, k, b: tf_rnnt.flash_rnnt_loss(e, q, k, b, p["labels"], *lengths,
                                                          **kwargs)

    return [
        ("lattice_loss", LOSS,
         lambda lat: tf_rnnt.lattice_loss(lat, *lengths), (p["lattice"],)),
        ("rnnt_loss (logits_to_lattice)", LOGITS + LOSS,
         lambda x: tf_rnnt.rnnt_loss(x, p["labels"], *lengths, fastemit_lambda=0.1),
         (p["logits"],)),
        ("flash_rnnt_loss (joint_lattice)", JOINT + LOSS, flash_loss(), flash),
        ("flash_rnnt_loss tile_size=100", JOINT + LOSS, flash_loss(tile_size=100),
         flash),
        ("flash_rnnt_loss memory_budget=64KiB relu blank=-1", JOINT + LOSS,
         flash_loss(memory_budget=1 << 16, activation="relu", blank=-1), flash),
    ]


def _value_and_grads(loss_fn, args, jit_compile):
    @tf.function(jit_compile=jit_compile)
    def step(*xs):
        with tf.GradientTape() as tape:
            tape.watch(xs)
            costs = loss_fn(*xs)
            total = tf.reduce_sum(costs * tf.range(1.0, B + 1.0))
        return costs, tape.gradient(total, xs)

    with tf.device(DEVICE):
        costs, grads = step(*args)
    return costs.numpy(), [tf.cast(g, tf.float32).numpy() for g in grads], step


def _close(actual, expected, rtol):
    scale = max(float(np.max(np.abs(expected))), 1.0)
    return np.allclose(actual, expected, rtol=rtol, atol=rtol * scale), float(
        np.max(np.abs(np.asarray(actual, np.float64) - expected)))


def _report(name, ok, detail=""):
    print(f"{'PASS' if ok else 'FAIL'}  {name}{'  ' + detail if detail else ''}", flush=True)
    if not ok:
        FAILURES.append(name)


def check_ops():
    for dtype in (tf.float32, tf.bfloat16):
        p = _problem(dtype)
        rtol_costs, rtol_grads = (1e-4, 1e-4) if dtype == tf.float32 else (1e-3, 2e-2)
        for name, targets, loss_fn, args in _cases(p):
            if name == "lattice_loss" and dtype != tf.float32:
                continue  # the lattice is float32 whatever the model's dtype
            case = f"{name} {dtype.name}"
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    costs_jit, grads_jit, step = _value_and_grads(loss_fn, args, True)
                fallback = [str(w.message) for w in caught if "(used by" in str(w.message)]
                costs, grads, _ = _value_and_grads(loss_fn, args, False)
                with tf.device(DEVICE):
                    hlo = step.experimental_get_compiler_ir(*args)(stage="hlo")
                details, ok = [], not fallback
                if fallback:
                    details.append("reference fallback: " + fallback[0][:120])
                for what in targets:
                    if f'custom_call_target="{what}"' not in hlo:
                        ok = False
                        details.append(f"no {what} custom call")
                good, err = _close(costs_jit, costs, rtol_costs)
                ok &= good and bool(np.all(np.isfinite(costs_jit)))
                details.append(f"costs max|d|={err:.2e}")
                for i, (g_jit, g) in enumerate(zip(grads_jit, grads)):
                    good, err = _close(g_jit, g, rtol_grads)
                    ok &= good
                    details.append(f"grad{i} max|d|={err:.2e}")
                _report(case, ok, " ".join(details))
            except Exception:  # noqa: BLE001
                traceback.print_exc()
                _report(case, False, "raised")


def check_keras():
    name = "keras Conv1D + RNNTJoint + FlashRNNTLoss, jit_compile=True, 3 steps"
    try:
        keras.utils.set_random_seed(0)
        features = keras.Input((T, 8), name="features")
        labels = keras.Input((U,), dtype="int32", name="labels")
        encoder = keras.layers.Conv1D(32, 3, padding="same", activation="relu")(features)
        encoder = keras.layers.Conv1D(32, 3, padding="same", activation="tanh")(encoder)
        shifted = keras.layers.Lambda(
            lambda y: tf.pad(tf.maximum(y, 0), [[0, 0], [1, 0]]))(labels)
        predictor = keras.layers.Embedding(V, 24)(shifted)
        joint = RNNTJoint(V, H, all_frames_valid=True, name="joint")
        lattice = joint([encoder, predictor, labels])
        model = keras.Model([features, labels], lattice)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.compile(optimizer="adam", loss=FlashRNNTLoss(), jit_compile=True)
            rng = np.random.default_rng(1)
            x = rng.normal(size=(3 * B, T, 8)).astype(np.float32)
            y = rng.integers(1, V, size=(3 * B, U)).astype(np.int32)
            y[np.arange(U)[None, :] >= rng.integers(0, U + 1, size=3 * B)[:, None]] = -1
            with tf.device(DEVICE):
                history = model.fit([x, y], y, batch_size=B, epochs=1, verbose=0)
        losses = history.history["loss"]
        messages = [str(w.message) for w in caught
                    if "(used by" in str(w.message) or "RNNTJoint '" in str(w.message)]
        data = ((tf.constant(x[:B]), tf.constant(y[:B])), tf.constant(y[:B]))
        with tf.device(DEVICE):
            hlo = tf.function(model.train_step, jit_compile=True).experimental_get_compiler_ir(
                data)(stage="hlo")
        custom = 'custom_call_target="tf_rnnt_joint_lattice"' in hlo
        print(f"keras: model.jit_compile={model.jit_compile} after fit, loss={losses}, "
              f"compiled train step holds tf_rnnt_joint_lattice: {custom}, "
              f"warnings: {messages or 'none'}")
        ok = model.jit_compile is True and custom and not messages and np.all(np.isfinite(losses))
        _report(name, bool(ok), f"XLA used: {model.jit_compile is True and custom}")
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        _report(name, False, "raised")


def main():
    if DEVICE.startswith("/GPU") and not tf.config.list_physical_devices("GPU"):
        print("FAIL  no GPU visible")
        return 1
    info = tf_rnnt.build_info()
    print(f"library: {info.get('library')}  xla_kernels_available: "
          f"{rnnt_ops.xla_kernels_available()}  registered: "
          f"{sorted(rnnt_ops._registered_kernel_devices())}", flush=True)
    _report("XLA kernels for the visible devices", rnnt_ops.xla_kernels_available())
    check_ops()
    check_keras()
    print("ALL PASSED" if not FAILURES else f"FAILED: {len(FAILURES)}: {FAILURES}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
