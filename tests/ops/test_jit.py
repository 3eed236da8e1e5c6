"""XLA (`jit_compile`): the ops and the Keras layer/losses inside compiled functions.

With XLA kernels in the op library, each op lowers to a custom call (on the CPU and the GPU);
without them (a library built against TensorFlow 2.17), the Python wrappers build the reference
math under XLA, and `RNNTJoint` keeps Keras from picking XLA. All paths must give the non-jit
results; the oracle is `tf_rnnt.reference` (pure TF + autodiff). The GPU cases skip without a
GPU.
"""

import os
import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from rnnt_testing import DEVICES, GradientRecorder, requires_gpu

import tf_rnnt
from tf_rnnt import ops as rnnt_ops
from tf_rnnt import reference
from tf_rnnt.keras import FlashRNNTLoss, RNNTJoint, RNNTLoss

pytestmark = pytest.mark.skipif(not rnnt_ops.library_available(), reason="op library not built")

B, T, U, V, H = 3, 7, 4, 11, 8
FEATURES, PAD = 5, -1


def _problem(seed=0, dtype=tf.float32):
    rng = np.random.default_rng(seed)
    logit_lengths = np.array([T, 4, 6], np.int32)
    label_lengths = np.array([U, 2, 0], np.int32)
    labels = rng.integers(1, V - 1, size=(B, U)).astype(np.int32)  # neither 0 nor V-1 (blanks)
    encoder = tf.constant(rng.normal(size=(B, T, H)), dtype)
    predictor = tf.constant(rng.normal(size=(B, U + 1, H)), dtype)
    kernel = tf.constant(rng.normal(size=(H, V)) / np.sqrt(H), dtype)
    bias = tf.constant(rng.normal(size=(V,)) * 0.1, dtype)
    logits = tf.constant(rng.normal(size=(B, T, U + 1, V)), dtype)
    return dict(encoder=encoder, predictor=predictor, kernel=kernel, bias=bias, logits=logits,
                labels=labels, logit_lengths=logit_lengths, label_lengths=label_lengths)


def _flash(p, **kwargs):
    def loss(enc, pred, kernel, bias):
        return tf_rnnt.flash_rnnt_loss(enc, pred, kernel, bias, p["labels"], p["logit_lengths"],
                                       p["label_lengths"], **kwargs)
    return loss, (p["encoder"], p["predictor"], p["kernel"], p["bias"])


def _flash_reference(p, **kwargs):
    def loss(enc, pred, kernel, bias):
        return reference.flash_rnnt_loss(enc, pred, kernel, bias, p["labels"], p["logit_lengths"],
                                         p["label_lengths"], **kwargs)
    return loss


def _logits(p, **kwargs):
    def loss(logits):
        return tf_rnnt.rnnt_loss(logits, p["labels"], p["logit_lengths"], p["label_lengths"],
                                 **kwargs)
    return loss, (p["logits"],)


def _logits_reference(p, **kwargs):
    def loss(logits):
        return reference.rnnt_loss(logits, p["labels"], p["logit_lengths"], p["label_lengths"],
                                   **kwargs)
    return loss


def _value_and_grads(loss_fn, args, jit_compile, device="/CPU:0"):
    @tf.function(jit_compile=jit_compile)
    def step(*xs):
        with tf.GradientTape() as tape:
            tape.watch(xs)
            costs = loss_fn(*xs)
            total = tf.reduce_sum(costs * tf.range(1.0, B + 1.0))  # distinct upstream per sample
        return costs, tape.gradient(total, xs)

    with tf.device(device):
        costs, grads = step(*args)
    return costs.numpy(), [tf.cast(g, tf.float32).numpy() for g in grads], step


def _assert_close(actual, expected, rtol, what):
    expected = np.asarray(expected, np.float64)
    np.testing.assert_allclose(actual, expected, rtol=rtol,
                               atol=rtol * max(np.max(np.abs(expected)), 1.0), err_msg=what)


def _hlo(step, args):
    return step.experimental_get_compiler_ir(*args)(stage="hlo")


CASES = [
    ("flash", dict()),
    ("flash", dict(activation="relu", blank=-1, tile_size=5)),
    ("flash", dict(mode="untiled", fastemit_lambda=0.5, clamp=0.3)),
    ("flash", dict(memory_budget=4096)),  # tiles of a few dozen nodes
    ("logits", dict()),
    ("logits", dict(blank=-1, fastemit_lambda=0.25)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head,kwargs", CASES)
def test_jit_equals_eager_and_reference(head, kwargs, device):
    p = _problem()
    op_kwargs = dict(kwargs)
    ref_kwargs = {k: v for k, v in kwargs.items()
                  if k not in ("mode", "tile_size", "memory_budget")}
    if head == "flash":
        loss_fn, args = _flash(p, **op_kwargs)
        ref_fn = _flash_reference(p, **ref_kwargs)
    else:
        loss_fn, args = _logits(p, **op_kwargs)
        ref_fn = _logits_reference(p, **ref_kwargs)
    costs_jit, grads_jit, step = _value_and_grads(loss_fn, args, True, device)
    costs, grads, _ = _value_and_grads(loss_fn, args, False, device)
    costs_ref, grads_ref, _ = _value_and_grads(ref_fn, args, False, device)
    _assert_close(costs_jit, costs, 1e-5, "costs: jit vs no jit")
    _assert_close(costs_jit, costs_ref, 1e-5, "costs: jit vs reference")
    for i, (g_jit, g, g_ref) in enumerate(zip(grads_jit, grads, grads_ref)):
        _assert_close(g_jit, g, 1e-5, f"gradient {i}: jit vs no jit")
        _assert_close(g_jit, g_ref, 1e-5, f"gradient {i}: jit vs reference")
    if rnnt_ops.xla_kernels_available():
        # The compiled ops ran as custom calls, not as the reference math.
        with tf.device(device):
            hlo = _hlo(step, args)
        target = "tf_rnnt_joint_lattice" if head == "flash" else "tf_rnnt_logits_to_lattice"
        for name in (target, target + "_grad", "tf_rnnt_lattice_loss"):
            assert f'custom_call_target="{name}"' in hlo, name
        assert "u8[" in hlo  # workspaces are custom-call results XLA allocates
    else:
        with tf.device(device):
            assert "tf_rnnt_" not in _hlo(step, args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_jit_half_precision_equals_eager(dtype, device):
    p = _problem(1, dtype)
    for loss_fn, args in (_flash(p), _logits(p)):
        costs_jit, grads_jit, _ = _value_and_grads(loss_fn, args, True, device)
        costs, grads, _ = _value_and_grads(loss_fn, args, False, device)
        # The reference fallback computes the joint and logits in the half dtype, the ops in
        # float32 from the half inputs.
        _assert_close(costs_jit, costs, 1e-5 if rnnt_ops.xla_kernels_available() else 1e-3,
                      "costs")
        for i, (g_jit, g) in enumerate(zip(grads_jit, grads)):
            _assert_close(g_jit, g, 1e-2, f"gradient {i}")


@pytest.mark.skipif(not rnnt_ops.library_available() or not rnnt_ops.xla_kernels_available(),
                    reason="op library has no XLA kernels for these devices")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head", ["flash", "logits"])
def test_jit_rejects_bad_lengths_and_labels(head, device):
    p = _problem()
    bad_lengths = dict(p, logit_lengths=np.array([T, 0, 6], np.int32))
    bad_labels = dict(p, labels=np.where(np.arange(U) == 1, V, p["labels"]).astype(np.int32))
    for problem, pattern in ((bad_lengths, r"logit_lengths\[1\] = 0 must be in \[1, 7\]"),
                             (bad_labels, r"labels\[0, 1\] = 11 must be in \[0, 11\)")):
        loss_fn, args = (_flash if head == "flash" else _logits)(problem)
        with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
            _value_and_grads(loss_fn, args, True, device)


def test_fallback_without_xla_kernels_equals_eager_and_warns(monkeypatch):
    """A library without XLA kernels: under XLA the wrappers build the reference math."""
    p = _problem(2)
    monkeypatch.setattr(rnnt_ops, "_XLA_KERNELS", False)
    monkeypatch.setattr(rnnt_ops, "_XLA_WARNED", set())
    for (loss_fn, args), op_names in ((_flash(p), ("joint_lattice", "lattice_loss")),
                                      (_logits(p), ("logits_to_lattice",))):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            costs_jit, grads_jit, step = _value_and_grads(loss_fn, args, True)
        messages = " ".join(str(w.message) for w in caught)
        for name in op_names:
            assert f"tf_rnnt.{name} (used by " in messages, (name, messages)
        assert "tf_rnnt_" not in _hlo(step, args)
        costs, grads, _ = _value_and_grads(loss_fn, args, False)
        _assert_close(costs_jit, costs, 1e-5, "costs")
        for i, (g_jit, g) in enumerate(zip(grads_jit, grads)):
            _assert_close(g_jit, g, 1e-5, f"gradient {i}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monkeypatch.setattr(rnnt_ops, "_XLA_WARNED", set())
        loss_fn, args = _flash(p)
        _value_and_grads(loss_fn, args, True)
    joint_message = [str(w.message) for w in caught if "tf_rnnt.joint_lattice" in str(w.message)]
    assert joint_message and "keras.RNNTJoint" in joint_message[0]
    assert "jit_compile=False" in joint_message[0]


# ----------------------------------------------------------------------------------------------
# Keras: model.compile(jit_compile=...) with RNNTJoint + FlashRNNTLoss and with RNNTLoss.
# ----------------------------------------------------------------------------------------------
class ShiftedLabels(keras.layers.Layer):
    """Predictor input: blank (0) then the labels, padding mapped to 0."""

    def call(self, labels):
        labels = tf.where(labels < 0, tf.zeros_like(labels), labels)
        return tf.pad(labels, [[0, 0], [1, 0]])


class PlainJoint(keras.layers.Layer):
    """RNNTJoint's full logits in plain TensorFlow, for RNNTLoss in a model without RNNTJoint;
    carries the encoder's mask."""

    def build(self, input_shape):
        encoder_dim, predictor_dim = input_shape[0][-1], input_shape[1][-1]
        self.encoder_kernel = self.add_weight(name="encoder_kernel", shape=(encoder_dim, H))
        self.encoder_bias = self.add_weight(name="encoder_bias", shape=(H,), initializer="zeros")
        self.predictor_kernel = self.add_weight(name="predictor_kernel",
                                                shape=(predictor_dim, H))
        self.kernel = self.add_weight(name="kernel", shape=(H, V))
        self.bias = self.add_weight(name="bias", shape=(V,), initializer="zeros")

    def call(self, inputs, mask=None):
        encoder = tf.einsum("btd,dh->bth", inputs[0], self.encoder_kernel) + self.encoder_bias
        predictor = tf.einsum("bud,dh->buh", inputs[1], self.predictor_kernel)
        return reference.joint_logits(encoder, predictor, self.kernel, self.bias, "tanh")

    def compute_mask(self, inputs, mask=None):
        return None if mask is None else mask[0]


def _model(head):
    keras.utils.set_random_seed(0)
    features = keras.Input((T, FEATURES), name="features")
    labels = keras.Input((U,), dtype="int32", name="labels")
    encoder = keras.layers.Masking(0.0)(features)
    encoder = keras.layers.Dense(12, activation="tanh")(encoder)
    predictor = keras.layers.Embedding(V, 10)(ShiftedLabels()(labels))
    predictor = keras.layers.Dense(10, activation="tanh")(predictor)
    if head == "flash":
        joint = RNNTJoint(V, H, name="joint")
        output, loss = joint([encoder, predictor, labels]), FlashRNNTLoss()
    else:
        joint = PlainJoint(name="plain_joint")
        output, loss = joint([encoder, predictor]), RNNTLoss(blank=0)
    model = keras.Model([features, labels], output)
    return model, keras.Model([features, labels], [encoder, predictor]), joint, loss


def _batch(seed=3):
    rng = np.random.default_rng(seed)
    frames, num_labels = np.array([T, 3, 5, 6]), np.array([U, 1, 3, 0])
    features = rng.normal(size=(4, T, FEATURES)).astype(np.float32)
    features[np.abs(features) < 1e-3] = 1e-3
    features[np.arange(T)[None, :] >= frames[:, None]] = 0.0
    labels = rng.integers(1, V, size=(4, U)).astype(np.int32)
    labels[np.arange(U)[None, :] >= num_labels[:, None]] = PAD
    return features, labels, frames, num_labels


def _train_step(head, jit_compile):
    model, _, _, loss = _model(head)
    recorder = GradientRecorder()
    model.compile(optimizer=recorder, loss=loss, jit_compile=jit_compile)
    features, labels, _, _ = _batch()
    value = model.train_on_batch([features, labels], labels)
    return model, float(value), [v.numpy() for v in recorder.gradients]


def _reference_step(head):
    """Loss and gradients of the same model with the joint and loss written in pure TF."""
    model, features_model, joint, _ = _model(head)
    features, labels, frames, num_labels = _batch()
    with tf.GradientTape() as tape:
        enc_in, pred_in = features_model([features, labels], training=True)
        encoder = tf.einsum("btd,dh->bth", enc_in, joint.encoder_kernel) + joint.encoder_bias
        predictor = tf.einsum("bud,dh->buh", pred_in, joint.predictor_kernel)
        logits = reference.joint_logits(encoder, predictor, joint.kernel, joint.bias, "tanh")
        clean = np.where(labels == PAD, 0, labels)
        loss = tf.reduce_mean(reference.rnnt_loss(logits, clean, frames, num_labels))
    grads = tape.gradient(loss, model.trainable_variables)
    return float(loss), [tf.convert_to_tensor(g).numpy() for g in grads]


@pytest.mark.parametrize("head", ["flash", "logits"])
@pytest.mark.parametrize("path", ["xla_kernels", "reference_fallback"])
def test_keras_jit_compile_trains_like_eager(head, path, monkeypatch):
    if path == "reference_fallback":
        monkeypatch.setattr(rnnt_ops, "_XLA_KERNELS", False)
    elif not rnnt_ops.xla_kernels_available():
        pytest.skip("op library has no XLA kernels for these devices")
    loss_ref, grads_ref = _reference_step(head)
    _, loss_eager, grads_eager = _train_step(head, False)
    for jit_compile in (True, "auto"):
        # Keras' "auto" compiles with XLA where a GPU is visible.
        uses_xla = jit_compile is True or bool(tf.config.list_physical_devices("GPU"))
        if uses_xla and path == "reference_fallback" and head == "logits":
            # RNNTLoss's input checks need the op library's XLA kernels: without them it
            # refuses XLA rather than train unchecked.
            with pytest.raises(rnnt_ops.XlaCheckUnavailableError, match="jit_compile=False"):
                _train_step(head, jit_compile)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # RNNTJoint's warning without XLA kernels
            model, loss_jit, grads_jit = _train_step(head, jit_compile)
        if jit_compile is True:
            # Without XLA kernels RNNTJoint turns XLA off.
            assert model.jit_compile is (path == "xla_kernels")
        assert np.isfinite(loss_jit)
        np.testing.assert_allclose(loss_jit, loss_eager, rtol=1e-5)
        np.testing.assert_allclose(loss_jit, loss_ref, rtol=1e-5)
        for i, (g_jit, g, g_ref) in enumerate(zip(grads_jit, grads_eager, grads_ref)):
            _assert_close(g_jit, g, 1e-5, f"{jit_compile}: gradient {i} vs no jit")
            _assert_close(g_jit, g_ref, 1e-5, f"{jit_compile}: gradient {i} vs reference")


def test_rnnt_joint_supports_jit():
    joint = RNNTJoint(V, H)
    assert joint.supports_jit == rnnt_ops.xla_kernels_available()
    joint.supports_jit = False
    assert joint.supports_jit is False


def test_rnnt_joint_without_xla_kernels_keeps_keras_off_xla(monkeypatch):
    """Where tf_rnnt's XLA kernels do not run, RNNTJoint.supports_jit is False (one warning per
    layer), so Keras compiles the model without XLA and keeps the fused joint."""
    monkeypatch.setattr(rnnt_ops, "xla_kernels_available", lambda: False)
    monkeypatch.setattr(rnnt_ops, "_XLA_WARNED", set())
    joint = RNNTJoint(V, H, name="my_joint")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert joint.supports_jit is False
        assert joint.supports_jit is False
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert "RNNTJoint 'my_joint'" in messages[0] and "jit_compile=False" in messages[0]
    loss_ref, grads_ref = _reference_step("flash")
    for jit_compile in ("auto", True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model, loss, grads = _train_step("flash", jit_compile)
        assert model.jit_compile is False, jit_compile
        messages = " ".join(str(w.message) for w in caught)
        assert "tf_rnnt.joint_lattice (used by" not in messages  # the fused op, not the fallback
        np.testing.assert_allclose(loss, loss_ref, rtol=1e-5)
        for i, (g, g_ref) in enumerate(zip(grads, grads_ref)):
            _assert_close(g, g_ref, 1e-5, f"{jit_compile}: gradient {i}")


@requires_gpu
@pytest.mark.parametrize("head", ["flash", "logits"])
def test_keras_jit_on_gpu_trains_with_the_xla_kernels(head, monkeypatch):
    """On a GPU Keras compiles the training step with XLA under "auto" and jit_compile=True, and
    the ops run as tf_rnnt's custom calls (no reference fallback)."""
    assert rnnt_ops.xla_kernels_available()
    monkeypatch.setattr(rnnt_ops, "_XLA_WARNED", set())
    loss_ref, grads_ref = _reference_step(head)
    for jit_compile in ("auto", True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model, loss, grads = _train_step(head, jit_compile)
        messages = " ".join(str(w.message) for w in caught)
        assert model.jit_compile is True, jit_compile
        assert "(used by" not in messages and "RNNTJoint '" not in messages, messages
        np.testing.assert_allclose(loss, loss_ref, rtol=1e-4)
        for i, (g, g_ref) in enumerate(zip(grads, grads_ref)):
            _assert_close(g, g_ref, 1e-3, f"{jit_compile}: gradient {i}")
    # model.fit under XLA, and the compiled step holds the custom calls.
    features, labels, _, _ = _batch()
    model, _, _, loss = _model(head)
    model.compile(optimizer="adam", loss=loss, jit_compile=True)
    history = model.fit([features, labels], labels, batch_size=4, epochs=3, verbose=0)
    assert model.jit_compile is True
    assert np.all(np.isfinite(history.history["loss"]))
    data = ((tf.constant(features), tf.constant(labels)), tf.constant(labels))
    with tf.device("/GPU:0"):
        hlo = tf.function(model.train_step, jit_compile=True).experimental_get_compiler_ir(
            data)(stage="hlo")
    target = "tf_rnnt_joint_lattice" if head == "flash" else "tf_rnnt_logits_to_lattice"
    for name in (target, target + "_grad", "tf_rnnt_lattice_loss"):
        assert f'custom_call_target="{name}"' in hlo, name


def test_library_loaded_after_the_first_xla_compilation():
    """TensorFlow registers XlaOpRegistry kernels once per process, at the first XLA
    compilation; the op library registers its XLA kernels itself, so loading it later works."""
    if not rnnt_ops.xla_kernels_available():
        pytest.skip("op library has no XLA kernels for these devices")
    script = textwrap.dedent("""
        import numpy as np, tensorflow as tf
        print(tf.function(lambda x: x * 2, jit_compile=True)(tf.ones([2])).numpy())
        import tf_rnnt
        logits = tf.constant(np.random.default_rng(0).normal(size=(1, 3, 2, 4)), tf.float32)
        step = tf.function(lambda x: tf_rnnt.rnnt_loss(x, [[1]], [3], [1]), jit_compile=True)
        eager = tf_rnnt.rnnt_loss(logits, [[1]], [3], [1])
        print("xla", float(step(logits)[0]), "eager", float(eager[0]))
        hlo = step.experimental_get_compiler_ir(logits)(stage="hlo")
        print("custom calls:", "tf_rnnt_lattice_loss" in hlo)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(tf_rnnt.__file__)))] +
        os.environ.get("PYTHONPATH", "").split(os.pathsep)), TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    words = out.stdout.split()
    xla, eager = float(words[words.index("xla") + 1]), float(words[words.index("eager") + 1])
    np.testing.assert_allclose(xla, eager, rtol=1e-5)
    assert "custom calls: True" in out.stdout
