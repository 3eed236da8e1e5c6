"""Investigation: Keras LSTM weight gradients under mixed_bfloat16, with and without cuDNN
(tf_rnnt not used). Kept to re-check the Keras LSTM caveat on new TensorFlow versions.

    python scripts/investigations/lstm_bf16_repro.py [--trials 20]

scripts/investigations/mixed_bf16_check.py found non-finite LSTM weight gradients in bfloat16
training on a GPU even when the gradients fed into the LSTMs were finite and came from
tf_rnnt.reference.
This script takes tf_rnnt out: one LSTM (the test model's sizes), finite inputs and finite
upstream gradients, weight gradients by tf.GradientTape in a tf.function, compared with the same
layer's float32 gradients. It prints, per path, how many trials gave non-finite gradients and
the largest relative difference from float32 among the finite ones.
"""

import argparse

import keras
import numpy as np
import tensorflow as tf


def weight_gradients(layer, x, dy, mask):
    @tf.function
    def run(x, dy):
        with tf.GradientTape() as tape:
            y = layer(x, mask=mask)
        return tape.gradient(y, layer.trainable_variables, output_gradients=tf.cast(dy, y.dtype))

    return [np.asarray(tf.cast(g, tf.float32)) for g in run(x, dy)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    print("GPUs:", len(tf.config.list_physical_devices("GPU")))
    for masked in (False, True):
        for use_cudnn in ("auto", False):
            bad, worst = 0, 0.0
            for trial in range(args.trials):
                rng = np.random.default_rng(trial)
                x = tf.constant(rng.normal(size=(4, 9, 6)), tf.float32)
                dy = tf.constant(0.1 * rng.normal(size=(4, 9, 6)), tf.float32)
                lengths = rng.integers(2, 10, size=4)
                mask = tf.constant(np.arange(9)[None, :] < lengths[:, None]) if masked else None
                keras.mixed_precision.set_global_policy("mixed_bfloat16")
                keras.utils.set_random_seed(trial)
                layer = keras.layers.LSTM(6, return_sequences=True, use_cudnn=use_cudnn)
                layer.build(x.shape)
                got = weight_gradients(layer, x, dy, mask)
                keras.mixed_precision.set_global_policy("float32")
                reference = keras.layers.LSTM(6, return_sequences=True, use_cudnn=use_cudnn)
                reference.build(x.shape)
                reference.set_weights(layer.get_weights())
                expected = weight_gradients(reference, x, dy, mask)
                if not all(np.all(np.isfinite(g)) for g in got):
                    bad += 1
                    continue
                worst = max(worst, max(float(np.max(np.abs(g - e)) / max(np.max(np.abs(e)), 1e-30))
                                       for g, e in zip(got, expected)))
            print(f"mask={masked} use_cudnn={use_cudnn}: {bad}/{args.trials} trials with "
                  f"non-finite bfloat16 weight gradients; finite ones within {worst:.2e} "
                  f"(relative) of float32")


if __name__ == "__main__":
    main()
