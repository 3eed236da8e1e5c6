"""Synthesizes the spoken-digit speech set with espeak-ng and sox.

The committed set under examples/speech/data/ was made by this script with its defaults. It
needs the Debian packages espeak-ng and sox (`apt-get install -y espeak-ng sox`); training and
tests only read the committed WAV files, so they run without them.

Every utterance gets a random English accent, voice variant, speaking rate, pitch and word gap,
is trimmed, band-limited and stored as 8 kHz 16-bit mono WAV (telephone band, to keep the
repository small: the pipeline resamples to 16 kHz), and gets background noise at a random SNR.
The test split holds digit strings that never occur in the training split.

    python examples/speech/make_data.py --out /tmp/speech_big --train 3000 --test 300
"""

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import wave

import numpy as np

DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
ACCENTS = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd",
           "en-029", "en-us-nyc")
VARIANTS = ("m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f4", "f5", "klatt",
            "klatt2", "klatt3", "adam", "ed", "john", "linda", "aunty", "belinda", "david",
            "edward", "max", "paul", "robert", "steph", "travis", "zac", "Andy", "Annie", "Alicia")
# Short phrases around digit strings, plus a few commands: the training set is not digits only.
TEMPLATES = ("call {d}", "dial {d}", "press {d}", "my number is {d}", "the code is {d}",
             "room {d}", "extension {d}", "send {d}", "{d} please", "{d} is correct")
COMMANDS = ("yes", "no", "stop", "cancel", "go back", "start again", "help", "repeat that please",
            "that is correct", "call me back", "hello", "thank you", "goodbye", "next", "menu")
SAMPLE_RATE = 8000


def digit_string(rng, min_len, max_len):
    return " ".join(DIGITS[rng.randrange(10)] for _ in range(rng.randint(min_len, max_len)))


def make_transcripts(rng, num_train, num_test, test_min_len=3, max_len=7):
    """Returns (train, test) transcript lists; no test digit string appears in training."""
    test = []
    seen = set()
    while len(test) < num_test:
        text = digit_string(rng, test_min_len, max_len)
        if text not in seen:
            seen.add(text)
            test.append(text)
    train = []
    while len(train) < num_train:
        kind = rng.random()
        if kind < 0.65:
            text = digit_string(rng, 1, max_len)
            if text in seen:
                continue
        elif kind < 0.9:
            digits = digit_string(rng, 1, 4)
            if digits in seen:
                continue
            text = rng.choice(TEMPLATES).format(d=digits)
        else:
            text = rng.choice(COMMANDS)
        train.append(text)
    return train, test


def synthesize(text, path, rng, np_rng, workdir):
    """espeak-ng -> sox (trim, band-limit, 8 kHz) -> numpy (gain, noise) -> 16-bit WAV."""
    voice = f"{rng.choice(ACCENTS)}+{rng.choice(VARIANTS)}"
    rate = rng.randint(140, 230)
    pitch = rng.randint(25, 75)
    gap = rng.choice((0, 0, 1, 2, 4))  # extra pause between words, in units of 10 ms
    raw = os.path.join(workdir, "raw.wav")
    out = os.path.join(workdir, "out.wav")
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate), "-p", str(pitch), "-g", str(gap),
                    "-w", raw, text], check=True, capture_output=True)
    subprocess.run(["sox", raw, "-r", str(SAMPLE_RATE), "-b", "16", "-c", "1", out,
                    "silence", "1", "0.02", "0.5%", "reverse", "silence", "1", "0.02", "0.5%",
                    "reverse", "pad", "0.05", "0.05", "norm", "-3"],
                   check=True, capture_output=True)
    with wave.open(out, "rb") as f:
        audio = np.frombuffer(f.readframes(f.getnframes()), np.int16).astype(np.float64) / 32768
    audio *= 10 ** (rng.uniform(-12, 0) / 20)
    snr_db = rng.uniform(10, 35)
    noise = np_rng.standard_normal(len(audio))
    if rng.random() < 0.5:  # brown-ish noise: low-frequency rumble instead of hiss
        noise = np.cumsum(noise)
        noise -= np.convolve(noise, np.ones(64) / 64, mode="same")
    speech_power = np.mean(audio ** 2) + 1e-12
    noise *= np.sqrt(speech_power / (np.mean(noise ** 2) + 1e-12) / 10 ** (snr_db / 10))
    audio = np.clip(audio + noise, -1.0, 32767 / 32768)
    with wave.open(path, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(SAMPLE_RATE)
        f.writeframes(np.round(audio * 32768).astype("<i2").tobytes())
    return voice, rate, pitch, snr_db


def write_split(name, texts, out_dir, rng, np_rng, workdir):
    os.makedirs(os.path.join(out_dir, "wav"), exist_ok=True)
    rows = []
    for i, text in enumerate(texts):
        rel = f"wav/{name}_{i:05d}.wav"
        voice, rate, pitch, snr = synthesize(text, os.path.join(out_dir, rel), rng, np_rng, workdir)
        rows.append(f"{rel}\t{text}\t{voice}\t{rate}\t{pitch}\t{snr:.1f}\n")
    with open(os.path.join(out_dir, f"{name}.tsv"), "w") as f:
        f.write("path\ttranscript\tvoice\trate\tpitch\tsnr_db\n")
        f.writelines(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "data"))
    parser.add_argument("--train", type=int, default=400, help="training utterances")
    parser.add_argument("--test", type=int, default=50, help="held-out digit strings")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found: apt-get install -y espeak-ng sox "
                     "(the committed set in examples/speech/data needs neither)")
    rng = random.Random(args.seed)
    np_rng = np.random.default_rng(args.seed)
    train, test = make_transcripts(rng, args.train, args.test)
    if os.path.isdir(os.path.join(args.out, "wav")):
        shutil.rmtree(os.path.join(args.out, "wav"))
    with tempfile.TemporaryDirectory() as workdir:
        write_split("train", train, args.out, rng, np_rng, workdir)
        write_split("test", test, args.out, rng, np_rng, workdir)
    print(f"wrote {len(train)} training and {len(test)} test utterances to {args.out}")


if __name__ == "__main__":
    main()
