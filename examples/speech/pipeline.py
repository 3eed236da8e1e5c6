"""tf.data speech pipeline: WAV -> 16 kHz audio -> log-mel features -> bucketed padded batches.

Stages (all TensorFlow ops, so they run inside tf.data and export into a SavedModel):
  read + decode WAV, resample to 16 kHz, training-time augmentation (speed perturbation by
  resampling, gain, added noise), log-mel features (tf.signal), SpecAugment-style masking
  (training only), character tokenization, bucketing by length, padded batches with lengths.

Backends: where tensorflow-io loads its native ops (tensorflow-io 0.37.1 does so only with
TensorFlow <= 2.17.1) decoding and resampling use tensorflow-io; elsewhere core TensorFlow
(`tf.audio.decode_wav` and the windowed-sinc resampler below) does the same job. Pick one with
`set_audio_backend("tfio" | "core")`; the default is tfio when it loads.

Tokenization (`Tokenizer`): characters (`CHARACTERS`: blank, space, apostrophe, a-z; any
English text, 29 tokens) or whole words (`WORDS`: blank and the 35 words of the committed
transcripts: the ten digit words and those of the phrases and commands around them). The task is
digit strings: word tokens give one label per spoken word instead of about five characters, so
the transducer has far fewer labels to align and nothing to spell; words outside the vocabulary
are dropped. Both decode to the same text (words separated by single spaces).
"""

import csv
import dataclasses
import os

import numpy as np
import tensorflow as tf

SAMPLE_RATE = 16000
BLANK = 0
LABEL_PAD = -1  # labels are padded with this value (never a valid token)
# Index 0 is the RNN-T blank; the others are characters.
VOCABULARY = ("<blank>", " ", "'") + tuple(chr(c) for c in range(ord("a"), ord("z") + 1))
VOCAB_SIZE = len(VOCABULARY)

_backend = None


# ----------------------------------------------------------------------------- backends


def tfio_available():
    """True when tensorflow_io imports and its native audio ops run with this TensorFlow."""
    try:
        import tensorflow_io as tfio  # noqa: F401

        tfio.audio.resample(tf.zeros([8, 1]), rate_in=8000, rate_out=16000)
        return True
    except Exception:  # ImportError, NotImplementedError, undefined-symbol load errors
        return False


def set_audio_backend(name):
    """Selects "tfio" (tensorflow-io) or "core" (core TensorFlow) for decoding and resampling."""
    global _backend
    if name not in ("tfio", "core"):
        raise ValueError(f"audio backend must be 'tfio' or 'core', got {name!r}")
    if name == "tfio" and not tfio_available():
        raise RuntimeError("tensorflow-io's native ops do not load with this TensorFlow "
                           f"({tf.__version__}); use the 'core' backend")
    _backend = name


def audio_backend():
    global _backend
    if _backend is None:
        _backend = "tfio" if tfio_available() else "core"
    return _backend


# ----------------------------------------------------------------------------- audio


def _wav_sample_rate(contents):
    # Canonical RIFF/WAVE: the 'fmt ' chunk comes first and holds the rate at byte 24.
    return tf.io.decode_raw(tf.strings.substr(contents, 24, 4), tf.int32, little_endian=True)[0]


def decode_wav(contents):
    """Decodes WAV bytes to mono float32 audio in [-1, 1].

    Args:
      contents: scalar string, the bytes of a 16-bit PCM WAV file.

    Returns:
      `(audio [N] float32, sample_rate int32 scalar)`; multichannel files are averaged.
    """
    if audio_backend() == "tfio":
        import tensorflow_io as tfio

        samples = tfio.audio.decode_wav(contents, dtype=tf.int16)
        audio = tf.reduce_mean(tf.cast(samples, tf.float32), axis=1) / 32768.0
        return audio, _wav_sample_rate(contents)
    audio, sample_rate = tf.audio.decode_wav(contents)
    return tf.reduce_mean(audio, axis=1), sample_rate


def _gcd(a, b):
    return tf.while_loop(lambda a, b: b > 0, lambda a, b: (b, a % b), (a, b))[0]


def _windowed_sinc(distance, cutoff, half_width):
    """Low-pass filter taps (float64) at `distance` samples from the centre: an ideal low-pass
    at `cutoff` (a fraction of the Nyquist rate) under a Hann window that is zero from
    `half_width` samples on."""
    window = tf.where(tf.abs(distance) < half_width,
                      0.5 + 0.5 * tf.cos(np.pi * distance / half_width), tf.zeros_like(distance))
    x = cutoff * distance
    sinc = tf.where(tf.abs(x) < 1e-9, tf.ones_like(x), tf.sin(np.pi * x) / (np.pi * x + 1e-300))
    return cutoff * sinc * window


def _sinc_resample(audio, rate_in, rate_out, zero_crossings):
    rate_in = tf.cast(rate_in, tf.int64)
    rate_out = tf.cast(rate_out, tf.int64)
    num_in = tf.cast(tf.shape(audio)[0], tf.int64)
    num_out = (num_in * rate_out + rate_in - 1) // rate_in  # ceil
    # With up = rate_out / g and down = rate_in / g, output sample n sits at input position
    # n * down / up: integer part (n * down) // up, fraction phase / up with
    # phase = (n * down) % up. Only `up` distinct phases exist, so the filter taps are computed
    # once per phase ([up, taps]).
    g = _gcd(rate_in, rate_out)
    up, down = rate_out // g, rate_in // g
    # Low-pass at the lower of the two Nyquist rates, relative to the input rate.
    cutoff = tf.minimum(tf.constant(1.0, tf.float64),
                        tf.cast(rate_out, tf.float64) / tf.cast(rate_in, tf.float64))
    half_width = zero_crossings / cutoff  # in input samples
    num_taps = 2 * tf.cast(tf.math.ceil(half_width), tf.int64) + 1
    offsets = tf.range(num_taps, dtype=tf.int64) - num_taps // 2
    phase_frac = tf.cast(tf.range(up, dtype=tf.int64), tf.float64) / tf.cast(up, tf.float64)
    distance = phase_frac[:, None] - tf.cast(offsets, tf.float64)[None, :]  # position - tap
    table = tf.cast(_windowed_sinc(distance, cutoff, half_width), tf.float32)  # [up, taps]
    half = num_taps // 2
    width = ((down + 2 * half) + down - 1) // down * down
    return tf.cond(up * width <= _MAX_FILTER_BANK,
                   lambda: _polyphase(audio, table, up, down, half, width, num_in, num_out),
                   lambda: _gather_taps(audio, table, up, down, half, num_out))


# Largest polyphase filter bank ([width, up] floats) worth building; beyond it (rates with a
# tiny common divisor) the taps are gathered per output sample instead.
_MAX_FILTER_BANK = 1 << 22


def _polyphase(audio, table, up, down, half, width, num_in, num_out):
    # Output n = up * q + r reads input (q * down + (r * down) // up + j - half) with the taps
    # of phase (r * down) % up, j in [0, 2 * half]. Folding the offset (r * down) // up into
    # each phase's filter turns this into one matrix product: frames of the padded input,
    # `width` long every `down` samples, times a [width, up] filter bank.
    r = tf.range(up, dtype=tf.int64)
    shift = (r * down) // up
    taps = tf.gather(table, (r * down) % up)  # [up, 2 * half + 1]
    j = tf.range(2 * half + 1, dtype=tf.int64)
    rows = shift[:, None] + j[None, :]
    index = tf.reshape(tf.stack([rows, tf.broadcast_to(r[:, None], tf.shape(rows))], -1), [-1, 2])
    bank = tf.scatter_nd(index, tf.reshape(taps, [-1]), tf.stack([width, up]))
    num_q = (num_out + up - 1) // up
    needed = (num_q - 1) * down + width
    padded = tf.pad(audio, [[half, tf.maximum(needed - half - num_in, 0)]])
    frames = tf.signal.frame(padded, tf.cast(width, tf.int32), tf.cast(down, tf.int32))[:num_q]
    return tf.reshape(tf.matmul(frames, bank), [-1])[:num_out]


def _gather_taps(audio, table, up, down, half, num_out):
    n = tf.range(num_out, dtype=tf.int64)
    left = (n * down) // up
    weights = tf.gather(table, (n * down) % up)  # [num_out, taps]
    padded = tf.pad(audio, [[half, half + 1]])
    offsets = tf.range(2 * half + 1, dtype=tf.int64)
    return tf.reduce_sum(tf.gather(padded, left[:, None] + offsets[None, :]) * weights, axis=1)


def resample(audio, rate_in, rate_out=SAMPLE_RATE, zero_crossings=16):
    """Band-limited resampling of a 1-D signal between any two integer rates.

    Core backend: windowed-sinc interpolation (Hann window, `zero_crossings` zero crossings of
    the sinc on each side, anti-aliasing cutoff at the lower Nyquist rate); tfio backend:
    `tfio.audio.resample`.

    Args:
      audio: `[N]` float32.
      rate_in: int scalar (may be a tensor), the input rate in Hz.
      rate_out: int scalar, the output rate in Hz.

    Returns:
      `[ceil(N * rate_out / rate_in)]` float32.
    """
    audio = tf.convert_to_tensor(audio, tf.float32)
    rate_in = tf.cast(rate_in, tf.int64)
    rate_out = tf.cast(rate_out, tf.int64)
    if audio_backend() == "tfio":
        import tensorflow_io as tfio

        num_in = tf.cast(tf.shape(audio)[0], tf.int64)
        num_out = (num_in * rate_out + rate_in - 1) // rate_in
        # tfio's filter delays its output by 32 samples of the lower rate (measured on tones
        # for 8-44.1 kHz): pad the input's end, drop that delay, keep the core backend's length.
        lower = tf.minimum(rate_in, rate_out)
        delay = (32 * rate_out + lower // 2) // lower
        extra = (delay * rate_in + rate_out - 1) // rate_out + 1
        out = tfio.audio.resample(tf.pad(audio, [[0, extra]])[:, None], rate_in=rate_in,
                                  rate_out=rate_out)[:, 0]
        return out[delay:delay + num_out]
    return tf.cond(tf.equal(rate_in, rate_out), lambda: tf.identity(audio),
                   lambda: _sinc_resample(audio, rate_in, rate_out, float(zero_crossings)))


# ----------------------------------------------------------------------------- features


@dataclasses.dataclass(frozen=True)
class FeatureConfig:
    """Log-mel front end: 25 ms Hann frames every 10 ms at 16 kHz.

    The mel range stops at 4 kHz: the shipped audio is telephone band (8 kHz), and a model
    trained on it should not rely on content it never saw above that.
    """

    sample_rate: int = SAMPLE_RATE
    frame_length: int = 400
    frame_step: int = 160
    fft_length: int = 512
    num_mel_bins: int = 40
    lower_edge_hertz: float = 20.0
    upper_edge_hertz: float = 4000.0
    log_floor: float = 1e-6


def num_frames(num_samples, config=FeatureConfig()):
    """Frames of `log_mel` for `num_samples` samples (no padding at the ends)."""
    return tf.maximum(0, 1 + (num_samples - config.frame_length) // config.frame_step)


def mel_matrix(config=FeatureConfig(), warp=1.0):
    """`[fft bins, mel bins]`; `warp` (scalar, may be a tensor) scales the frequency axis: the
    filter bank reads the spectrum as if it were sampled at `warp * sample_rate`, so content at
    f Hz lands in the bins of `warp * f` Hz (vocal tract length perturbation)."""
    return tf.signal.linear_to_mel_weight_matrix(
        config.num_mel_bins, config.fft_length // 2 + 1,
        config.sample_rate if isinstance(warp, float) and warp == 1.0
        else warp * config.sample_rate, config.lower_edge_hertz, config.upper_edge_hertz)


def log_mel(audio, config=FeatureConfig(), warp=1.0):
    """`[..., N]` float32 audio -> `[..., frames, num_mel_bins]` log mel power (`warp`: see
    `mel_matrix`; 1 outside training)."""
    stft = tf.signal.stft(audio, config.frame_length, config.frame_step, config.fft_length,
                          window_fn=tf.signal.hann_window, pad_end=False)
    power = tf.math.square(tf.abs(stft))
    mel = tf.tensordot(power, mel_matrix(config, warp), 1)
    return tf.math.log(mel + config.log_floor)


def spec_augment(features, length, seed, num_freq_masks=2, max_freq_width=6, num_time_masks=2,
                 max_time_width=20, max_time_ratio=0.1, mask_value=0.0):
    """SpecAugment-style masking (Park et al. 2019) of one utterance, no time warping.

    Args:
      features: `[T, F]` float32.
      length: int scalar, valid frames (masks stay inside them).
      seed: `[2]` int, stateless random seed.
      max_time_width: cap on a time mask's width; also at most `max_time_ratio * length`.
      mask_value: scalar or `[F]`, written into the masked cells.

    Returns:
      `[T, F]` float32 with up to `num_freq_masks` frequency bands and `num_time_masks` time
      spans replaced by `mask_value`.
    """
    max_t, num_bins = tf.shape(features)[0], tf.shape(features)[1]
    length = tf.cast(length, tf.int32)
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 4)
    keep = tf.ones_like(features, tf.bool)

    def spans(seed_width, seed_start, count, max_width, limit):
        width = tf.random.stateless_uniform([count], seed_width, 0, max_width + 1, tf.int32)
        width = tf.minimum(width, limit)
        start = tf.random.stateless_uniform([count], seed_start, 0, 1 << 30, tf.int32)
        start = start % tf.maximum(limit - width + 1, 1)
        return start, width

    f_start, f_width = spans(seeds[0], seeds[1], num_freq_masks, max_freq_width, num_bins)
    bins = tf.range(num_bins)
    for i in range(num_freq_masks):
        band = (bins >= f_start[i]) & (bins < f_start[i] + f_width[i])
        keep &= ~band[None, :]
    time_cap = tf.minimum(max_time_width,
                          tf.cast(tf.cast(length, tf.float32) * max_time_ratio, tf.int32))
    t_start, t_width = spans(seeds[2], seeds[3], num_time_masks, max_time_width, length)
    t_width = tf.minimum(t_width, time_cap)
    frames = tf.range(max_t)
    for i in range(num_time_masks):
        span = (frames >= t_start[i]) & (frames < t_start[i] + t_width[i])
        keep &= ~span[:, None]
    mask_value = tf.broadcast_to(tf.cast(mask_value, features.dtype), [num_bins])
    return tf.where(keep, features, mask_value[None, :])


# ----------------------------------------------------------------------------- text


def encode_text(text):
    """Scalar string -> `[U]` int32 character ids (unknown characters dropped)."""
    chars = tf.strings.unicode_decode(tf.strings.lower(text), "UTF-8")
    ids = tf.where(chars == ord(" "), 1,
                   tf.where(chars == ord("'"), 2,
                            tf.where((chars >= ord("a")) & (chars <= ord("z")),
                                     chars - ord("a") + 3, -1)))
    return tf.boolean_mask(ids, ids >= 0)


def decode_ids(ids):
    """Python: a sequence of token ids -> text (blank and invalid ids skipped)."""
    return "".join(VOCABULARY[i] for i in ids if 0 < i < VOCAB_SIZE)


def normalize_transcript(text):
    return " ".join(decode_ids(encode_text(text).numpy()).split())


# The ten digit words, then the other words of the committed transcripts (`data/train.tsv`).
WORD_LIST = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
             "call", "cancel", "code", "correct", "dial", "extension", "goodbye", "hello", "is",
             "menu", "my", "next", "no", "number", "please", "press", "repeat", "room", "send",
             "thank", "that", "the", "transcript", "yes", "you")


def encode_words(text, words=WORD_LIST):
    """Scalar string -> `[U]` int32 word ids (1 + index in `words`; unknown words dropped)."""
    tokens = tf.strings.split(tf.strings.lower(text))
    matches = tf.equal(tokens[:, None], tf.constant(words)[None, :])
    ids = tf.argmax(tf.cast(matches, tf.int32), axis=1, output_type=tf.int32) + 1
    return tf.boolean_mask(ids, tf.reduce_any(matches, axis=1))


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """Text <-> token ids; id 0 (`BLANK`) is the RNN-T blank.

    Attributes:
      unit: "characters" or "words".
      vocabulary: the text of each id (`vocabulary[0]` is the blank's name).
    """

    unit: str
    vocabulary: tuple

    @property
    def size(self):
        return len(self.vocabulary)

    def encode(self, text):
        """Scalar string tensor -> `[U]` int32 ids."""
        if self.unit == "words":
            return encode_words(text, self.vocabulary[1:])
        return encode_text(text)

    def decode(self, ids):
        """Python: a sequence of ids -> text (blank and invalid ids skipped)."""
        tokens = [self.vocabulary[i] for i in ids if 0 < i < self.size]
        return " ".join(tokens) if self.unit == "words" else "".join(tokens)

    def token_texts(self):
        """The text a streaming decoder appends for each id: words end with a space."""
        if self.unit == "words":
            return (self.vocabulary[0],) + tuple(w + " " for w in self.vocabulary[1:])
        return self.vocabulary


CHARACTERS = Tokenizer("characters", VOCABULARY)
WORDS = Tokenizer("words", ("<blank>",) + WORD_LIST)
TOKENIZERS = {"characters": CHARACTERS, "words": WORDS}


# ----------------------------------------------------------------------------- datasets


def read_manifest(path):
    """Reads a TSV manifest (path, transcript, ...) -> (absolute paths, transcripts)."""
    root = os.path.dirname(os.path.abspath(path))
    paths, texts = [], []
    with open(path, newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            paths.append(os.path.join(root, row["path"]))
            texts.append(row["transcript"])
    return paths, texts


def load_audio(path):
    """File path -> 16 kHz float32 audio `[N]`."""
    audio, sample_rate = decode_wav(tf.io.read_file(path))
    return resample(audio, sample_rate, SAMPLE_RATE)


@dataclasses.dataclass(frozen=True)
class AugmentConfig:
    speed_factors: tuple = (0.9, 1.0, 1.1)  # by resampling, as in Kaldi's speed perturbation
    gain_db: tuple = (-6.0, 6.0)
    noise_probability: float = 0.5
    snr_db: tuple = (10.0, 40.0)
    # Vocal tract length perturbation (Jaitly & Hinton 2013): a uniform random frequency warp
    # of the mel filter bank per utterance, formants shifted without changing the tempo. Off by
    # default: (0.88, 1.12) gave a worse held-out speaker in the CPU default's budget (README).
    warp: tuple = (1.0, 1.0)
    # Random low-pass filtering (a muffled microphone or channel): with this probability, speech
    # above a cutoff drawn from `lowpass_hz` is removed before the noise is added. Off by default:
    # it raised the held-out speaker's WER at the CPU default's size (README).
    lowpass_probability: float = 0.0
    lowpass_hz: tuple = (1000.0, 4000.0)
    num_freq_masks: int = 2
    max_freq_width: int = 6
    num_time_masks: int = 2
    max_time_width: int = 20
    max_time_ratio: float = 0.1


def lowpass(audio, cutoff_hz, taps=63):
    """`[N]` audio through a linear-phase low-pass FIR filter (Hann-windowed sinc, `taps` long,
    -6 dB at `cutoff_hz`, may be a tensor); the output is aligned with the input."""
    half = (taps - 1) // 2
    distance = tf.range(-half, half + 1, dtype=tf.float64)
    kernel = _windowed_sinc(distance, 2.0 * tf.cast(cutoff_hz, tf.float64) / SAMPLE_RATE, half)
    kernel = tf.cast(kernel / tf.reduce_sum(kernel), tf.float32)  # unit gain at 0 Hz
    return tf.nn.conv1d(audio[None, :, None], kernel[:, None, None], 1, "SAME")[0, :, 0]


def augment_audio(audio, seed, config=AugmentConfig()):
    """Speed perturbation, random gain, random low-pass filtering and additive white noise
    (stateless random)."""
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 5)
    factors = tf.constant(config.speed_factors, tf.float32)
    pick = tf.random.stateless_uniform([], seeds[0], 0, len(config.speed_factors), tf.int32)
    # Playing 16 kHz audio as if it were recorded at factor * 16 kHz changes its speed.
    rate_in = tf.cast(tf.round(factors[pick] * SAMPLE_RATE), tf.int64)
    audio = resample(audio, rate_in, SAMPLE_RATE)
    gain_db = tf.random.stateless_uniform([], seeds[1], *config.gain_db)
    audio = audio * tf.pow(10.0, gain_db / 20.0)
    if config.lowpass_probability > 0:
        # Seeds of their own, so that turning it on leaves the other draws as they were.
        lowpass_seeds = tf.random.experimental.stateless_split(
            tf.random.experimental.stateless_fold_in(tf.cast(seed, tf.int64), 1), 2)
        cutoff = tf.random.stateless_uniform([], lowpass_seeds[0], *config.lowpass_hz)
        muffle = tf.random.stateless_uniform([], lowpass_seeds[1]) < config.lowpass_probability
        audio = tf.cond(muffle, lambda: lowpass(audio, cutoff), lambda: audio)
    snr_db = tf.random.stateless_uniform([], seeds[2], *config.snr_db)
    power = tf.reduce_mean(tf.square(audio)) + 1e-10
    noise = tf.random.stateless_normal(tf.shape(audio), seeds[3])
    noise *= tf.sqrt(power / tf.pow(10.0, snr_db / 10.0))
    add_noise = tf.random.stateless_uniform([], seeds[4]) < config.noise_probability
    return tf.where(add_noise, audio + noise, audio)


def default_bucket_boundaries(max_frames=800, step=50):
    return list(range(step, max_frames, step))


def decoded_dataset(manifest, tokenizer=None, cache=True):
    """`(audio [N] float32 at 16 kHz, labels [U] int32)` per utterance of a manifest (TSV path or
    `(paths, transcripts)`), decoded once: with `cache` the first full pass keeps the audio in
    memory, and every dataset built on this one (`make_dataset`, `feature_dataset`) reads it
    from there."""
    encode = (tokenizer or CHARACTERS).encode
    paths, texts = read_manifest(manifest) if isinstance(manifest, str) else manifest
    ds = tf.data.Dataset.from_tensor_slices((list(paths), list(texts)))
    ds = ds.map(lambda p, t: (load_audio(p), encode(t)), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.cache() if cache else ds


def make_dataset(manifest, batch_size=32, training=False, feature_config=FeatureConfig(),
                 augment_config=AugmentConfig(), mask_value=0.0, bucket_boundaries=None,
                 seed=0, cache=True, repeat=False, tokenizer=None):
    """Batched dataset for `model.fit` / evaluation.

    Elements: `({"features": [B, T, F] float32, "feature_lengths": [B] int32,
    "labels": [B, U] int32}, labels)`; labels are padded with `LABEL_PAD`, features with 0.
    Batches come out of `tf.data.Dataset.bucket_by_sequence_length` (similar lengths batched
    together, less padding); in training the audio is augmented and the features masked.

    Args:
      manifest: TSV path, a `(paths, transcripts)` pair, or a `decoded_dataset` (then `cache`
        and `tokenizer` are its own).
      mask_value: SpecAugment fill, scalar or `[F]` (e.g. the training features' mean).
      tokenizer: a `Tokenizer` for the labels (default `CHARACTERS`).
    """
    if isinstance(manifest, tf.data.Dataset):
        ds = manifest
    else:
        ds = decoded_dataset(manifest, tokenizer, cache)  # augmentation below: random per epoch
    if training:
        ds = ds.shuffle(int(ds.cardinality()), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    mask_value = tf.constant(mask_value, tf.float32)

    def featurize(seed_pair, audio, labels):
        warp = 1.0
        if training:
            audio = augment_audio(audio, seed_pair[0], augment_config)
        if training and augment_config.warp != (1.0, 1.0):
            warp = tf.random.stateless_uniform(
                [], tf.random.experimental.stateless_fold_in(seed_pair[0], 5),
                *augment_config.warp)
        feats = log_mel(audio, feature_config, warp)
        length = tf.shape(feats)[0]
        if training:
            c = augment_config
            feats = spec_augment(feats, length, seed_pair[1], c.num_freq_masks, c.max_freq_width,
                                 c.num_time_masks, c.max_time_width, c.max_time_ratio,
                                 mask_value)
        return {"features": feats, "feature_lengths": length, "labels": labels}

    seeds = tf.data.Dataset.random(seed=seed).batch(4).map(lambda s: tf.reshape(s, [2, 2]))
    ds = tf.data.Dataset.zip((seeds, ds)).map(lambda s, x: featurize(s, *x),
                                              num_parallel_calls=tf.data.AUTOTUNE)
    boundaries = bucket_boundaries or default_bucket_boundaries()
    ds = ds.bucket_by_sequence_length(
        lambda x: x["feature_lengths"], boundaries, [batch_size] * (len(boundaries) + 1),
        padded_shapes={"features": [None, feature_config.num_mel_bins], "feature_lengths": [],
                       "labels": [None]},
        padding_values={"features": 0.0, "feature_lengths": 0, "labels": LABEL_PAD},
        drop_remainder=False)
    ds = ds.map(lambda x: (x, x["labels"]))
    return ds.prefetch(tf.data.AUTOTUNE)


def feature_dataset(manifest, feature_config=FeatureConfig()):
    """The (unaugmented) log-mel features of a manifest's utterances (or of a
    `decoded_dataset`), one `[1, T, F]` batch each: what `keras.layers.Normalization.adapt`
    takes for per-bin statistics."""
    if isinstance(manifest, tf.data.Dataset):
        audio = manifest.map(lambda audio, labels: audio)
    else:
        paths, _ = read_manifest(manifest) if isinstance(manifest, str) else manifest
        audio = tf.data.Dataset.from_tensor_slices(list(paths)).map(
            load_audio, num_parallel_calls=tf.data.AUTOTUNE)
    return audio.map(lambda x: log_mel(x, feature_config)[None],
                     num_parallel_calls=tf.data.AUTOTUNE)
