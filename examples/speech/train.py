"""Trains the streaming transducer on human and synthesized spoken digits, reports WER, exports.

    python examples/speech/train.py --out runs/speech --tflite          # CPU default
    python examples/speech/train.py --out runs/speech_large --large     # GPU
    python examples/speech/train.py --out runs/speech_conformer --conformer   # Conformer encoder
    python examples/speech/train.py --out runs/speech_tdt --tdt         # TDT, same encoder

Training data: the committed synthesized set (`data/`, espeak-ng) and digit strings made from
the committed Free Spoken Digit Dataset words of five speakers (`fsdd.py`, written to
OUT/fsdd_strings on first use). Held out, scored separately: the synthesized test strings and
digit strings spoken by a sixth speaker, who is in no training utterance.

Writes into --out: TensorBoard logs (tensorboard/), the per-epoch CSV log (history.csv), weight
checkpoints (checkpoints/, final.weights.h5), the metrics (results.json), the held-out
references with their greedy hypotheses (hypotheses.tsv) and the streaming
SavedModel (saved_model/, see export.py; with --tflite also streaming_step.tflite). With
--conformer the encoder attends to whole utterances: the SavedModel has the whole-utterance
signatures only (features, transcribe) and --tflite is refused. With --tdt the joint is a TDT
joint (--durations, default 0-4; `FlashTDTLoss` with sigma 0.05 and omega 0.1) and decoding is
TDT greedy search. results.json holds the greedy decoding speed on the held-out sets too
("decoding": search time and joint steps per second of audio, one utterance at a time).
"""

import argparse
import csv
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

import fsdd  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import pipeline  # noqa: E402
import tensorflow as tf  # noqa: E402
from model import (  # noqa: E402
    CONFORMER,
    CONFORMER_LARGE,
    LARGE,
    ModelConfig,
    build_model,
    parts,
)

from tf_rnnt import decoding  # noqa: E402

DEFAULT_DATA = os.path.join(_HERE, "data")


def make_evaluator(model, max_symbols=5, beam_size=0, tokenizer=pipeline.CHARACTERS):
    """`evaluate(dataset) -> (WER, references, hypotheses)`: greedy search, or modified beam
    search when `beam_size` > 0 (TDT greedy and beam search for a TDT joint); `tokenizer` turns
    the ids into text."""
    from export import greedy_tokens

    encoder, predictor, joint = parts(model)
    joint_fn = decoding.joint_fn_from_layer(joint)
    durations = joint.durations

    @tf.function(reduce_retracing=True)
    def decode_batch(features, feature_lengths):
        frames = encoder([features, feature_lengths], training=False)
        lengths = encoder.frame_lengths(feature_lengths)
        start = predictor.initial_state(tf.shape(features)[0])
        if beam_size and durations:
            state = decoding.tdt_beam_initial_state(predictor.step, start, beam_size,
                                                    pipeline.BLANK)
            state = decoding.tdt_beam_search(frames, lengths, state, joint_fn, predictor.step,
                                             durations, max_symbols, pipeline.BLANK)
            return decoding.best_hypothesis(state)[0]
        if beam_size:
            state = decoding.beam_initial_state(predictor.step, start, beam_size, pipeline.BLANK)
            state = decoding.beam_search(frames, lengths, state, joint_fn, predictor.step,
                                         pipeline.BLANK)
            return decoding.best_hypothesis(state)[0]
        return greedy_tokens(frames, lengths, predictor, joint_fn, durations, max_symbols)

    def evaluate(dataset):
        references, hypotheses = [], []
        for inputs, labels in dataset:
            tokens = decode_batch(inputs["features"], inputs["feature_lengths"])
            hypotheses += [tokenizer.decode(t) for t in tokens.numpy()]
            references += [tokenizer.decode(row) for row in labels.numpy()]
        return word_error_rate(references, hypotheses), references, hypotheses

    return evaluate


def decoding_speed(model, dataset, max_symbols=5, repeats=3):
    """Greedy search speed over `dataset`, one utterance at a time (batch 1, as on a phone), the
    encoder's frames computed beforehand: the search's wall time (the best of `repeats` passes,
    after a warm-up pass) and its joint steps (the joint's evaluations: one for each frame and
    emitted symbol in RNN-T greedy search, one for each move in TDT greedy search), per second
    of audio."""
    from export import greedy_tokens

    encoder, predictor, joint = parts(model)
    joint_fn = decoding.joint_fn_from_layer(joint)
    steps = tf.Variable(0, dtype=tf.int64, trainable=False)

    def counted_joint_fn(frames, predictor_out):
        steps.assign_add(1)
        return joint_fn(frames, predictor_out)

    @tf.function(input_signature=[tf.TensorSpec([1, None, None], tf.float32)])
    def search(frames):
        return greedy_tokens(frames, tf.shape(frames)[1:2], predictor, counted_joint_fn,
                             joint.durations, max_symbols)

    utterances, audio_seconds = [], 0.0
    config = pipeline.FeatureConfig()
    for inputs, _ in dataset:
        feature_lengths = inputs["feature_lengths"]
        frames = encoder([inputs["features"], feature_lengths], training=False)
        lengths = encoder.frame_lengths(feature_lengths).numpy()
        for b, n in enumerate(lengths):
            utterances.append(tf.cast(frames[b:b + 1, :n], tf.float32))
        samples = (feature_lengths.numpy().astype(np.float64) - 1) * config.frame_step + \
            config.frame_length
        audio_seconds += float(samples.sum()) / config.sample_rate
    for frames in utterances[:2]:  # warm-up: traces
        search(frames).numpy()
    best = float("inf")
    for _ in range(repeats):
        steps.assign(0)
        begin = time.perf_counter()
        for frames in utterances:
            search(frames).numpy()
        best = min(best, time.perf_counter() - begin)
    frames_total = sum(int(f.shape[1]) for f in utterances)
    return dict(utterances=len(utterances), audio_seconds=audio_seconds,
                encoder_frames=frames_total, search_seconds=best,
                search_ms_per_audio_second=1e3 * best / audio_seconds,
                joint_steps=int(steps.numpy()),
                joint_steps_per_audio_second=int(steps.numpy()) / audio_seconds)


def word_error_rate(references, hypotheses):
    """Corpus WER with `tf.edit_distance` over words: total word edits / total reference
    words."""
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    ref = tf.strings.split(tf.constant(list(references), tf.string))
    hyp = tf.strings.split(tf.constant(list(hypotheses), tf.string))
    edits = tf.edit_distance(hyp.to_sparse(), ref.to_sparse(), normalize=False)
    return float(tf.reduce_sum(edits)) / max(int(tf.reduce_sum(ref.row_lengths())), 1)


class WERCallback(keras.callbacks.Callback):
    """Greedy-decodes the held-out sets every `every` epochs (and after the last); logs
    `val_wer_<name>` for each (TensorBoard and the CSV log read them from the epoch logs).
    `scored` keeps the latest `(WER, references, hypotheses)` per set, `scored_epoch` its
    epoch (counted from 1)."""

    def __init__(self, evaluate, datasets, every, epochs):
        super().__init__()
        self.evaluate = evaluate
        self.datasets = datasets
        self.every = every
        self.epochs = epochs
        self.scored, self.scored_epoch = {}, 0

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every and epoch + 1 != self.epochs:
            for name in self.datasets:
                logs["val_wer_" + name] = float("nan")  # the CSV log needs every column
            return
        for name, dataset in self.datasets.items():
            wer, refs, hyps = self.scored[name] = self.evaluate(dataset)
            self.scored_epoch = epoch + 1
            logs["val_wer_" + name] = wer
            print(f"\nepoch {epoch + 1}: held-out WER ({name}) {wer:.2%}  e.g. ref "
                  f"'{refs[0]}' hyp '{hyps[0]}'", flush=True)


class SwapEMAWeights(keras.callbacks.SwapEMAWeights):
    """`keras.callbacks.SwapEMAWeights(swap_on_epoch=True)` that also leaves the averaged
    weights in the model when training stops before its last epoch (`TimeLimit`, which must
    come before it)."""

    def __init__(self):
        super().__init__(swap_on_epoch=True)

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if self.model.stop_training and epoch != self.params["epochs"] - 1:
            self._finalize_ema_values()


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
                   help="synthesized speech: folder with train.tsv and test.tsv (default: the "
                   "committed set)")
    p.add_argument("--human-data", default=None,
                   help="folder for the human digit strings made from the committed FSDD words "
                   "(default: OUT/fsdd_strings; made there if missing)")
    p.add_argument("--human-train", type=int, default=None,
                   help="human digit strings for training")
    p.add_argument("--human-test", type=int, default=100,
                   help="digit strings of the held-out speaker")
    p.add_argument("--out", default="speech_run", help="output folder")
    p.add_argument("--epochs", type=int, default=None,
                   help="12 (fits 15 min on 2 CPU cores; 20 scores better), 60 with --large")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--learning-rate", type=float, default=None)
    p.add_argument("--eval-every", type=int, default=None, help="epochs between WER evaluations")
    p.add_argument("--time-limit", type=float, default=None,
                   help="stop after the epoch that passes this many minutes")
    p.add_argument("--large", action="store_true", help="larger model and batches (GPU)")
    p.add_argument("--tdt", action="store_true",
                   help="a TDT joint and loss (durations --durations) with the same encoder")
    p.add_argument("--durations", default="0,1,2,3,4",
                   help="with --tdt: the TDT durations in encoder frames")
    p.add_argument("--tdt-sigma", type=float, default=ModelConfig.tdt_sigma,
                   help="with --tdt: the loss's logit under-normalization sigma")
    p.add_argument("--tdt-omega", type=float, default=ModelConfig.tdt_omega,
                   help="with --tdt: the probability of a plain RNN-T loss step (omega)")
    p.add_argument("--conformer", action="store_true",
                   help="a Conformer encoder (full context; no streaming export) in place of the "
                   "streaming LSTM encoder; with --large a bigger one")
    p.add_argument("--encoder-dim", type=int, default=None,
                   help="encoder width (LSTM units or the Conformer's d), over the default")
    p.add_argument("--encoder-layers", type=int, default=None,
                   help="LSTM layers or Conformer blocks, over the default")
    p.add_argument("--predictor", choices=("stateless", "lstm"), default="stateless")
    p.add_argument("--tokens", choices=tuple(pipeline.TOKENIZERS), default="characters",
                   help="label units: whole words (the digit words and the commands' words) or "
                   "characters")
    p.add_argument("--fastemit-lambda", type=float, default=0.0)
    p.add_argument("--mean-prior-frames", type=int, default=ModelConfig.mean_prior_frames,
                   help="causal per-utterance feature mean normalization: prior weight in "
                   "frames (0: only the global statistics)")
    p.add_argument("--augment", choices=("full", "spec", "audio", "none"), default="full",
                   help="training augmentation: audio (speed, gain, noise), SpecAugment, both")
    p.add_argument("--vtlp", type=float, default=0.0, metavar="ALPHA",
                   help="vocal tract length perturbation: warp the mel filter bank by a random "
                   "factor in [1 - ALPHA, 1 + ALPHA] per training utterance (0: off)")
    p.add_argument("--lowpass", type=float, default=0.0, metavar="P",
                   help="low-pass filter this share of the training utterances at a random "
                   "cutoff in 1-4 kHz (a muffled microphone)")
    p.add_argument("--dropout", type=float, default=None,
                   help=f"dropout rate (default {ModelConfig.dropout})")
    p.add_argument("--ema", type=float, default=0.995, metavar="MOMENTUM",
                   help="evaluate and export an exponential moving average of the weights "
                   "with this momentum per step (0: off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-symbols", type=int, default=5,
                   help="greedy search: labels per encoder frame at most")
    p.add_argument("--beam-size", type=int, default=0,
                   help="also score the final model with modified beam search of this width")
    p.add_argument("--no-export", action="store_true")
    p.add_argument("--tflite", action="store_true",
                   help="also write the TFLite streaming step (streaming_step.tflite)")
    p.add_argument("--evaluate-only", metavar="WEIGHTS",
                   help="load these weights (a final.weights.h5), evaluate and export; no training")
    p.add_argument("--audio-backend", choices=("auto", "tfio", "core"), default="auto")
    args = p.parse_args(argv)
    if args.conformer and args.tflite:
        p.error("--tflite needs a streaming encoder: the Conformer encoder attends to the whole "
                "utterance, so it has no chunk-wise TFLite step (its SavedModel has the "
                "whole-utterance transcribe signature); drop --tflite or --conformer")
    defaults = dict(epochs=12, batch_size=32, learning_rate=1e-3, eval_every=6, human_train=1600)
    if args.large:
        defaults = dict(epochs=60, batch_size=64, learning_rate=5e-4, eval_every=10,
                        human_train=8000)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv=None):
    args = parse_args(argv)
    start, start_cpu = time.time(), time.process_time()
    keras.utils.set_random_seed(args.seed)
    if args.audio_backend != "auto":
        pipeline.set_audio_backend(args.audio_backend)
    os.makedirs(args.out, exist_ok=True)
    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, audio backend "
          f"{pipeline.audio_backend()}, devices "
          f"{[d.name for d in tf.config.list_logical_devices()]}")
    human_train, human_test = fsdd.prepare(
        args.human_data or os.path.join(args.out, "fsdd_strings"), args.human_train,
        args.human_test, seed=args.seed)
    synthetic = pipeline.read_manifest(os.path.join(args.data, "train.tsv"))
    human = pipeline.read_manifest(human_train)
    train_manifest = (synthetic[0] + human[0], synthetic[1] + human[1])
    test_manifests = {"synthetic": os.path.join(args.data, "test.tsv"), "human": human_test}

    tokenizer = pipeline.TOKENIZERS[args.tokens]
    sizes = dict(LARGE) if args.large else {}
    if args.conformer:
        sizes.update(CONFORMER_LARGE if args.large else CONFORMER)
    for key in ("encoder_dim", "encoder_layers", "dropout"):
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    if args.tdt:
        sizes["durations"] = tuple(int(d) for d in args.durations.split(","))
        sizes.update(tdt_sigma=args.tdt_sigma, tdt_omega=args.tdt_omega)
    config = ModelConfig(vocab_size=tokenizer.size, predictor=args.predictor,
                         fastemit_lambda=args.fastemit_lambda,
                         mean_prior_frames=args.mean_prior_frames, **sizes)
    augment = pipeline.AugmentConfig()
    if args.augment in ("spec", "none"):
        augment = dataclasses.replace(augment, speed_factors=(1.0,), gain_db=(0.0, 0.0),
                                      noise_probability=0.0)
    if args.augment in ("audio", "none"):
        augment = dataclasses.replace(augment, num_freq_masks=0, num_time_masks=0)
    if args.lowpass:
        augment = dataclasses.replace(augment, lowpass_probability=args.lowpass)
    if args.vtlp:
        augment = dataclasses.replace(augment, warp=(1.0 - args.vtlp, 1.0 + args.vtlp))
    # Decoded once: counting the batches (the first full pass, which caches the audio), the
    # feature statistics and the training epochs all read the cached audio.
    train_audio = pipeline.decoded_dataset(train_manifest, tokenizer)
    train_ds = pipeline.make_dataset(train_audio, args.batch_size, training=True,
                                     augment_config=augment, seed=args.seed)
    steps_per_epoch = 1 if args.evaluate_only else sum(1 for _ in train_ds)
    model = build_model(config, args.learning_rate, steps=args.epochs * steps_per_epoch,
                        ema_momentum=args.ema)
    encoder = parts(model)[0]
    if args.evaluate_only:
        model.load_weights(args.evaluate_only)
        encoder.feature_norm.finalize_state()  # the statistics come from the weights file
    else:
        encoder.adapt_features(pipeline.feature_dataset(train_audio))
    # SpecAugment fills masks with the training features' mean (0 after normalization).
    train_ds = pipeline.make_dataset(
        train_audio, args.batch_size, training=True, augment_config=augment,
        mask_value=np.asarray(encoder.feature_norm.adapt_mean), seed=args.seed)
    test_ds = {name: pipeline.make_dataset(m, args.batch_size, training=False,
                                           tokenizer=tokenizer)
               for name, m in test_manifests.items()}
    print(f"{len(train_manifest[0])} training utterances ({len(synthetic[0])} synthesized, "
          f"{len(human[0])} human), {steps_per_epoch} batches per epoch; held out: "
          + ", ".join(f"{len(pipeline.read_manifest(m)[0])} {name}"
                      for name, m in test_manifests.items()))
    model.summary()

    evaluate = make_evaluator(model, args.max_symbols, tokenizer=tokenizer)
    callbacks = []
    if args.time_limit:
        callbacks.append(TimeLimit(args.time_limit * 60 - (time.time() - start)))
    if args.ema:
        callbacks.append(SwapEMAWeights())  # before the callbacks that read the weights
    wer_callback = WERCallback(evaluate, test_ds, args.eval_every, args.epochs)
    callbacks += [
        wer_callback,  # first: the
        # callbacks after it see its val_wer_* logs
        keras.callbacks.CSVLogger(os.path.join(args.out, "history.csv")),
        keras.callbacks.TensorBoard(os.path.join(args.out, "tensorboard"), update_freq="epoch"),
        keras.callbacks.ModelCheckpoint(  # the latest epoch's weights (final.weights.h5 at the end)
            os.path.join(args.out, "checkpoints", "latest.weights.h5"), save_weights_only=True,
            save_freq="epoch"),
    ]
    if args.evaluate_only:
        history = {"loss": [float("nan")]}
    else:
        history = model.fit(train_ds, epochs=args.epochs, callbacks=callbacks, verbose=2).history
        model.save_weights(os.path.join(args.out, "final.weights.h5"))
    train_seconds = time.time() - start

    results = dict(test_utterances={}, wer={}, epochs=len(history["loss"]),
                   train_seconds=train_seconds, train_cpu_seconds=time.process_time() - start_cpu,
                   tensorflow=tf.__version__, audio_backend=pipeline.audio_backend(),
                   large=args.large, config=dataclasses.asdict(config),
                   batch_size=args.batch_size, tokens=args.tokens, ema=args.ema,
                   final_loss=float(history["loss"][-1]),
                   training_utterances=len(train_manifest[0]))
    # The last epoch's scores are the final weights' (averaged ones too: SwapEMAWeights put
    # them in before the callback ran).
    scored = wer_callback.scored if wer_callback.scored_epoch == results["epochs"] else {}
    with open(os.path.join(args.out, "hypotheses.tsv"), "w", newline="") as f:
        rows = csv.writer(f, delimiter="\t", lineterminator="\n")
        rows.writerow(("set", "reference", "hypothesis"))
        for name, dataset in test_ds.items():
            wer, refs, hyps = scored[name] if name in scored else evaluate(dataset)
            results["wer"][name] = wer
            results["test_utterances"][name] = len(refs)
            rows.writerows((name, r, h) for r, h in zip(refs, hyps))
            print(f"held-out WER ({name}): {wer:.2%} on {len(refs)} utterances")
            for r, h in list(zip(refs, hyps))[:3]:
                print(f"  ref: {r}\n  hyp: {h}")
    results["decoding"] = {}
    for name, dataset in test_ds.items():
        speed = results["decoding"][name] = decoding_speed(model, dataset, args.max_symbols)
        print(f"greedy search ({name}): {speed['search_ms_per_audio_second']:.2f} ms and "
              f"{speed['joint_steps_per_audio_second']:.1f} joint steps per second of audio")
    if args.beam_size:
        results["wer_beam"] = {}
        evaluate_beam = make_evaluator(model, beam_size=args.beam_size, tokenizer=tokenizer)
        for name, dataset in test_ds.items():
            wer, _, _ = evaluate_beam(dataset)
            results["wer_beam"][name] = wer
            print(f"held-out WER ({name}), beam search of {args.beam_size}: {wer:.2%}")
    print(f"training took {train_seconds:.0f} s ({results['train_cpu_seconds']:.0f} s CPU)")
    if not args.no_export:
        import export

        path = os.path.join(args.out, "saved_model")
        export.export_saved_model(model, path, tokenizer=tokenizer)
        results["saved_model"] = path
        kind = "streaming" if config.encoder == "lstm" else "whole-utterance"
        print(f"exported the {kind} SavedModel to {path}")
        if args.tflite:
            path = os.path.join(args.out, "streaming_step.tflite")
            export.export_tflite(model, path, tokenizer=tokenizer)
            results["tflite"] = path
            print(f"exported the TFLite streaming step to {path}")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(f"total time {time.time() - start:.0f} s, {time.process_time() - start_cpu:.0f} s CPU")
    return results


if __name__ == "__main__":
    main()
