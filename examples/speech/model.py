"""A streaming RNN-T: causal conv-subsampling + LSTM encoder, LSTM predictor, `RNNTJoint`.

Everything the encoder computes for frame t depends on features up to t only, so running it
chunk by chunk (`StreamingEncoder.stream`, with its carried state) gives the same frames as
running it on the whole utterance: the causal convolutions carry their left context, the LSTMs
their (h, c).

`ModelConfig(encoder="conformer")` (train.py --conformer) puts a full-context Conformer encoder
(`conformer.SpeechConformerEncoder`) in its place; it has no `stream`.
"""

import dataclasses

import keras
import tensorflow as tf

from tf_rnnt.keras import FlashRNNTLoss, RNNTJoint

SUBSAMPLING = 4  # two stride-2 convolutions in time


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 29
    num_mel_bins: int = 40
    conv_channels: int = 32
    encoder_dim: int = 256
    encoder_layers: int = 2
    embedding_dim: int = 64
    predictor_dim: int = 160
    joint_dim: int = 192
    dropout: float = 0.1
    mean_prior_frames: int = 50  # causal per-utterance mean normalization (0: off)
    predictor: str = "stateless"  # or "lstm"
    fastemit_lambda: float = 0.0
    # "lstm" (StreamingEncoder) or "conformer" (conformer.SpeechConformerEncoder: encoder_dim is
    # its width d, encoder_layers its blocks, conv_channels its subsampling channels).
    encoder: str = "lstm"
    attention_heads: int = 4  # Conformer only, as the three below
    ff_dim: int = 576
    conv_kernel_size: int = 15
    # TDT (train.py --tdt): the joint's durations (empty: RNN-T), and the loss's sigma and omega
    # (NeMo's TDT defaults).
    durations: tuple = ()
    tdt_sigma: float = 0.05
    tdt_omega: float = 0.1


# GPU settings (train.py --large, learning rate 5e-4). Measured on an H200 with the
# 3000-utterance set (100 epochs): 4 x 512 LSTMs at 1e-3 plateaued at 89% WER; 3 x 384 reached
# 20.7% at 1e-3 and 5.6% at 5e-4.
LARGE = dict(conv_channels=64, encoder_dim=384, encoder_layers=3, embedding_dim=96,
             predictor_dim=256, joint_dim=256, dropout=0.1)

# train.py --conformer: Conformer-S's width (d=144, 4 heads, feed-forward 4d; Gulati et al.
# 2020) with 4 of its 16 blocks and a 15-frame (600 ms) kernel (utterances here are 1-6 words),
# so that it trains on a CPU: 2.0 M encoder weights (the LSTM encoder: 1.1 M), a training step
# about 1.4 times as long (batch 32 of 3 s utterances, 2 shared cores).
CONFORMER = dict(encoder="conformer", encoder_dim=144, encoder_layers=4, attention_heads=4,
                 ff_dim=576, conv_kernel_size=15)
# --conformer --large (GPU; applied over LARGE): Conformer-M's width (d=256, kernel 31) with 12
# of its 16 blocks for the digit-sized vocabulary and data.
CONFORMER_LARGE = dict(encoder="conformer", encoder_dim=256, encoder_layers=12,
                       attention_heads=4, ff_dim=1024, conv_kernel_size=31)


class FeatureNormalization:
    """Mixin for encoders with a `feature_norm` (`keras.layers.Normalization`) over
    `num_mel_bins` features: its statistics from data or given directly."""

    def adapt_features(self, features):
        """Sets the feature statistics from a `tf.data.Dataset` of `[1, T, F]` features."""
        # Some audio decoders (tensorflow-io) leave the rank unknown; adapt needs it.
        bins = self.num_mel_bins
        self.feature_norm.adapt(features.map(lambda x: tf.ensure_shape(x, [None, None, bins])))

    def set_feature_statistics(self, mean, std):
        """Sets the per-bin feature statistics directly (`[F]` mean and standard deviation)."""
        self.feature_norm.adapt_mean.assign(mean)
        self.feature_norm.adapt_variance.assign(tf.square(std))
        self.feature_norm.finalize_state()


def running_mean_normalization(x, total, count, prior_frames):
    """Causal per-utterance mean normalization: subtracts from frame t the mean of frames <= t,
    with a prior of `prior_frames` frames at 0 (the global mean, after `feature_norm`).

    Args:
      x: `[B, T, F]` normalized features.
      total: `[B, F]` sum of the utterance's frames before `x` (zeros at the start).
      count: `[B, 1]` number of those frames.
      prior_frames: the prior's weight in frames.

    Returns:
      (`[B, T, F]` features, new total, new count).
    """
    sums = total[:, None] + tf.cumsum(x, axis=1)
    counts = count[:, None] + tf.cumsum(tf.ones_like(x[..., :1]), axis=1)
    new_total = total + tf.reduce_sum(x, axis=1)
    new_count = count + tf.cast(tf.shape(x)[1], tf.float32)
    return x - sums / (counts + float(prior_frames)), new_total, new_count


@keras.saving.register_keras_serializable(package="tf_rnnt_speech")
class StreamingEncoder(FeatureNormalization, keras.layers.Layer):
    """Causal encoder: `[B, T, F]` log-mel features -> `[B, T // 4, encoder_dim]` frames.

    Features are normalized with fixed per-bin statistics (a `keras.layers.Normalization`
    adapted on the training features with `adapt_features`, saved with the weights, not trained:
    a per-utterance normalization would look into the future). With `mean_prior_frames` > 0 the
    running mean of the utterance's normalized features so far is subtracted as well (causal
    cepstral mean normalization: removes the speaker's channel and loudness), a prior of that
    many frames at the global mean keeping the first frames' estimate stable. Then two 3x3
    convolutions with stride 2 in time and frequency. In time they are causal: output j of a
    convolution reads inputs 2j - 1, 2j, 2j + 1 (input -1 is the carried context, zeros at the
    start), so its receptive field ends at the frame it is emitted for. Then `encoder_layers`
    unidirectional LSTMs, with per-frame layer normalization before and after them.

    Call: `encoder([features, feature_lengths])`; the output's Keras mask marks the
    `feature_lengths // 4` valid frames (the RNNTJoint reads the frame lengths from it).
    """

    def __init__(self, num_mel_bins=40, conv_channels=32, encoder_dim=256, encoder_layers=2,
                 dropout=0.1, mean_prior_frames=0, **kwargs):
        super().__init__(**kwargs)
        self.num_mel_bins = num_mel_bins
        self.mean_prior_frames = mean_prior_frames
        self.conv_channels = conv_channels
        self.encoder_dim = encoder_dim
        self.encoder_layers = encoder_layers
        self.dropout = dropout
        self.conv1 = keras.layers.Conv2D(conv_channels, 3, strides=2, activation="relu",
                                         kernel_initializer="he_normal", name="conv1")
        self.conv2 = keras.layers.Conv2D(conv_channels, 3, strides=2, activation="relu",
                                         kernel_initializer="he_normal", name="conv2")
        self.input_projection = keras.layers.Dense(encoder_dim, name="input_projection")
        self.feature_norm = keras.layers.Normalization(axis=-1, name="feature_norm")
        # Per-frame normalizations (causal): without them the LSTMs start on inputs of ~0.1
        # and the encoder's signal is too weak for the joint to learn from it before the
        # predictor has learned the label prior (a plateau at the prior's loss).
        self.input_norm = keras.layers.LayerNormalization(name="input_norm")
        self.output_norm = keras.layers.LayerNormalization(name="output_norm")
        self.lstms = [keras.layers.LSTM(encoder_dim, return_sequences=True, return_state=True,
                                        name=f"lstm{i}") for i in range(encoder_layers)]
        self.dropouts = [keras.layers.Dropout(dropout) for _ in range(encoder_layers)]

    def build(self, input_shape):
        bins = self.num_mel_bins
        self.feature_norm.build((None, None, bins))
        self.conv1.build((None, None, bins + 2, 1))
        bins1 = (bins + 2 - 3) // 2 + 1
        self.conv2.build((None, None, bins1 + 2, self.conv_channels))
        self.bins2 = (bins1 + 2 - 3) // 2 + 1
        self.input_projection.build((None, None, self.bins2 * self.conv_channels))
        self.input_norm.build((None, None, self.encoder_dim))
        self.output_norm.build((None, None, self.encoder_dim))
        for lstm in self.lstms:
            lstm.build((None, None, self.encoder_dim))
        self.built = True

    # -- state ---------------------------------------------------------------------------------
    def state_shapes(self):
        """Per-sample shapes of the streaming state tensors."""
        bins1 = (self.num_mel_bins + 2 - 3) // 2 + 1
        shapes = [(1, self.num_mel_bins, 1), (1, bins1, self.conv_channels)]
        shapes += [(self.encoder_dim,)] * (2 * self.encoder_layers)
        if self.mean_prior_frames:
            shapes += [(self.num_mel_bins,), (1,)]  # running feature sum and frame count
        return shapes

    def state_size(self):
        size = 0
        for shape in self.state_shapes():
            n = 1
            for d in shape:
                n *= d
            size += n
        return size

    def initial_state(self, batch_size):
        return [tf.zeros((batch_size,) + s) for s in self.state_shapes()]

    def flatten_state(self, state):
        batch = tf.shape(state[0])[0]
        return tf.concat([tf.reshape(s, [batch, -1]) for s in state], axis=1)

    def unflatten_state(self, flat):
        batch = tf.shape(flat)[0]
        out, offset = [], 0
        for shape in self.state_shapes():
            n = 1
            for d in shape:
                n *= d
            out.append(tf.reshape(flat[:, offset:offset + n], tf.concat([[batch], shape], 0)))
            offset += n
        return out

    # -- compute -------------------------------------------------------------------------------
    @staticmethod
    def _causal_conv(conv, x, context):
        # x [B, T, F, C]; context [B, 1, F, C] is the frame before x. Valid stride-2
        # convolution over the T + 1 frames -> T // 2 frames. Two zero frames on the right keep
        # chunks shorter than the kernel well-defined; the outputs that read them are cut off.
        x = tf.concat([context, x], axis=1)
        new_context = x[:, -1:]
        num_out = (tf.shape(x)[1] - 1) // 2
        x = tf.pad(x, [[0, 0], [0, 2], [1, 1], [0, 0]])  # frequency padded on both sides
        return conv(x)[:, :num_out], new_context

    def stream(self, features, state, training=False):
        """Encodes a chunk: `[B, T, F]` features (T a multiple of 4 for exact streaming) and the
        state from the previous chunk -> (`[B, T // 4, encoder_dim]` frames, new state)."""
        features = tf.convert_to_tensor(features, tf.float32)
        x = self.feature_norm(features)
        mean_state = []
        if self.mean_prior_frames:
            x, total, count = running_mean_normalization(x, state[-2], state[-1],
                                                         self.mean_prior_frames)
            mean_state = [total, count]
        x = x[..., None]
        x, ctx1 = self._causal_conv(self.conv1, x, state[0])
        x, ctx2 = self._causal_conv(self.conv2, x, state[1])
        shape = tf.shape(x)
        x = tf.reshape(x, [shape[0], shape[1], self.bins2 * self.conv_channels])
        x = self.input_norm(self.input_projection(x))
        new_state = [ctx1, ctx2]
        # A chunk too short for one output frame leaves the LSTM states as they were (the LSTM
        # is run on one zero frame, whose output and state are dropped).
        num_frames = tf.shape(x)[1]
        has_frames = num_frames > 0
        x = tf.pad(x, [[0, 0], [0, tf.maximum(1 - num_frames, 0)], [0, 0]])
        for i, (lstm, dropout) in enumerate(zip(self.lstms, self.dropouts)):
            h0, c0 = state[2 + 2 * i], state[3 + 2 * i]
            x, h, c = lstm(x, initial_state=[h0, c0], training=training)
            x = dropout(x, training=training)
            new_state += [tf.where(has_frames, h, h0), tf.where(has_frames, c, c0)]
        return self.output_norm(x[:, :num_frames]), new_state + mean_state

    def call(self, inputs, training=False):
        features, _ = inputs
        frames, _ = self.stream(features, self.initial_state(tf.shape(features)[0]),
                                training=training)
        return frames

    def compute_mask(self, inputs, previous_mask=None):
        features, feature_lengths = inputs
        if isinstance(features, keras.KerasTensor):  # functional model construction
            return keras.KerasTensor(self.compute_output_shape(
                [features.shape, feature_lengths.shape])[:2], dtype="bool")
        num_frames = tf.shape(features)[1] // 2 // 2
        return tf.sequence_mask(output_lengths(feature_lengths), num_frames)

    def frame_lengths(self, feature_lengths):
        """Valid output frames for `feature_lengths` feature frames (`output_lengths`)."""
        return output_lengths(feature_lengths)

    def compute_output_shape(self, input_shape):
        features_shape = input_shape[0]
        t = features_shape[1]
        return (features_shape[0], None if t is None else t // 2 // 2, self.encoder_dim)

    def get_config(self):
        config = super().get_config()
        config.update(num_mel_bins=self.num_mel_bins, conv_channels=self.conv_channels,
                      encoder_dim=self.encoder_dim, encoder_layers=self.encoder_layers,
                      dropout=self.dropout, mean_prior_frames=self.mean_prior_frames)
        return config


def output_lengths(feature_lengths):
    """Encoder frames for `feature_lengths` feature frames (floor division by 4)."""
    return tf.cast(feature_lengths, tf.int32) // 2 // 2


class _PredictorBase(keras.layers.Layer):
    """What both prediction networks share: their settings, the blank-prefixed token sequence,
    the output shape and the config. Subclasses create their layers, then `self.drop` (in that
    order, so seeded runs draw their random streams as before)."""

    def __init__(self, vocab_size, embedding_dim=64, predictor_dim=160, blank=0, dropout=0.1,
                 **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.embedding_dim = embedding_dim
        self.predictor_dim = predictor_dim
        self.blank = blank
        self.dropout = dropout

    def _tokens(self, labels):
        """`[B, U]` labels padded with negative ids -> `[B, U+1]`: blank, then the labels (padding
        read as blank)."""
        labels = tf.cast(labels, tf.int32)
        labels = tf.where(labels < 0, self.blank, labels)
        return tf.pad(labels, [[0, 0], [1, 0]], constant_values=self.blank)

    def compute_mask(self, inputs, previous_mask=None):
        return None

    def compute_output_shape(self, input_shape):
        u = input_shape[1]
        return (input_shape[0], None if u is None else u + 1, self.predictor_dim)

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, embedding_dim=self.embedding_dim,
                      predictor_dim=self.predictor_dim, blank=self.blank, dropout=self.dropout)
        return config


@keras.saving.register_keras_serializable(package="tf_rnnt_speech")
class Predictor(_PredictorBase):
    """LSTM prediction network over blank-prefixed labels.

    Call: `predictor(labels)` with `[B, U]` labels padded with negative ids -> `[B, U+1, D]`:
    step 0 sees the blank (the start symbol), step u the label u.
    """

    def __init__(self, vocab_size, embedding_dim=64, predictor_dim=160, blank=0, dropout=0.1,
                 **kwargs):
        super().__init__(vocab_size, embedding_dim, predictor_dim, blank, dropout, **kwargs)
        self.embedding = keras.layers.Embedding(vocab_size, embedding_dim, name="embedding")
        self.lstm = keras.layers.LSTM(predictor_dim, return_sequences=True, return_state=True,
                                      name="lstm", **self._lstm_options())
        self.drop = keras.layers.Dropout(dropout)

    def _lstm_options(self):
        """More keras.layers.LSTM arguments (a subclass may choose cuDNN)."""
        return {}

    def build(self, input_shape):
        self.embedding.build((None, None))
        self.lstm.build((None, None, self.embedding_dim))
        self.built = True

    def call(self, labels, training=False):
        out, _, _ = self.lstm(self.embedding(self._tokens(labels)), training=training)
        return self.drop(out, training=training)

    def initial_state(self, batch_size):
        zeros = tf.zeros([batch_size, self.predictor_dim])
        return [zeros, zeros]

    def state_specs(self):
        """(width, dtype) of each state tensor: `[B, width]`."""
        return [(self.predictor_dim, tf.float32), (self.predictor_dim, tf.float32)]

    def step(self, tokens, state):
        """One step: `[B]` token ids and `[h, c]` -> (`[B, D]` output, new `[h, c]`)."""
        out, h, c = self.lstm(self.embedding(tokens[:, None]), initial_state=state)
        return out[:, 0], [h, c]


@keras.saving.register_keras_serializable(package="tf_rnnt_speech")
class StatelessPredictor(_PredictorBase):
    """Stateless prediction network (Ghodsi et al. 2020): the output for a step depends on the
    current and the previous token only (embeddings of both, one tanh layer).

    Same interface as `Predictor`; its streaming state is the previous token (`[B]` int32).
    With a few hundred utterances it cannot memorize whole transcripts, so the encoder has to
    do the recognizing, and greedy decoding needs no recurrent step.
    """

    def __init__(self, vocab_size, embedding_dim=64, predictor_dim=160, blank=0, dropout=0.1,
                 **kwargs):
        super().__init__(vocab_size, embedding_dim, predictor_dim, blank, dropout, **kwargs)
        self.current = keras.layers.Embedding(vocab_size, embedding_dim, name="current")
        self.previous = keras.layers.Embedding(vocab_size, embedding_dim, name="previous")
        self.dense = keras.layers.Dense(predictor_dim, activation="tanh", name="dense")
        self.drop = keras.layers.Dropout(dropout)

    def build(self, input_shape):
        self.current.build((None, None))
        self.previous.build((None, None))
        self.dense.build((None, None, 2 * self.embedding_dim))
        self.built = True

    def _output(self, tokens, previous, training=False):
        x = tf.concat([self.current(tokens), self.previous(previous)], axis=-1)
        return self.drop(self.dense(x), training=training)

    def call(self, labels, training=False):
        tokens = self._tokens(labels)
        previous = tf.pad(tokens[:, :-1], [[0, 0], [1, 0]], constant_values=self.blank)
        return self._output(tokens, previous, training)

    def initial_state(self, batch_size):
        return [tf.fill([batch_size], self.blank)]

    def state_specs(self):
        return [(None, tf.int32)]

    def step(self, tokens, state):
        """One step: `[B]` token ids and `[previous token]` -> (`[B, D]`, `[tokens]`)."""
        tokens = tf.cast(tokens, tf.int32)
        return self._output(tokens, state[0]), [tokens]


def build_encoder(config):
    """The encoder `config.encoder` names, as layer "encoder"."""
    if config.encoder == "conformer":
        # Imported here: conformer.py imports this module (for its predictor).
        from conformer import SpeechConformerEncoder

        return SpeechConformerEncoder(
            config.num_mel_bins, config.encoder_dim, config.encoder_layers,
            config.attention_heads, config.ff_dim, config.conv_kernel_size,
            config.conv_channels, config.dropout, config.mean_prior_frames, name="encoder")
    if config.encoder != "lstm":
        raise ValueError(f"encoder must be 'lstm' or 'conformer', got {config.encoder!r}.")
    return StreamingEncoder(config.num_mel_bins, config.conv_channels, config.encoder_dim,
                            config.encoder_layers, config.dropout, config.mean_prior_frames,
                            name="encoder")


def build_model(config=ModelConfig(), learning_rate=1e-3, steps=None, ema_momentum=0.0):
    """The training model: `{"features", "feature_lengths", "labels"}` -> lattice, compiled
    with `FlashRNNTLoss` (with `config.durations`, a TDT joint and its `FlashTDTLoss`); with
    `ema_momentum` > 0 the optimizer keeps an exponential moving average of the weights
    (`keras.callbacks.SwapEMAWeights` evaluates with it)."""
    features = keras.Input((None, config.num_mel_bins), name="features")
    feature_lengths = keras.Input((), dtype="int32", name="feature_lengths")
    labels = keras.Input((None,), dtype="int32", name="labels")
    encoder = build_encoder(config)
    predictor_class = StatelessPredictor if config.predictor == "stateless" else Predictor
    predictor = predictor_class(config.vocab_size, config.embedding_dim, config.predictor_dim,
                                dropout=config.dropout, name="predictor")
    joint = RNNTJoint(config.vocab_size, config.joint_dim, name="joint",
                      durations=list(config.durations) or None)
    frames = encoder([features, feature_lengths])
    lattice = joint([frames, predictor(labels), labels])
    name = "streaming_transducer" if config.encoder == "lstm" else "conformer_transducer"
    model = keras.Model({"features": features, "feature_lengths": feature_lengths,
                         "labels": labels}, lattice, name=name)
    if steps:
        schedule = keras.optimizers.schedules.CosineDecay(
            0.0, steps, alpha=0.05, warmup_target=learning_rate,
            warmup_steps=max(1, min(300, steps // 10)))
    else:
        schedule = learning_rate
    optimizer = keras.optimizers.Adam(schedule, clipnorm=5.0, use_ema=ema_momentum > 0,
                                      ema_momentum=ema_momentum or 0.99)
    if config.durations:
        loss = joint.loss(fastemit_lambda=config.fastemit_lambda, sigma=config.tdt_sigma,
                          omega=config.tdt_omega)
    else:
        loss = FlashRNNTLoss(fastemit_lambda=config.fastemit_lambda)
    model.compile(optimizer=optimizer, loss=loss)
    return model


def parts(model):
    """(encoder, predictor, joint) of a model made by `build_model`."""
    return model.get_layer("encoder"), model.get_layer("predictor"), model.get_layer("joint")
