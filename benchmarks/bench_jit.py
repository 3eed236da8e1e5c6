#!/usr/bin/env python3
"""Training-step time of a Keras transducer with `jit_compile=True` vs `False`.

  python benchmarks/bench_jit.py [--policy mixed_bfloat16] [--batch 32] [--frames 1600]
      [--labels 128] [--vocab 1025] [--steps 20] [--builder module:function]
      [--builder-kwargs '{"vocab_size": 1025}']

The model maps `[features [B, frames, 80], labels [B, U]]` (labels padded with -1; or a dict
with "features", "feature_lengths" and "labels" when it has a "feature_lengths" input) to the
`[B, T, U+1, 2]` lattice of a `tf_rnnt.keras.RNNTJoint` and trains with `FlashRNNTLoss`.
Without --builder it is a Conformer-sized stack built here (4x convolutional subsampling,
16 Conformer blocks of width 256 with 4 heads and kernel 31, an LSTM predictor of 320 units, a
joint of 320 units). --builder names any function returning such a model (keyword arguments
from --builder-kwargs). Prints the median step time and peak GPU memory of each setting.
"""

import argparse
import importlib
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_rnnt  # noqa: E402
from tf_rnnt.keras import FlashRNNTLoss, RNNTJoint  # noqa: E402

FEATURES = 80


class ShiftedLabels(keras.layers.Layer):
    """Predictor input: blank (0) then the labels, padding (-1) mapped to 0."""

    def call(self, labels):
        labels = tf.where(labels < 0, tf.zeros_like(labels), labels)
        return tf.pad(labels, [[0, 0], [1, 0]])


def feed_forward(x, width, name):
    y = keras.layers.LayerNormalization(name=f"{name}_norm")(x)
    y = keras.layers.Dense(4 * width, activation="swish", name=f"{name}_up")(y)
    y = keras.layers.Dense(width, name=f"{name}_down")(y)
    return keras.layers.Add(name=f"{name}_add")([x, keras.layers.Rescaling(0.5)(y)])


def conformer_block(x, width, heads, kernel_size, name):
    x = feed_forward(x, width, f"{name}_ff1")
    y = keras.layers.LayerNormalization(name=f"{name}_mhsa_norm")(x)
    y = keras.layers.MultiHeadAttention(heads, width // heads, name=f"{name}_mhsa")(y, y)
    x = keras.layers.Add()([x, y])
    y = keras.layers.LayerNormalization(name=f"{name}_conv_norm")(x)
    y = keras.layers.Dense(2 * width, name=f"{name}_pointwise1")(y)
    y = keras.layers.Lambda(lambda t: t[..., :width] * tf.sigmoid(t[..., width:]))(y)  # GLU
    y = keras.layers.DepthwiseConv1D(kernel_size, padding="same", name=f"{name}_depthwise")(y)
    y = keras.layers.LayerNormalization(name=f"{name}_conv_norm2")(y)
    y = keras.layers.Activation("swish")(y)
    y = keras.layers.Dense(width, name=f"{name}_pointwise2")(y)
    x = keras.layers.Add()([x, y])
    x = feed_forward(x, width, f"{name}_ff2")
    return keras.layers.LayerNormalization(name=f"{name}_out_norm")(x)


def build_conformer_stack(vocab_size, width=256, blocks=16, heads=4, kernel_size=31,
                          predictor_units=320, joint_units=320):
    """A Conformer-M-sized transducer: `[features, labels]` -> RNNTJoint lattice."""
    features = keras.Input((None, FEATURES), name="features")
    labels = keras.Input((None,), dtype="int32", name="labels")
    x = keras.layers.Conv1D(width, 3, strides=2, padding="same", activation="relu")(features)
    x = keras.layers.Conv1D(width, 3, strides=2, padding="same", activation="relu")(x)
    x = keras.layers.Dense(width)(x)
    for i in range(blocks):
        x = conformer_block(x, width, heads, kernel_size, f"block{i}")
    predictor = keras.layers.Embedding(vocab_size, predictor_units)(ShiftedLabels()(labels))
    predictor = keras.layers.LSTM(predictor_units, return_sequences=True, use_cudnn=False)(
        predictor
    )
    # The synthetic batches have no frame padding.
    lattice = RNNTJoint(vocab_size, joint_units, all_frames_valid=True, name="joint")(
        [x, predictor, labels])
    return keras.Model([features, labels], lattice)


def load_builder(spec):
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module), function)


def make_batch(batch, frames, num_labels, vocab, seed=0):
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(batch, frames, FEATURES)).astype(np.float32)
    labels = rng.integers(1, vocab, size=(batch, num_labels)).astype(np.int32)
    lengths = rng.integers(num_labels // 2, num_labels + 1, size=batch)
    labels[np.arange(num_labels)[None, :] >= lengths[:, None]] = -1
    return features, labels


def measure(build, jit_compile, batch_data, steps, warmup):
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model = build()
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss=FlashRNNTLoss(),
                  jit_compile=jit_compile)
    features, labels = batch_data
    names = [getattr(t, "name", "") for t in tf.nest.flatten(model.inputs)]
    if any("feature_lengths" in name for name in names):
        lengths = np.full([features.shape[0]], features.shape[1], np.int32)
        inputs = {"features": features, "feature_lengths": lengths, "labels": labels}
    else:
        inputs = [features, labels]
    gpu = bool(tf.config.list_physical_devices("GPU"))
    for _ in range(warmup):
        loss = model.train_on_batch(inputs, labels)
    if gpu:
        tf.config.experimental.reset_memory_stats("GPU:0")
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = model.train_on_batch(inputs, labels)  # returns a host float: synced
        times.append(time.perf_counter() - start)
    peak = tf.config.experimental.get_memory_info("GPU:0")["peak"] if gpu else 0
    return float(np.median(times)), peak, float(loss), model.jit_compile


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="mixed_bfloat16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--frames", type=int, default=1600, help="input frames (T = frames / 4)")
    parser.add_argument("--labels", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=1025)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--builder", default=None, help="module:function returning the model")
    parser.add_argument("--builder-kwargs", default="{}")
    parser.add_argument("--blocks", type=int, default=16, help="Conformer blocks (no --builder)")
    args = parser.parse_args()

    keras.mixed_precision.set_global_policy(args.policy)
    if args.builder:
        builder, kwargs = load_builder(args.builder), json.loads(args.builder_kwargs)
        build = lambda: builder(**kwargs)  # noqa: E731
    else:
        build = lambda: build_conformer_stack(args.vocab, blocks=args.blocks)  # noqa: E731
    data = make_batch(args.batch, args.frames, args.labels, args.vocab)
    print(f"TensorFlow {tf.__version__}, policy {args.policy}, B={args.batch}, "
          f"frames={args.frames}, U={args.labels}, V={args.vocab}, "
          f"XLA kernels in the op library: {tf_rnnt.ops.xla_kernels_available()}")
    results = {}
    for jit_compile in (False, True):
        step, peak, loss, resolved = measure(build, jit_compile, data, args.steps, args.warmup)
        results[jit_compile] = step
        print(f"jit_compile={jit_compile!s:5}: {step * 1e3:8.1f} ms/step (median of {args.steps}), "
              f"peak {peak / 2**30:.2f} GiB, loss {loss:.3f}, model.jit_compile={resolved}",
              flush=True)
    print(f"speed-up of jit_compile=True: {results[False] / results[True]:.2f}x")


if __name__ == "__main__":
    main()
