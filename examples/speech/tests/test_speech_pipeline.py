"""The speech example's tf.data pipeline (examples/speech/pipeline.py) against independent
computations: analytic sines for resampling, Python's `wave` for decoding, a float64 NumPy
STFT + mel filterbank for the features, and the committed WAV files for the batches."""

import os
import wave

import numpy as np
import pipeline
import pytest
import tensorflow as tf

SPEECH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # examples/speech
DATA = os.path.join(SPEECH, "data")
TFIO_REASON = ("tensorflow-io's native ops do not load with TensorFlow "
               f"{tf.__version__} (they need <= 2.17.1); the CI job with 2.17.1 runs these")
BACKENDS = [
    pytest.param("core", id="core"),
    pytest.param("tfio", id="tfio",
                 marks=pytest.mark.skipif(not pipeline.tfio_available(), reason=TFIO_REASON)),
]


@pytest.fixture(params=BACKENDS)
def backend(request):
    previous = pipeline.audio_backend()
    pipeline.set_audio_backend(request.param)
    yield request.param
    pipeline.set_audio_backend(previous)


@pytest.fixture
def core_backend():
    previous = pipeline.audio_backend()
    pipeline.set_audio_backend("core")
    yield
    pipeline.set_audio_backend(previous)


def _tones(t):
    return np.sin(2 * np.pi * 440.0 * t) + 0.5 * np.cos(2 * np.pi * 2500.0 * t + 0.3)


def write_wav(path, samples, rate):
    """int16 samples [N] or [N, C] -> a WAV file, written by Python's wave module."""
    samples = np.asarray(samples, np.int16)
    channels = 1 if samples.ndim == 1 else samples.shape[1]
    with wave.open(path, "wb") as f:
        f.setnchannels(channels)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(samples.astype("<i2").tobytes())


# ------------------------------------------------------------------------------ audio


@pytest.mark.parametrize("rate_in,rate_out", [(8000, 16000), (22050, 16000), (44100, 16000),
                                              (16000, 8000), (11025, 16000), (16001, 16000),
                                              (14400, 16000), (17600, 16000)])
def test_resample_matches_the_analytic_signal(backend, rate_in, rate_out):
    # 0.3 s of two tones below both Nyquist rates; the resampled signal must be the same tones
    # sampled at the new rate (away from the edges, where the filter sees zeros).
    t_in = np.arange(int(0.3 * rate_in)) / rate_in
    out = pipeline.resample(_tones(t_in).astype(np.float32), rate_in, rate_out).numpy()
    expected_length = -(-len(t_in) * rate_out // rate_in)
    assert out.shape == (expected_length,)
    edge = rate_out // 50  # 20 ms
    if backend == "core":
        expected = _tones(np.arange(len(out)) / rate_out)
        np.testing.assert_allclose(out[edge:-edge], expected[edge:-edge], atol=2e-3)
    else:
        # tfio's filter is shorter and its delay, which the pipeline removes in whole samples,
        # is fractional for some rate pairs: the best alignment within one sample must fit.
        errors = {shift: np.abs(out - _tones((np.arange(len(out)) + shift) / rate_out))
                  [edge:-edge].max() for shift in np.linspace(-1, 1, 41)}
        assert min(errors.values()) < 4e-2, errors


def test_resample_identity_and_anti_aliasing(core_backend):
    x = np.random.RandomState(0).randn(1000).astype(np.float32)
    np.testing.assert_array_equal(pipeline.resample(x, 16000, 16000).numpy(), x)
    # A 6 kHz tone cannot exist at 8 kHz (Nyquist 4 kHz): it must be filtered out, not folded
    # to 2 kHz.
    t = np.arange(16000) / 16000
    out = pipeline.resample(np.sin(2 * np.pi * 6000 * t).astype(np.float32), 16000, 8000).numpy()
    assert np.sqrt(np.mean(out[200:-200] ** 2)) < 0.01


def test_resample_inside_tf_function_with_tensor_rates(core_backend):
    fn = tf.function(lambda x, r: pipeline.resample(x, r, 16000))
    for rate in (8000, 22050):
        t = np.arange(rate // 4) / rate
        out = fn(tf.constant(_tones(t), tf.float32), tf.constant(rate)).numpy()
        expected = _tones(np.arange(len(out)) / 16000)
        np.testing.assert_allclose(out[320:-320], expected[320:-320], atol=2e-3)


@pytest.mark.parametrize("cutoff", [1000.0, 2500.0])
def test_lowpass_passes_low_tones_in_phase_and_removes_high_ones(cutoff):
    t = np.arange(pipeline.SAMPLE_RATE, dtype=np.float64) / pipeline.SAMPLE_RATE
    inner = slice(100, -100)  # away from the zero-padded ends

    def through(freq):
        x = np.sin(2 * np.pi * freq * t)
        y = pipeline.lowpass(tf.constant(x, tf.float32), tf.constant(cutoff)).numpy()
        assert y.shape == x.shape
        return x[inner], y[inner].astype(np.float64)

    for freq in (0.25 * cutoff, 0.5 * cutoff):  # pass band: unchanged, no delay
        x, y = through(freq)
        np.testing.assert_allclose(y, x, atol=0.02)
    x, y = through(cutoff)  # -6 dB at the cutoff (half the amplitude of a windowed sinc)
    assert 10 * np.log10(np.mean(y ** 2) / np.mean(x ** 2)) == pytest.approx(-6.0, abs=0.5)
    for freq in (1.5 * cutoff, 3.0 * cutoff):  # stop band
        x, y = through(freq)
        assert 10 * np.log10(np.mean(y ** 2) / np.mean(x ** 2)) < -40


def test_augment_audio_lowpass_probability():
    t = np.arange(pipeline.SAMPLE_RATE, dtype=np.float32) / pipeline.SAMPLE_RATE
    low, high = np.sin(2 * np.pi * 500 * t), np.sin(2 * np.pi * 6000 * t)
    plain = pipeline.AugmentConfig(speed_factors=(1.0,), gain_db=(0.0, 0.0), noise_probability=0.0,
                                   lowpass_hz=(2000.0, 3000.0))
    for probability, expected in ((0.0, low + high), (1.0, low)):
        config = pipeline.dataclasses.replace(plain, lowpass_probability=probability)
        for seed in range(3):
            out = pipeline.augment_audio(tf.constant(low + high), tf.constant([seed, 1]), config)
            np.testing.assert_allclose(out.numpy()[100:-100], expected[100:-100], atol=0.02)


def test_decode_wav_matches_python_wave(backend, tmp_path):
    rng = np.random.RandomState(1)
    samples = rng.randint(-32768, 32767, size=(1234, 2)).astype(np.int16)
    path = str(tmp_path / "stereo.wav")
    write_wav(path, samples, 22050)
    audio, rate = pipeline.decode_wav(tf.io.read_file(path))
    assert int(rate) == 22050
    np.testing.assert_allclose(audio.numpy(), samples.astype(np.float64).mean(1) / 32768,
                               atol=1e-6)


def test_load_audio_resamples_a_file_to_16k(backend, tmp_path):
    t = np.arange(8000 // 2) / 8000
    path = str(tmp_path / "tone.wav")
    write_wav(path, np.round(_tones(t) * 8000), 8000)
    audio = pipeline.load_audio(path).numpy()
    assert audio.shape == (2 * len(t),)
    expected = _tones(np.arange(len(audio)) / 16000) * 8000 / 32768
    tolerance = 1e-3 if backend == "core" else 1e-2
    np.testing.assert_allclose(audio[320:-320], expected[320:-320], atol=tolerance)


# ------------------------------------------------------------------------------ features


def numpy_mel_matrix(num_mel_bins, num_bins, sample_rate, lower_hz, upper_hz):
    """HTK-mel triangles over the FFT bins (the DC bin gets no weight), float64."""
    def hz_to_mel(f):
        return 1127.0 * np.log1p(np.asarray(f, np.float64) / 700.0)

    bin_mel = hz_to_mel(np.linspace(0.0, sample_rate / 2, num_bins))
    edges = np.linspace(hz_to_mel(lower_hz), hz_to_mel(upper_hz), num_mel_bins + 2)
    weights = np.zeros((num_bins, num_mel_bins))
    for m in range(num_mel_bins):
        left, center, right = edges[m], edges[m + 1], edges[m + 2]
        rising = (bin_mel - left) / (center - left)
        falling = (right - bin_mel) / (right - center)
        weights[:, m] = np.maximum(0.0, np.minimum(rising, falling))
    weights[0] = 0.0
    return weights


def numpy_log_mel(audio, config):
    audio = np.asarray(audio, np.float64)
    n = np.arange(config.frame_length)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * n / config.frame_length)  # periodic Hann
    num = 1 + (len(audio) - config.frame_length) // config.frame_step
    frames = np.stack([audio[i * config.frame_step:i * config.frame_step + config.frame_length]
                       for i in range(num)]) * window
    power = np.abs(np.fft.rfft(frames, n=config.fft_length)) ** 2
    mel = power @ numpy_mel_matrix(config.num_mel_bins, config.fft_length // 2 + 1,
                                   config.sample_rate, config.lower_edge_hertz,
                                   config.upper_edge_hertz)
    return np.log(mel + config.log_floor)


@pytest.mark.parametrize("config", [pipeline.FeatureConfig(),
                                    pipeline.FeatureConfig(num_mel_bins=80, upper_edge_hertz=8000)],
                         ids=["default", "80bins_8k"])
def test_log_mel_matches_numpy(config):
    rng = np.random.RandomState(2)
    t = np.arange(5000) / 16000
    audio = 0.3 * _tones(t) + 0.05 * rng.randn(len(t))
    features = pipeline.log_mel(tf.constant(audio, tf.float32), config).numpy()
    expected = numpy_log_mel(audio.astype(np.float32), config)
    assert features.shape == expected.shape == (
        int(pipeline.num_frames(len(audio), config)), config.num_mel_bins)
    # float32 FFT vs float64: compare in the log domain where the energy is not tiny.
    strong = expected > np.log(1e-3)
    assert strong.mean() > 0.5
    np.testing.assert_allclose(features[strong], expected[strong], atol=2e-3)


def test_log_mel_frequency_warp():
    # VTLP: with warp w a tone at f Hz lands in the mel bin of w * f Hz.
    t = np.arange(8000) / 16000

    def peak(audio, warp):
        features = pipeline.log_mel(tf.constant(audio, tf.float32), warp=warp)
        return int(np.argmax(features.numpy().mean(axis=0)))

    tone = np.sin(2 * np.pi * 1000 * t)
    assert peak(tone, tf.constant(1.0)) == peak(tone, 1.0)
    assert peak(tone, tf.constant(1.2)) == peak(np.sin(2 * np.pi * 1200 * t), 1.0)
    assert peak(tone, tf.constant(0.8)) == peak(np.sin(2 * np.pi * 800 * t), 1.0)


def test_adapted_feature_normalization_matches_numpy(core_backend):
    # The encoder's Normalization layer, adapted on the feature dataset, holds the float64
    # per-bin mean and variance of all frames of the utterances.
    import keras
    from model import StreamingEncoder

    paths, texts = pipeline.read_manifest(os.path.join(DATA, "test.tsv"))
    subset = (paths[:4], texts[:4])
    encoder = StreamingEncoder(conv_channels=4, encoder_dim=8, encoder_layers=1)
    encoder.build((None, None, 40))
    encoder.adapt_features(pipeline.feature_dataset(subset))
    feats = np.concatenate([pipeline.log_mel(pipeline.load_audio(p)).numpy() for p in paths[:4]])
    norm = encoder.feature_norm
    np.testing.assert_allclose(np.asarray(norm.adapt_mean), feats.astype(np.float64).mean(0),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(norm.adapt_variance), feats.astype(np.float64).var(0),
                               rtol=1e-3, atol=1e-4)
    x = feats[None, :50]
    np.testing.assert_allclose(norm(x).numpy()[0], (feats[:50] - feats.mean(0)) /
                               np.sqrt(feats.var(0)), rtol=1e-3, atol=1e-3)
    assert isinstance(norm, keras.layers.Normalization)


# ------------------------------------------------------------------------------ SpecAugment


def _runs(flags):
    """Lengths of the runs of True in a 1-D bool array."""
    runs, current = [], 0
    for flag in list(flags) + [False]:
        if flag:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    return runs


@pytest.mark.parametrize("length", [30, 90, 120])
def test_spec_augment_masks(length):
    rng = np.random.RandomState(3)
    features = rng.uniform(1.0, 2.0, size=(120, 40)).astype(np.float32)
    mask_value = -rng.uniform(1.0, 2.0, size=40).astype(np.float32)  # per-bin fill
    kwargs = dict(num_freq_masks=2, max_freq_width=6, num_time_masks=2, max_time_width=20,
                  max_time_ratio=0.1)
    any_freq = any_time = False
    for seed in range(25):
        out = pipeline.spec_augment(features, length, tf.constant([seed, 7]), mask_value=mask_value,
                                    **kwargs).numpy()
        changed = out != features
        # Every changed cell holds its bin's fill value.
        np.testing.assert_array_equal(out[changed], np.broadcast_to(mask_value, out.shape)[changed])
        # The changes are whole frequency bands plus whole time spans.
        bands = changed.all(axis=0)
        spans = changed.all(axis=1)
        np.testing.assert_array_equal(changed, bands[None, :] | spans[:, None])
        # At most 2 bands of <= 6 bins each (touching masks merge into one run).
        assert len(_runs(bands)) <= 2 and bands.sum() <= 2 * 6
        # Time masks stay inside the valid frames, each <= min(20, 10% of the length).
        time_cap = min(20, int(0.1 * length))
        assert not spans[length:].any()
        assert len(_runs(spans)) <= 2 and spans.sum() <= 2 * time_cap
        any_freq |= bands.any()
        any_time |= spans.any()
        # Deterministic given the seed.
        again = pipeline.spec_augment(features, length, tf.constant([seed, 7]),
                                      mask_value=mask_value, **kwargs).numpy()
        np.testing.assert_array_equal(out, again)
    assert any_freq and any_time


# ------------------------------------------------------------------------------ text


def test_character_tokenizer():
    text = "Call 0, it's NINE-one"
    ids = pipeline.encode_text(tf.constant(text)).numpy().tolist()
    kept = [c for c in text.lower() if c in pipeline.VOCABULARY[1:]]
    assert ids == [pipeline.VOCABULARY.index(c) for c in kept]
    assert pipeline.decode_ids(ids) == "call  it's nineone"
    assert pipeline.VOCABULARY[pipeline.BLANK] == "<blank>" and min(ids) > pipeline.BLANK
    assert pipeline.VOCAB_SIZE == 29


def test_word_tokenizer():
    words = pipeline.WORDS
    text = "Call  my NUMBER nine oh one, please"
    ids = words.encode(tf.constant(text)).numpy().tolist()
    # "oh" is not in the vocabulary, "one," is not a word of it: both dropped.
    kept = [w for w in text.lower().split() if w in pipeline.WORD_LIST]
    assert kept == ["call", "my", "number", "nine", "please"]
    assert ids == [1 + pipeline.WORD_LIST.index(w) for w in kept]
    assert words.decode(ids + [0, words.size]) == "call my number nine please"
    assert words.vocabulary[pipeline.BLANK] == "<blank>" and min(ids) > pipeline.BLANK
    assert len(set(pipeline.WORD_LIST)) == len(pipeline.WORD_LIST) == words.size - 1
    assert words.token_texts()[1:3] == ("zero ", "one ")
    # Every word of the committed transcripts has an id.
    _, transcripts = pipeline.read_manifest(os.path.join(DATA, "train.tsv"))
    for transcript in transcripts:
        assert words.decode(words.encode(tf.constant(transcript)).numpy()) == \
            " ".join(transcript.lower().split())
    chars = pipeline.CHARACTERS
    assert chars.decode(chars.encode(tf.constant("nine one")).numpy()) == "nine one"


# ------------------------------------------------------------------------------ datasets


def _wav_num_samples(path):
    with wave.open(path, "rb") as f:
        return f.getnframes(), f.getframerate()


def test_committed_manifests():
    train_paths, train_texts = pipeline.read_manifest(os.path.join(DATA, "train.tsv"))
    test_paths, test_texts = pipeline.read_manifest(os.path.join(DATA, "test.tsv"))
    assert len(train_paths) >= 300 and len(test_paths) >= 40
    for path in train_paths + test_paths:
        assert os.path.isfile(path), path
    digits = set("zero one two three four five six seven eight nine".split())
    # Held-out: digit strings only, none of which occurs in training.
    assert all(set(t.split()) <= digits for t in test_texts)
    assert not set(test_texts) & set(train_texts)


def test_fsdd_digit_strings(tmp_path):
    # The committed FSDD subset: the held-out speaker's words only in the test strings; the
    # strings are the words joined (every word's samples occur in the string, up to gain and
    # noise), and the same seed gives the same files.
    import fsdd

    recordings = sorted(os.listdir(fsdd.RECORDINGS))
    speakers = {name.split("_")[1] for name in recordings}
    assert speakers == set(fsdd.TRAIN_SPEAKERS) | {fsdd.TEST_SPEAKER}
    expected = {f"{d}_{s}_{take}.wav" for s, takes in fsdd.TAKES.items() for d in range(10)
                for take in takes}
    assert set(recordings) == expected
    folder = os.path.dirname(fsdd.RECORDINGS)
    committed = sum(os.path.getsize(os.path.join(root, name))
                    for root, _, names in os.walk(folder) for name in names)
    assert committed <= 12_000_000  # the repository's budget for FSDD data
    first = fsdd.make_digit_strings(str(tmp_path / "a"), num_train=6, num_test=3, seed=1)
    second = fsdd.make_digit_strings(str(tmp_path / "b"), num_train=6, num_test=3, seed=1)
    for manifest_a, manifest_b, split in zip(first, second, ("train", "test")):
        paths_a, texts_a = pipeline.read_manifest(manifest_a)
        paths_b, texts_b = pipeline.read_manifest(manifest_b)
        assert texts_a == texts_b
        for pa, pb in zip(paths_a, paths_b):
            assert open(pa, "rb").read() == open(pb, "rb").read()
        with open(manifest_a) as f:
            rows = [line.rstrip("\n").split("\t") for line in f][1:]
        for (_, text, speaker, _), path in zip(rows, paths_a):
            assert (speaker == fsdd.TEST_SPEAKER) == (split == "test")
            words = text.split()
            assert set(words) <= set(fsdd.DIGITS)
            assert (3 if split == "test" else 1) <= len(words) <= 6
            samples, rate = _wav_num_samples(path)
            assert rate == fsdd.SAMPLE_RATE and samples > 0.2 * rate * len(words)


def test_fsdd_strings_are_remade_when_the_subset_changes(tmp_path, monkeypatch):
    import fsdd

    out = str(tmp_path / "strings")
    marker = os.path.join(out, "marker")
    fsdd.prepare(out, num_train=2, num_test=1, seed=0)
    open(marker, "w").close()
    fsdd.prepare(out, num_train=2, num_test=1, seed=0)
    assert os.path.exists(marker)  # the same subset: the strings are kept
    monkeypatch.setattr(fsdd, "recordings_id", lambda recordings=fsdd.RECORDINGS: "another")
    fsdd.prepare(out, num_train=2, num_test=1, seed=0)
    assert not os.path.exists(marker)  # another subset: they are made again
    assert os.path.isfile(os.path.join(out, "train.tsv"))


def test_eval_dataset_batches(backend):
    manifest = os.path.join(DATA, "test.tsv")
    paths, texts = pipeline.read_manifest(manifest)
    by_text = dict(zip(texts, paths))
    assert len(by_text) == len(texts)  # held-out strings are unique: identify by transcript
    boundaries = [100, 150, 200]
    ds = pipeline.make_dataset(manifest, batch_size=8, training=False,
                               bucket_boundaries=boundaries)
    seen = 0
    for inputs, labels in ds:
        features = inputs["features"].numpy()
        lengths = inputs["feature_lengths"].numpy()
        label_rows = inputs["labels"].numpy()
        np.testing.assert_array_equal(labels.numpy(), label_rows)
        assert features.shape[0] == lengths.shape[0] == label_rows.shape[0] <= 8
        assert features.shape[1] == lengths.max() and features.shape[2] == 40
        # One bucket per batch: all lengths between the same two boundaries.
        buckets = np.searchsorted(boundaries, lengths, side="right")
        assert len(set(buckets.tolist())) == 1
        for feats, length, row in zip(features, lengths, label_rows):
            valid = row[row != pipeline.LABEL_PAD]
            assert (row[len(valid):] == pipeline.LABEL_PAD).all() and (valid > 0).all()
            text = pipeline.decode_ids(valid)
            path = by_text[text]
            num_samples, rate = _wav_num_samples(path)
            num_16k = -(-num_samples * 16000 // rate)
            assert length == 1 + (num_16k - 400) // 160
            np.testing.assert_array_equal(feats[length:], 0.0)  # padding
            expected = pipeline.log_mel(pipeline.load_audio(path)).numpy()
            np.testing.assert_allclose(feats[:length], expected, atol=1e-3)
            seen += 1
    assert seen == len(paths)


def test_training_dataset_augments(core_backend):
    paths, texts = pipeline.read_manifest(os.path.join(DATA, "test.tsv"))
    paths, texts = paths[:12], texts[:12]
    mean = np.linspace(-5, 5, 40).astype(np.float32)
    ds = pipeline.make_dataset((paths, texts), batch_size=4, training=True, mask_value=mean,
                               seed=5)
    by_text = dict(zip(texts, paths))
    speed_factors = pipeline.AugmentConfig().speed_factors
    epochs = []
    for _ in range(2):
        epoch = {}
        for inputs, _ in ds:
            for feats, length, row in zip(inputs["features"].numpy(),
                                          inputs["feature_lengths"].numpy(),
                                          inputs["labels"].numpy()):
                text = pipeline.decode_ids(row[row != pipeline.LABEL_PAD])
                num_samples, rate = _wav_num_samples(by_text[text])
                num_16k = -(-num_samples * 16000 // rate)
                # Speed perturbation: the length of one of the resampled versions.
                allowed = {1 + (-(-num_16k * 16000 // int(round(f * 16000))) - 400) // 160
                           for f in speed_factors}
                assert length in allowed
                epoch[text] = feats[:length]
        assert len(epoch) == 12
        epochs.append(epoch)
    # Random per epoch: the same utterance comes out differently.
    assert any(a.shape != epochs[1][t].shape or not np.allclose(a, epochs[1][t])
               for t, a in epochs[0].items())


def test_datasets_built_on_one_decoded_dataset(core_backend):
    """A `decoded_dataset` (decoded once, cached) gives every dataset built on it exactly what
    the manifest gives: the training batches of any number of builds and the features that
    adapt the normalization."""
    paths, texts = pipeline.read_manifest(os.path.join(DATA, "test.tsv"))
    manifest = (paths[:10], texts[:10])
    audio = pipeline.decoded_dataset(manifest)
    for mask_value in (0.0, 0.5):  # two builds on the one cached dataset
        built = list(pipeline.make_dataset(audio, batch_size=4, training=True, seed=7,
                                           mask_value=mask_value))
        direct = list(pipeline.make_dataset(manifest, batch_size=4, training=True, seed=7,
                                            mask_value=mask_value))
        assert len(built) == len(direct) >= 3
        for (a, _), (b, _) in zip(built, direct):
            for key in ("features", "feature_lengths", "labels"):
                np.testing.assert_array_equal(a[key].numpy(), b[key].numpy())
    for a, b in zip(pipeline.feature_dataset(audio), pipeline.feature_dataset(manifest)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
