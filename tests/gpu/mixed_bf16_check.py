"""Where a non-finite gradient first appears in mixed-precision training of the Keras test model.

    python tests/gpu/mixed_bf16_check.py [--policy mixed_bfloat16] [--device /GPU:0]

On the H200, tests/test_keras.py::test_mixed_precision_trains_without_nan[mixed_bfloat16]
failed with the tiled joint of commit 6b4497b (the predictor-side weights were NaN after the
first Adam step) while the float32 and mixed_float16 runs and every op-level bfloat16 test
passed. This script separates the candidates for one training batch:
  1. the joint op's four gradients (encoder, predictor, kernel, bias) for the layer's projected
     inputs, against tf_rnnt.reference in the same precision;
  2. every model variable's gradient (finite or not), through the whole model;
  3. the same with the op forced onto the CPU (same model, same batch).
"""

import argparse
import os
import sys

import numpy as np
import tensorflow as tf
import keras

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # tests/
sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))  # the checkout

import test_keras as tk  # noqa: E402
import tf_rnnt  # noqa: E402
from tf_rnnt import reference  # noqa: E402
from tf_rnnt.keras import FlashRNNTLoss  # noqa: E402


def finite(x):
    return bool(np.all(np.isfinite(np.asarray(tf.cast(tf.convert_to_tensor(x), tf.float32)))))


def op_gradients(fn, args):
    params = [tf.Variable(x) for x in args[:4]]
    with tf.GradientTape() as tape:
        costs = fn(*params, *args[4:])
        total = tf.reduce_sum(tf.cast(costs, tf.float32))
    return [costs] + tape.gradient(total, params)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="mixed_bfloat16")
    parser.add_argument("--device", default="/GPU:0")
    args = parser.parse_args()
    keras.mixed_precision.set_global_policy(args.policy)
    model, features_model = tk.build_transducer(seed=3)
    batch = next(iter(tk.make_dataset(tk.make_examples(8, seed=13), batch_size=4)))
    (features, labels), y_true = batch
    frame_lengths, label_lengths = tk.batch_lengths(features, labels)
    joint = model.get_layer("joint")

    # 1. The op alone, on the joint's own projected inputs.
    encoder_out, predictor_out = features_model([features, labels])
    encoder, predictor = joint._project(encoder_out, predictor_out)
    clean_labels = tf.maximum(tf.cast(labels, tf.int32), 1)
    op_args = [tf.identity(encoder), tf.identity(predictor), joint._weight(joint.kernel),
               joint._weight(joint.bias), clean_labels, tf.constant(frame_lengths),
               tf.constant(label_lengths)]
    with tf.device(args.device):
        got = op_gradients(tf_rnnt.flash_rnnt_loss, op_args)
    expected = op_gradients(reference.flash_rnnt_loss, op_args)
    for name, g, e in zip(("costs", "d encoder", "d predictor", "d kernel", "d bias"), got,
                          expected):
        g32, e32 = (np.asarray(tf.cast(x, tf.float32)) for x in (g, e))
        error = float(np.max(np.abs(g32 - e32)) / max(float(np.max(np.abs(e32))), 1e-30))
        print(f"op {name}: finite {finite(g)} (reference {finite(e)}), max rel diff {error:.2e}")

    # 2 and 3. The whole model's gradients, op on the given device and on the CPU.
    loss_fn = FlashRNNTLoss()
    for device in (args.device, "/CPU:0"):
        with tf.device(device):
            with tf.GradientTape() as tape:
                lattice = model([features, labels], training=True)
                loss = loss_fn(y_true, lattice)
            grads = tape.gradient(loss, model.trainable_variables)
        bad = [v.path for v, g in zip(model.trainable_variables, grads)
               if g is not None and not finite(g)]
        print(f"model on {device}: loss {float(loss):.4f}, non-finite gradients: {bad or 'none'}")


if __name__ == "__main__":
    main()
