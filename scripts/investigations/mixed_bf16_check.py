"""Investigation: where a non-finite gradient first appears in mixed-precision training of the
Keras test model. A tool for the next mixed-precision NaN.

    python scripts/investigations/mixed_bf16_check.py [--variants a,b,...] [--steps 6]

On a GPU, tests/keras_api/test_keras.py::test_mixed_precision_trains_without_nan[mixed_bfloat16]
once failed (the predictor-side weights were NaN after the first Adam step) while the float32 and
mixed_float16 runs and every op-level bfloat16 test passed (the cause was Keras' cuDNN LSTM). This
script trains the test's model (seed 3, Adam 0.01, batches of 4) step by step in several variants
and prints, per step, the loss and the variables whose gradient is not finite.
At the first bad step it also compares the joint op's four gradients on those inputs with
tf_rnnt.reference in the same precision. Variants:
  bf16        mixed_bfloat16, as the test
  bf16-untiled  the same with the joint in untiled mode
  bf16-nocudnn  the same with the LSTMs off cuDNN (use_cudnn=False)
  bf16-cpu    the same, whole step on the CPU
  bf16-jointf32  the same with the joint layer in float32
  f16-noscale mixed_float16 without loss scaling (a NaN there is no longer skipped)
  f32         float32
"""

import argparse
import functools
import os
import sys

import keras
import numpy as np
import tensorflow as tf

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The checkout, and test_keras with what it imports (tests/, benchmarks/).
sys.path[:0] = [_REPO, os.path.join(_REPO, "tests", "keras_api"), os.path.join(_REPO, "tests"),
                os.path.join(_REPO, "benchmarks")]

import test_keras as tk  # noqa: E402

import tf_rnnt  # noqa: E402
from tf_rnnt import reference  # noqa: E402
from tf_rnnt.keras import FlashRNNTLoss  # noqa: E402

VARIANTS = {
    "bf16": dict(policy="mixed_bfloat16"),
    "bf16-untiled": dict(policy="mixed_bfloat16", mode="untiled"),
    "bf16-nocudnn": dict(policy="mixed_bfloat16", cudnn=False),
    "bf16-cpu": dict(policy="mixed_bfloat16", device="/CPU:0"),
    "bf16-jointf32": dict(policy="mixed_bfloat16", joint_dtype="float32"),
    "f16-noscale": dict(policy="mixed_float16"),
    "f32": dict(policy="float32"),
}


PROBE = False


def finite(x):
    return bool(np.all(np.isfinite(np.asarray(tf.cast(tf.convert_to_tensor(x), tf.float32)))))


def op_gradients(fn, args):
    params = [tf.Variable(x) for x in args[:4]]
    with tf.GradientTape() as tape:
        costs = fn(*params, *args[4:])
        total = tf.reduce_sum(tf.cast(costs, tf.float32))
    return [costs] + tape.gradient(total, params)


def compare_op(model, features_model, features, labels, device):
    """The joint op's gradients on the model's current projected inputs vs the reference."""
    frame_lengths, label_lengths = tk.batch_lengths(features, labels)
    joint = model.get_layer("joint")
    encoder_out, predictor_out = features_model([features, labels])
    encoder, predictor = joint._project(encoder_out, predictor_out)
    print(f"    projected inputs finite: encoder {finite(encoder)}, predictor {finite(predictor)};"
          f" max |encoder| {float(tf.reduce_max(tf.abs(tf.cast(encoder, tf.float32)))):.3g},"
          f" max |predictor| {float(tf.reduce_max(tf.abs(tf.cast(predictor, tf.float32)))):.3g}")
    clean_labels = tf.maximum(tf.cast(labels, tf.int32), 1)
    op_args = [tf.identity(encoder), tf.identity(predictor), joint._weight(joint.kernel),
               joint._weight(joint.bias), clean_labels, tf.constant(frame_lengths),
               tf.constant(label_lengths), 0, joint.activation, joint.mode]
    with tf.device(device):
        got = op_gradients(tf_rnnt.flash_rnnt_loss, op_args)
    expected = op_gradients(reference.flash_rnnt_loss, op_args[:-1])
    for name, g, e in zip(("costs", "d encoder", "d predictor", "d kernel", "d bias"), got,
                          expected):
        g32, e32 = (np.asarray(tf.cast(x, tf.float32)) for x in (g, e))
        with np.errstate(invalid="ignore"):
            error = float(np.max(np.abs(g32 - e32)) / max(float(np.max(np.abs(e32))), 1e-30))
        bad = np.argwhere(~np.isfinite(g32))
        print(f"    op {name}: finite {finite(g)} (reference {finite(e)}), max rel diff "
              f"{error:.2e}" + (f", first non-finite at {bad[:4].tolist()}" if len(bad) else ""))


def stats(x):
    x = np.asarray(tf.cast(tf.convert_to_tensor(x), tf.float32))
    return f"finite {bool(np.all(np.isfinite(x)))}, max|.| {float(np.nanmax(np.abs(x))):.3g}"


def probe(model, features_model, batch, loss_fn, graph):
    """Step 0 split at the joint's inputs: d encoder_out / d predictor_out from the joint op
    and from the reference joint, then the encoder/predictor weights' gradients from each."""
    joint = model.get_layer("joint")
    (features, labels), y_true = batch
    frame_lengths, label_lengths = tk.batch_lengths(features, labels)
    mask = tf.reduce_any(tf.not_equal(features, 0), axis=-1)
    clean_labels = tf.maximum(tf.cast(labels, tf.int32), 1)
    variables = features_model.trainable_variables

    def split(use_reference):
        with tf.GradientTape(persistent=True) as tape:
            encoder_out, predictor_out = features_model([features, labels], training=True)
            if use_reference:
                encoder, predictor = joint._project(encoder_out, predictor_out)
                costs = reference.flash_rnnt_loss(
                    encoder, predictor, joint._weight(joint.kernel), joint._weight(joint.bias),
                    clean_labels, frame_lengths, label_lengths)
                loss = tf.reduce_mean(tf.cast(costs, tf.float32))
            else:
                lattice = joint([encoder_out, predictor_out, labels], mask=[mask, None, None])
                loss = loss_fn(y_true, lattice)
        d_outs = tape.gradient(loss, [encoder_out, predictor_out])
        d_vars = tape.gradient([encoder_out, predictor_out], variables, output_gradients=d_outs)
        return loss, d_outs, d_vars

    fn = tf.function(split, reduce_retracing=True) if graph else split
    results = [fn(False), fn(True)]
    print(f"    probe ({'graph' if graph else 'eager'}): loss op {float(results[0][0]):.4f}, "
          f"reference {float(results[1][0]):.4f}")
    for i, name in enumerate(("d encoder_out", "d predictor_out")):
        g, e = (np.asarray(tf.cast(r[1][i], tf.float32)) for r in results)
        with np.errstate(invalid="ignore"):
            diff = float(np.max(np.abs(g - e)) / max(float(np.max(np.abs(e))), 1e-30))
        print(f"      {name}: op {stats(g)}; reference {stats(e)}; max rel diff {diff:.2e}")
    for v, g, e in zip(variables, results[0][2], results[1][2]):
        if g is not None:
            print(f"      {v.path}: from op {stats(g)}; from reference {stats(e)}")


def run_variant(name, steps):
    cfg = VARIANTS[name]
    keras.mixed_precision.set_global_policy(cfg["policy"])
    original_lstm = keras.layers.LSTM
    if cfg.get("cudnn") is False:
        keras.layers.LSTM = functools.partial(original_lstm, use_cudnn=False)
    try:
        joint_kwargs = {"dtype": cfg["joint_dtype"]} if "joint_dtype" in cfg else None
        model, features_model = tk.build_transducer(seed=3, joint_kwargs=joint_kwargs)
    finally:
        keras.layers.LSTM = original_lstm
    joint = model.get_layer("joint")
    if "mode" in cfg:
        joint.mode = cfg["mode"]
    device = cfg.get("device", "/GPU:0")
    optimizer = keras.optimizers.Adam(0.01)
    loss_fn = FlashRNNTLoss()
    batches = list(tk.make_dataset(tk.make_examples(8, seed=13), batch_size=4))

    @tf.function
    def grads_of(features, labels, y_true):
        with tf.GradientTape() as tape:
            lattice = model([features, labels], training=True)
            loss = loss_fn(y_true, lattice)
        return loss, tape.gradient(loss, model.trainable_variables)

    print(f"== {name} ({cfg['policy']}, device {device}, mode {joint.mode})")
    if PROBE:
        with tf.device(device):
            probe(model, features_model, batches[0], loss_fn, graph=False)
            probe(model, features_model, batches[0], loss_fn, graph=True)
    reported = False
    for step in range(steps):
        (features, labels), y_true = batches[step % len(batches)]
        with tf.device(device):
            loss, grads = grads_of(features, labels, y_true)
        bad = [v.path for v, g in zip(model.trainable_variables, grads)
               if g is not None and not finite(g)]
        print(f"  step {step}: loss {float(loss):.4f}, non-finite gradients: {bad or 'none'}")
        if step == 0 and PROBE:
            for v, g in zip(model.trainable_variables, grads):
                print(f"      {v.path}: {stats(g)}")
        if (bad and not reported) or step == 0:
            reported = reported or bool(bad)
            compare_op(model, features_model, features, labels, device)
        with tf.device(device):
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
    bad_vars = [v.path for v in model.trainable_variables if not finite(v)]
    print(f"  after {steps} steps, non-finite variables: {bad_vars or 'none'}")
    keras.mixed_precision.set_global_policy("float32")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeat-test", type=int, default=3,
                        help="also run the failing test itself this many times")
    parser.add_argument("--probe", action="store_true",
                        help="split step 0 at the joint's inputs (op vs reference joint)")
    args = parser.parse_args()
    global PROBE
    PROBE = args.probe
    for name in args.variants.split(","):
        try:
            run_variant(name, args.steps)
        except Exception as e:  # keep going: every variant is a data point
            print(f"  {name} raised {type(e).__name__}: {str(e)[:300]}")
            keras.mixed_precision.set_global_policy("float32")
    for i in range(args.repeat_test):
        try:
            tk.test_mixed_precision_trains_without_nan("mixed_bfloat16")
            print(f"test run {i}: passed")
        except AssertionError as e:
            print(f"test run {i}: FAILED {str(e)[:200]}")


if __name__ == "__main__":
    main()
