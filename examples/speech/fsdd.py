"""Human speech for the speech example: digit strings made from Free Spoken Digit Dataset words.

The committed words (`data/fsdd/recordings`, a subset of FSDD, CC BY-SA 4.0, see
`data/fsdd/README.md`) are single English digit words by six speakers. This module joins them
into digit strings with random pauses, gains and background noise, deterministically from a seed,
and writes them as 8 kHz WAV files with `train.tsv` / `test.tsv` manifests. The test speaker's
words never occur in training: the held-out split measures recognition of an unseen voice.

    python examples/speech/fsdd.py --out /tmp/fsdd_strings               # the CPU default set
    python examples/speech/fsdd.py --out /tmp/fsdd_big --train 8000 --test 300

`--copy-subset SOURCE` rebuilds the committed subset from a full FSDD checkout.
"""

import argparse
import csv
import os
import shutil
import wave
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RECORDINGS = os.path.join(HERE, "data", "fsdd", "recordings")
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SAMPLE_RATE = 8000
TEST_SPEAKER = "jackson"
TRAIN_SPEAKERS = ("george", "lucas", "nicolas", "theo", "yweweler")
# Takes committed per speaker and digit (FSDD has 50): the repository keeps under 12 MB of them.
# theo, the training speaker whose accent matches the held-out one, keeps all his takes.
TAKES = {"george": range(5, 32), "lucas": range(5, 32), "nicolas": range(5, 32),
         "yweweler": range(5, 32), "theo": range(0, 50), TEST_SPEAKER: range(0, 15)}


def copy_subset(source, dest=RECORDINGS):
    """Copies the committed subset of FSDD (`{digit}_{speaker}_{take}.wav`) from `source`."""
    os.makedirs(dest, exist_ok=True)
    count = 0
    for speaker, takes in TAKES.items():
        for digit in range(10):
            for take in takes:
                name = f"{digit}_{speaker}_{take}.wav"
                shutil.copyfile(os.path.join(source, name), os.path.join(dest, name))
                count += 1
    return count


def read_wav(path):
    with wave.open(path, "rb") as f:
        if f.getsampwidth() != 2 or f.getframerate() != SAMPLE_RATE:
            raise ValueError(f"{path}: expected 16-bit {SAMPLE_RATE} Hz audio")
        data = np.frombuffer(f.readframes(f.getnframes()), "<i2").astype(np.float32) / 32768.0
        return data.reshape(-1, f.getnchannels()).mean(axis=1)


def write_wav(path, audio):
    samples = np.clip(np.round(audio * 32767.0), -32768, 32767).astype("<i2")
    with wave.open(path, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(SAMPLE_RATE)
        f.writeframes(samples.tobytes())


def recordings_id(recordings=RECORDINGS):
    """A short fingerprint of the committed file names, so that made strings follow the subset."""
    names = sorted(n for n in os.listdir(recordings) if n.endswith(".wav"))
    return f"{len(names)}-{zlib.crc32(' '.join(names).encode()):08x}"


def load_words(recordings=RECORDINGS):
    """`{speaker: {digit: [audio, ...]}}` of the committed words, in a fixed order."""
    words = {}
    for name in sorted(os.listdir(recordings)):
        if not name.endswith(".wav"):
            continue
        digit, speaker, _ = name[:-4].split("_")
        audio = read_wav(os.path.join(recordings, name))
        audio = audio - audio.mean()
        words.setdefault(speaker, {}).setdefault(int(digit), []).append(audio)
    return words


def digit_string_audio(rng, words, digits):
    """One speaker's words for `digits`, joined with pauses, random gains and background noise."""
    pieces = [np.zeros(int(rng.uniform(0.05, 0.3) * SAMPLE_RATE), np.float32)]
    for i, digit in enumerate(digits):
        takes = words[digit]
        word = takes[rng.integers(len(takes))]
        word = word / (np.abs(word).max() + 1e-6) * 10 ** (rng.uniform(-8, -1) / 20)
        pieces.append(word.astype(np.float32))
        if i + 1 < len(digits):
            pieces.append(np.zeros(int(rng.uniform(0.02, 0.25) * SAMPLE_RATE), np.float32))
    pieces.append(np.zeros(int(rng.uniform(0.05, 0.3) * SAMPLE_RATE), np.float32))
    audio = np.concatenate(pieces)
    speech_power = np.mean(np.concatenate([p for p in pieces if p.any()]) ** 2)
    snr_db = rng.uniform(15.0, 40.0)
    noise = rng.standard_normal(len(audio)).astype(np.float32)
    if rng.random() < 0.5:  # brown-ish noise: low-frequency hum instead of hiss
        noise = np.cumsum(noise)
        noise -= np.convolve(noise, np.ones(64) / 64, mode="same")
    noise *= np.sqrt(speech_power / 10 ** (snr_db / 10) / (np.mean(noise ** 2) + 1e-12))
    return (audio + noise).astype(np.float32), snr_db


def write_split(out_dir, split, rng, words_by_speaker, speakers, count, min_len, max_len):
    rows = []
    os.makedirs(os.path.join(out_dir, "wav"), exist_ok=True)
    for i in range(count):
        speaker = speakers[rng.integers(len(speakers))]
        digits = rng.integers(0, 10, size=rng.integers(min_len, max_len + 1))
        audio, snr_db = digit_string_audio(rng, words_by_speaker[speaker], digits)
        path = f"wav/{split}_{i:05d}.wav"
        write_wav(os.path.join(out_dir, path), audio)
        rows.append((path, " ".join(DIGITS[d] for d in digits), speaker, f"{snr_db:.1f}"))
    with open(os.path.join(out_dir, f"{split}.tsv"), "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(("path", "transcript", "speaker", "snr_db"))
        writer.writerows(rows)
    return os.path.join(out_dir, f"{split}.tsv")


def make_digit_strings(out_dir, num_train=1600, num_test=100, seed=0, recordings=RECORDINGS):
    """Writes `out_dir/{train,test}.tsv` and their WAV files; the same arguments give the same
    files. Training strings (1-6 digits) use the training speakers, test strings (3-6 digits)
    the held-out speaker only. Each split draws from its own random stream, so the test strings
    do not depend on `num_train`.

    Returns:
      `(train manifest path, test manifest path)`.
    """
    words = load_words(recordings)
    train = write_split(out_dir, "train", np.random.default_rng([seed, 0]), words,
                        TRAIN_SPEAKERS, num_train, 1, 6)
    test = write_split(out_dir, "test", np.random.default_rng([seed, 1]), words,
                       (TEST_SPEAKER,), num_test, 3, 6)
    return train, test


def prepare(out_dir, num_train=1600, num_test=100, seed=0):
    """`make_digit_strings` unless `out_dir` already holds the set made with these arguments."""
    stamp = os.path.join(out_dir, "made_with.txt")
    key = f"speakers={','.join(TRAIN_SPEAKERS)} num_train={num_train} num_test={num_test} " \
          f"seed={seed} streams=split recordings={recordings_id()}\n"
    if os.path.exists(stamp) and open(stamp).read() == key:
        return os.path.join(out_dir, "train.tsv"), os.path.join(out_dir, "test.tsv")
    shutil.rmtree(out_dir, ignore_errors=True)
    manifests = make_digit_strings(out_dir, num_train, num_test, seed)
    with open(stamp, "w") as f:
        f.write(key)
    return manifests


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="output folder for the digit strings")
    p.add_argument("--train", type=int, default=1600)
    p.add_argument("--test", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--copy-subset", metavar="SOURCE",
                   help="copy the committed subset from a full FSDD recordings folder")
    args = p.parse_args()
    if args.copy_subset:
        print(f"copied {copy_subset(args.copy_subset)} recordings to {RECORDINGS}")
    if args.out:
        train, test = prepare(args.out, args.train, args.test, args.seed)
        print(f"wrote {train} and {test}")


if __name__ == "__main__":
    main()
