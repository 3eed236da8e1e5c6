"""Trains the streaming transducer on the spoken-digit set, reports WER, exports a SavedModel.

    python examples/speech/train.py                 # CPU default: 14 min on 2 busy cores, WER 7%
    python examples/speech/train.py --large --data /tmp/speech_big   # GPU: 6 min on an H200, WER 5.6%

Writes into --out: TensorBoard logs (tensorboard/), weight checkpoints (checkpoints/), the
training curve (training_curve.png), the metrics (results.json, history.csv) and the streaming
SavedModel (saved_model/, see export.py).
"""

import argparse
import dataclasses
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
sys.path.insert(0, _HERE)
if os.path.isdir(os.path.join(_REPO, "tf_rnnt")):  # running from a checkout: use its tf_rnnt
    sys.path.insert(0, _REPO)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import decoding  # noqa: E402
import pipeline  # noqa: E402
import plot  # noqa: E402
from model import LARGE, ModelConfig, build_model, output_lengths, parts  # noqa: E402

DEFAULT_DATA = os.path.join(_HERE, "data")


def make_evaluator(model, max_symbols=5):
    encoder, predictor, joint = parts(model)

    @tf.function(reduce_retracing=True)
    def decode_batch(features, feature_lengths):
        frames = encoder([features, feature_lengths], training=False)
        state = decoding.initial_decoder_state(predictor, tf.shape(features)[0])
        tokens, _ = decoding.greedy_decode(joint, predictor, frames,
                                           output_lengths(feature_lengths), state, max_symbols)
        return tokens

    def evaluate(dataset):
        references, hypotheses = [], []
        for inputs, labels in dataset:
            tokens = decode_batch(inputs["features"], inputs["feature_lengths"])
            hypotheses += [pipeline.decode_ids(t) for t in decoding.tokens_to_lists(tokens)]
            references += [pipeline.decode_ids(row) for row in labels.numpy()]
        return decoding.word_error_rate(references, hypotheses), references, hypotheses

    return evaluate


def write_scalar(writer, tag, value, step):
    """A TensorBoard scalar through core TensorFlow (tf.summary.scalar needs the tensorboard
    package; tf.summary.write with the scalars plugin's metadata does not)."""
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata()
    metadata.plugin_data.plugin_name = "scalars"
    with writer.as_default():
        tf.summary.write(tag, tf.constant(value, tf.float32), step=step, metadata=metadata)


class ScalarLogs(keras.callbacks.Callback):
    """Epoch logs as TensorBoard scalars (log_dir/train, log_dir/validation), written like
    keras.callbacks.TensorBoard's but without the tensorboard package."""

    def __init__(self, log_dir):
        super().__init__()
        self.train = tf.summary.create_file_writer(os.path.join(log_dir, "train"))
        self.validation = tf.summary.create_file_writer(os.path.join(log_dir, "validation"))

    def on_epoch_end(self, epoch, logs=None):
        for key, value in (logs or {}).items():
            if key.startswith("val_"):
                write_scalar(self.validation, "epoch_" + key[4:], float(value), epoch)
            else:
                write_scalar(self.train, "epoch_" + key, float(value), epoch)
        lr = self.model.optimizer.learning_rate
        write_scalar(self.train, "epoch_learning_rate", float(np.asarray(lr)), epoch)
        self.train.flush()
        self.validation.flush()


def tensorboard_callback(log_dir):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return ScalarLogs(log_dir)
    return keras.callbacks.TensorBoard(log_dir, update_freq="epoch")


class WERCallback(keras.callbacks.Callback):
    """Greedy-decodes the held-out set every `every` epochs; logs `val_wer`."""

    def __init__(self, evaluate, dataset, every):
        super().__init__()
        self.evaluate = evaluate
        self.dataset = dataset
        self.every = every
        self.points = []  # (epoch, wer)

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every:
            return
        wer, refs, hyps = self.evaluate(self.dataset)
        self.points.append((epoch + 1, wer))
        if logs is not None:
            logs["val_wer"] = wer  # TensorBoard (validation/epoch_wer) and history.csv
        print(f"\nepoch {epoch + 1}: held-out WER {wer:.2%}  e.g. ref '{refs[0]}' "
              f"hyp '{hyps[0]}'", flush=True)


class TimeLimit(keras.callbacks.Callback):
    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds
        self.start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        if time.time() - self.start > self.seconds:
            print(f"\ntime limit of {self.seconds:.0f} s reached after epoch {epoch + 1}")
            self.model.stop_training = True


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=DEFAULT_DATA,
                   help="folder with train.tsv and test.tsv (default: the committed set)")
    p.add_argument("--out", default="speech_run", help="output folder")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--learning-rate", type=float, default=None)
    p.add_argument("--eval-every", type=int, default=None, help="epochs between WER evaluations")
    p.add_argument("--time-limit", type=float, default=None,
                   help="stop after the epoch that passes this many minutes")
    p.add_argument("--large", action="store_true", help="larger model and batches (GPU)")
    p.add_argument("--predictor", choices=("stateless", "lstm"), default="stateless")
    p.add_argument("--fastemit-lambda", type=float, default=0.0)
    p.add_argument("--augment", choices=("full", "spec", "audio", "none"), default="full",
                   help="training augmentation: audio (speed, gain, noise), SpecAugment, both")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-export", action="store_true")
    p.add_argument("--audio-backend", choices=("auto", "tfio", "core"), default="auto")
    args = p.parse_args(argv)
    defaults = dict(epochs=60, batch_size=32, learning_rate=1e-3, eval_every=10)
    if args.large:
        defaults = dict(epochs=100, batch_size=64, learning_rate=5e-4, eval_every=10)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv=None):
    args = parse_args(argv)
    start = time.time()
    keras.utils.set_random_seed(args.seed)
    if args.audio_backend != "auto":
        pipeline.set_audio_backend(args.audio_backend)
    os.makedirs(args.out, exist_ok=True)
    train_manifest = os.path.join(args.data, "train.tsv")
    test_manifest = os.path.join(args.data, "test.tsv")
    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, audio backend "
          f"{pipeline.audio_backend()}, devices "
          f"{[d.name for d in tf.config.list_logical_devices()]}")

    mean, std = pipeline.feature_statistics(train_manifest)
    augment = pipeline.AugmentConfig()
    if args.augment in ("spec", "none"):
        augment = dataclasses.replace(augment, speed_factors=(1.0,), gain_db=(0.0, 0.0),
                                      noise_probability=0.0)
    if args.augment in ("audio", "none"):
        augment = dataclasses.replace(augment, num_freq_masks=0, num_time_masks=0)
    train_ds = pipeline.make_dataset(train_manifest, args.batch_size, training=True,
                                     augment_config=augment, mask_value=mean, seed=args.seed)
    test_ds = pipeline.make_dataset(test_manifest, args.batch_size, training=False)
    steps_per_epoch = sum(1 for _ in train_ds)
    print(f"{len(pipeline.read_manifest(train_manifest)[0])} training utterances, "
          f"{steps_per_epoch} batches per epoch; "
          f"{len(pipeline.read_manifest(test_manifest)[0])} held-out utterances")

    config = ModelConfig(vocab_size=pipeline.VOCAB_SIZE, predictor=args.predictor,
                         fastemit_lambda=args.fastemit_lambda, **(LARGE if args.large else {}))
    model = build_model(config, args.learning_rate, steps=args.epochs * steps_per_epoch)
    parts(model)[0].set_feature_statistics(mean, std)
    model.summary()

    evaluate = make_evaluator(model)
    log_dir = os.path.join(args.out, "tensorboard")
    wer_callback = WERCallback(evaluate, test_ds, args.eval_every)
    callbacks = [
        wer_callback,  # first: the callbacks after it see val_wer
        tensorboard_callback(log_dir),
        keras.callbacks.ModelCheckpoint(  # the latest epoch's weights (final.weights.h5 at the end)
            os.path.join(args.out, "checkpoints", "latest.weights.h5"), save_weights_only=True,
            save_freq="epoch"),
    ]
    if args.time_limit:
        callbacks.append(TimeLimit(args.time_limit * 60 - (time.time() - start)))
    history = model.fit(train_ds, epochs=args.epochs, callbacks=callbacks, verbose=1)
    train_seconds = time.time() - start

    wer, refs, hyps = evaluate(test_ds)
    print(f"held-out WER {wer:.2%} on {len(refs)} utterances (training took {train_seconds:.0f} s)")
    for r, h in list(zip(refs, hyps))[:5]:
        print(f"  ref: {r}\n  hyp: {h}")
    model.save_weights(os.path.join(args.out, "final.weights.h5"))

    losses = [float(v) for v in history.history["loss"]]
    epochs_run = len(losses)
    wer_points = dict(wer_callback.points)
    wer_points.setdefault(epochs_run, wer)
    with open(os.path.join(args.out, "history.csv"), "w") as f:
        f.write("epoch,loss,wer\n")
        for epoch, loss in enumerate(losses, 1):
            f.write(f"{epoch},{loss:.5f},{wer_points.get(epoch, '')}\n")
    plot.write_training_curve(os.path.join(args.out, "training_curve.png"), losses,
                              sorted(wer_points.items()))

    results = dict(wer=wer, test_utterances=len(refs), epochs=epochs_run,
                   train_seconds=train_seconds, tensorflow=tf.__version__,
                   audio_backend=pipeline.audio_backend(), large=args.large,
                   config=dataclasses.asdict(config), batch_size=args.batch_size,
                   final_loss=losses[-1])
    if not args.no_export:
        import export

        path = os.path.join(args.out, "saved_model")
        export.export_saved_model(model, path)
        results["saved_model"] = path
        print(f"exported the streaming SavedModel to {path}")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(f"total time {time.time() - start:.0f} s")
    return results


if __name__ == "__main__":
    main()
