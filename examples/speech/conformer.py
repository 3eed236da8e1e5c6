"""A Conformer transducer (Gulati et al. 2020) for `model.fit` with `RNNTJoint`.

Encoder: per-bin feature normalization, 4x convolutional subsampling (two 3x3 Conv2D with
stride 2 in time and frequency, ReLU, as in Conformer/NeMo), a linear projection to `d_model`
scaled by `sqrt(d_model)` plus an **absolute sinusoidal positional encoding**, then
`num_blocks` Conformer blocks: half-step feed-forward (macaron), multi-head self-attention,
convolution module (pointwise + GLU, depthwise convolution, batch normalization, swish,
pointwise), half-step feed-forward, layer normalization. Predictor: embedding + one LSTM.
Joint: `tf_rnnt.keras.RNNTJoint`.

Padding: the frame lengths follow the subsampling exactly (`output_lengths`, passed to
`RNNTJoint` as its `logit_lengths` input, and the encoder output's Keras mask); padded frames
are zeroed after each subsampling convolution and before every depthwise convolution, and
attention never attends to them (key mask from the lengths). In inference mode the valid
frames of a sample do not depend on how much padding follows it (batch normalization in
training mode uses statistics over the padded batch, as NeMo does).

The default sizes (d=512, 16 blocks, 8 heads, feed-forward 2048, kernel 31, predictor 640,
joint 640, V=1025, 512 subsampling channels) give 109,923,873 weights (`model.count_params()`;
109,907,329 trainable, the rest batch-normalization statistics and the feature normalization),
the scale of Conformer-L / NeMo's large Conformer transducer.

The speech recipe trains a smaller Conformer encoder with its own front end and predictor:
`train.py --conformer` (`SpeechConformerEncoder` through `model.build_model`). To train this
whole transducer instead, build it in place of `model.build_model` and compile it the same way:

```python
from conformer import build_conformer_transducer
model = build_conformer_transducer(vocab_size=config.vocab_size,
                                   num_mel_bins=config.num_mel_bins)
model.compile(optimizer=keras.optimizers.Adam(schedule), loss=FlashRNNTLoss())
model.get_layer("encoder").set_feature_statistics(mean, std)
```

The inputs are `{"features", "feature_lengths", "labels"}` as in `model.build_model`;
`model.get_layer("encoder")`, `"predictor"` and `"joint"` give the parts for greedy decoding
(the predictor has `initial_state` / `step`; frame lengths are `output_lengths`). The encoder
looks at whole utterances (no streaming export).
"""

import math
import os
import sys

import keras
import tensorflow as tf

from tf_rnnt.keras import RNNTJoint, conv_output_lengths

# The speech recipe's model.py sits beside this file, also when this file is loaded by its path.
if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import FeatureNormalization, Predictor, running_mean_normalization  # noqa: E402

SUBSAMPLING = 4
ATTENTION_IMPLEMENTATIONS = ("keras", "dot_product")


def output_lengths(feature_lengths):
    """Encoder frames for `feature_lengths` feature frames: what the two subsampling convolutions
    (kernel 3, stride 2, one zero frame of padding on each side, i.e. Keras "same" lengths)
    produce.

    Args:
      feature_lengths: `[B]` int (a tensor, array or `keras.Input`).

    Returns:
      `[B]` lengths `ceil(ceil(L / 2) / 2)`.
    """
    return conv_output_lengths(feature_lengths, [3, 3], [2, 2], "same")


def _frame_mask(lengths, num_frames, dtype):
    """`[B, T, 1]` 1/0 mask of the valid frames."""
    return tf.cast(tf.sequence_mask(lengths, num_frames), dtype)[:, :, None]


def sinusoidal_encoding(num_frames, dim):
    """`[num_frames, dim]` float32 sinusoidal positional encoding (Vaswani et al. 2017)."""
    positions = tf.range(num_frames, dtype=tf.float32)[:, None]
    rates = tf.exp(tf.range(0, dim, 2, dtype=tf.float32) * (-math.log(10000.0) / dim))
    angles = positions * rates[None, :]
    return tf.reshape(tf.stack([tf.sin(angles), tf.cos(angles)], axis=-1), [num_frames, dim])


@keras.saving.register_keras_serializable(package="tf_rnnt_conformer")
class FeedForward(keras.layers.Layer):
    """Conformer feed-forward module: LN, Dense(ff_dim, swish), dropout, Dense(d), dropout."""

    def __init__(self, d_model, ff_dim, dropout, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.ff_dim, self.dropout = d_model, ff_dim, dropout
        self.norm = keras.layers.LayerNormalization(epsilon=1e-5, name="norm")
        self.inner = keras.layers.Dense(ff_dim, activation="swish", name="inner")
        self.outer = keras.layers.Dense(d_model, name="outer")
        self.drop = keras.layers.Dropout(dropout)

    def build(self, input_shape):
        self.norm.build(input_shape)
        self.inner.build(input_shape)
        self.outer.build(tuple(input_shape[:-1]) + (self.ff_dim,))
        self.built = True

    def call(self, x, training=False):
        y = self.drop(self.inner(self.norm(x)), training=training)
        return self.drop(self.outer(y), training=training)


@keras.saving.register_keras_serializable(package="tf_rnnt_conformer")
class ConvModule(keras.layers.Layer):
    """Conformer convolution module: LN, pointwise conv to 2d + GLU, depthwise conv (padded
    frames zeroed first), batch norm, swish, pointwise conv, dropout."""

    def __init__(self, d_model, kernel_size, dropout, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.kernel_size, self.dropout = d_model, kernel_size, dropout
        self.norm = keras.layers.LayerNormalization(epsilon=1e-5, name="norm")
        self.pointwise_in = keras.layers.Dense(2 * d_model, name="pointwise_in")
        self.depthwise = keras.layers.DepthwiseConv1D(kernel_size, padding="same",
                                                      name="depthwise")
        self.batch_norm = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5,
                                                          name="batch_norm")
        self.pointwise_out = keras.layers.Dense(d_model, name="pointwise_out")
        self.drop = keras.layers.Dropout(dropout)

    def build(self, input_shape):
        self.norm.build(input_shape)
        self.pointwise_in.build(input_shape)
        self.depthwise.build(input_shape)
        self.batch_norm.build(input_shape)
        self.pointwise_out.build(input_shape)
        self.built = True

    def call(self, x, frame_mask, training=False):
        y = self.pointwise_in(self.norm(x))
        y = y[..., :self.d_model] * tf.sigmoid(y[..., self.d_model:])
        y = self.depthwise(y * tf.cast(frame_mask, y.dtype))
        y = tf.nn.silu(self.batch_norm(y, training=training))
        return self.drop(self.pointwise_out(y), training=training)


@keras.saving.register_keras_serializable(package="tf_rnnt_conformer")
class ConformerBlock(keras.layers.Layer):
    """`x + FF/2`, `+ MHSA`, `+ Conv`, `+ FF/2`, LN (Gulati et al. 2020, Fig. 1).

    Call: `block(x, frame_mask, attention_mask)` with `x` `[B, T, d]`, `frame_mask` `[B, T, 1]`
    (1 on valid frames) and `attention_mask` `[B, T, T]` bool (keys that may be attended to).

    `attention`: "keras" (`keras.layers.MultiHeadAttention` with dropout on the attention
    probabilities; Keras then forms the scores, softmax and product as separate einsums) or
    "dot_product" (the same layer and weights without that dropout, which makes Keras compute
    the attention through `keras.ops.dot_product_attention`). The outputs agree in inference
    mode; in training only the dropout on the probabilities differs (the attention output's
    dropout stays). Keras' TensorFlow backend has no flash attention (it raises for
    `flash_attention=True`): `dot_product_attention` is an einsum, a float32 softmax and an
    einsum there, which XLA fuses under `jit_compile=True`.
    """

    def __init__(self, d_model=512, num_heads=8, ff_dim=2048, kernel_size=31, dropout=0.1,
                 attention="keras", **kwargs):
        super().__init__(**kwargs)
        if attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(f"attention must be one of {ATTENTION_IMPLEMENTATIONS}, got "
                             f"{attention!r}.")
        self.d_model, self.num_heads, self.ff_dim = d_model, num_heads, ff_dim
        self.kernel_size, self.dropout, self.attention_impl = kernel_size, dropout, attention
        self.ff1 = FeedForward(d_model, ff_dim, dropout, name="ff1")
        self.attention_norm = keras.layers.LayerNormalization(epsilon=1e-5, name="attention_norm")
        self.attention = keras.layers.MultiHeadAttention(
            num_heads, d_model // num_heads, dropout=dropout if attention == "keras" else 0.0,
            name="attention")
        self.attention_drop = keras.layers.Dropout(dropout)
        self.conv = ConvModule(d_model, kernel_size, dropout, name="conv")
        self.ff2 = FeedForward(d_model, ff_dim, dropout, name="ff2")
        self.out_norm = keras.layers.LayerNormalization(epsilon=1e-5, name="out_norm")

    def build(self, input_shape):
        for layer in (self.ff1, self.attention_norm, self.conv, self.ff2, self.out_norm):
            layer.build(input_shape)
        self.attention.build(input_shape, input_shape)
        self.built = True

    def call(self, x, frame_mask, attention_mask, training=False):
        x = x + 0.5 * self.ff1(x, training=training)
        y = self.attention_norm(x)
        y = self.attention(y, y, attention_mask=attention_mask, training=training)
        x = x + self.attention_drop(y, training=training)
        x = x + self.conv(x, frame_mask, training=training)
        x = x + 0.5 * self.ff2(x, training=training)
        return self.out_norm(x)

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, ff_dim=self.ff_dim,
                      kernel_size=self.kernel_size, dropout=self.dropout,
                      attention=self.attention_impl)
        return config


@keras.saving.register_keras_serializable(package="tf_rnnt_conformer")
class ConformerEncoder(keras.layers.Layer):
    """`[B, T_in, F]` features -> `[B, T, d_model]` frames, `T = output_lengths(T_in)`.

    Call: `encoder([features, feature_lengths])`; the output's Keras mask marks each sample's
    `output_lengths(feature_lengths)` valid frames.

    Args:
      num_mel_bins: F.
      d_model: model width d.
      num_blocks: Conformer blocks.
      num_heads: attention heads (`d_model` must be a multiple).
      ff_dim: feed-forward inner width.
      kernel_size: depthwise convolution kernel.
      subsampling_channels: channels of the two subsampling convolutions.
      dropout: dropout rate (feed-forward, attention, convolution, positional encoding).
      attention: "keras" or "dot_product" (see `ConformerBlock`).
    """

    def __init__(self, num_mel_bins=80, d_model=512, num_blocks=16, num_heads=8, ff_dim=2048,
                 kernel_size=31, subsampling_channels=512, dropout=0.1, attention="keras",
                 **kwargs):
        super().__init__(**kwargs)
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} must be a multiple of num_heads={num_heads}.")
        self.num_mel_bins, self.d_model, self.num_blocks = num_mel_bins, d_model, num_blocks
        self.num_heads, self.ff_dim, self.kernel_size = num_heads, ff_dim, kernel_size
        self.subsampling_channels, self.dropout = subsampling_channels, dropout
        self.attention_impl = attention
        self.conv1 = keras.layers.Conv2D(subsampling_channels, 3, strides=2, activation="relu",
                                         name="subsampling_conv1")
        self.conv2 = keras.layers.Conv2D(subsampling_channels, 3, strides=2, activation="relu",
                                         name="subsampling_conv2")
        self.projection = keras.layers.Dense(d_model, name="projection")
        self.input_drop = keras.layers.Dropout(dropout)
        self.blocks = [ConformerBlock(d_model, num_heads, ff_dim, kernel_size, dropout,
                                      attention=attention, name=f"block{i}")
                       for i in range(num_blocks)]

    def build(self, input_shape):
        bins = self.num_mel_bins
        self._build_feature_normalization()
        bins1 = (bins + 2 - 3) // 2 + 1
        bins2 = (bins1 + 2 - 3) // 2 + 1
        self.conv1.build((None, None, bins + 2, 1))
        self.conv2.build((None, None, bins1 + 2, self.subsampling_channels))
        self.projection.build((None, None, bins2 * self.subsampling_channels))
        for block in self.blocks:
            block.build((None, None, self.d_model))
        self.built = True

    def _build_feature_normalization(self):
        bins = self.num_mel_bins
        self.feature_mean = self.add_weight(name="feature_mean", shape=(bins,),
                                            initializer="zeros", trainable=False)
        self.feature_std = self.add_weight(name="feature_std", shape=(bins,),
                                           initializer="ones", trainable=False)

    def set_feature_statistics(self, mean, std):
        """Per-bin normalization `(features - mean) / std` (not trained)."""
        self.feature_mean.assign(mean)
        self.feature_std.assign(std)

    def normalize_features(self, features):
        """`[B, T_in, F]` float32 features -> normalized float32 features. Frame t may depend on
        frames <= t only: the padding after a sample's frames must not reach them."""
        return (features - self.feature_mean) / self.feature_std

    def frame_lengths(self, feature_lengths):
        """Valid output frames for `feature_lengths` feature frames (`output_lengths`)."""
        return output_lengths(feature_lengths)

    def _subsample(self, conv, x, lengths):
        # One zero frame / bin on each side: output j reads inputs 2j - 1 .. 2j + 1, so the
        # valid outputs of a sample never read frames beyond its own (zeroed) padding.
        x = tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]])
        lengths = conv_output_lengths(lengths, 3, 2, "same")
        x = conv(x)
        return x * _frame_mask(lengths, tf.shape(x)[1], x.dtype)[..., None], lengths

    def call(self, inputs, training=False):
        features, feature_lengths = inputs
        feature_lengths = tf.cast(feature_lengths, tf.int32)
        x = self.normalize_features(tf.cast(features, tf.float32))
        x = x * _frame_mask(feature_lengths, tf.shape(x)[1], x.dtype)
        x = tf.cast(x, self.compute_dtype)[..., None]
        x, lengths = self._subsample(self.conv1, x, feature_lengths)
        x, lengths = self._subsample(self.conv2, x, lengths)
        shape = tf.shape(x)
        x = tf.reshape(x, [shape[0], shape[1], x.shape[2] * x.shape[3]])
        x = self.projection(x) * math.sqrt(self.d_model)
        x = x + tf.cast(sinusoidal_encoding(shape[1], self.d_model), x.dtype)
        x = self.input_drop(x, training=training)
        valid = tf.sequence_mask(lengths, shape[1])
        frame_mask = tf.cast(valid, x.dtype)[:, :, None]
        attention_mask = tf.logical_and(valid[:, None, :], tf.ones([1, shape[1], 1], tf.bool))
        for block in self.blocks:
            x = block(x, frame_mask, attention_mask, training=training)
        return x

    def compute_mask(self, inputs, mask=None):
        features, feature_lengths = inputs
        if isinstance(features, keras.KerasTensor):  # functional model construction
            return keras.KerasTensor(self.compute_output_shape(
                [features.shape, feature_lengths.shape])[:2], dtype="bool")
        return tf.sequence_mask(output_lengths(tf.cast(feature_lengths, tf.int32)),
                                (tf.shape(features)[1] + 3) // 4)

    def compute_output_shape(self, input_shape):
        frames = input_shape[0][1]
        return (input_shape[0][0], None if frames is None else (frames + 3) // 4, self.d_model)

    def get_config(self):
        config = super().get_config()
        config.update(num_mel_bins=self.num_mel_bins, d_model=self.d_model,
                      num_blocks=self.num_blocks, num_heads=self.num_heads, ff_dim=self.ff_dim,
                      kernel_size=self.kernel_size,
                      subsampling_channels=self.subsampling_channels, dropout=self.dropout,
                      attention=self.attention_impl)
        return config


@keras.saving.register_keras_serializable(package="tf_rnnt_conformer")
class SpeechConformerEncoder(FeatureNormalization, ConformerEncoder):
    """`ConformerEncoder` with the speech example's front end, in place of its
    `model.StreamingEncoder` (train.py --conformer).

    The features are normalized as `StreamingEncoder` does it: a `feature_norm`
    (`keras.layers.Normalization`, `adapt_features` / `set_feature_statistics`, saved with the
    weights), then with `mean_prior_frames` > 0 the utterance's running feature mean
    (`model.running_mean_normalization`). The rest is `ConformerEncoder`: full-context attention
    and "same" convolutions, so there is no chunk-wise `stream`; frame lengths are
    `output_lengths` (`frame_lengths`), `ceil(L / 4)`.

    Call: `encoder([features, feature_lengths])`, with the output's Keras mask.

    Args:
      num_mel_bins, d_model, num_blocks, num_heads, ff_dim, kernel_size, subsampling_channels,
        dropout: see `ConformerEncoder`.
      mean_prior_frames: the running mean's prior in frames (0: no per-utterance mean).
    """

    def __init__(self, num_mel_bins=40, d_model=144, num_blocks=4, num_heads=4, ff_dim=576,
                 kernel_size=15, subsampling_channels=32, dropout=0.1, mean_prior_frames=0,
                 **kwargs):
        super().__init__(num_mel_bins, d_model, num_blocks, num_heads, ff_dim, kernel_size,
                         subsampling_channels, dropout, **kwargs)
        self.mean_prior_frames = mean_prior_frames
        self.feature_norm = keras.layers.Normalization(axis=-1, name="feature_norm")

    def _build_feature_normalization(self):
        self.feature_norm.build((None, None, self.num_mel_bins))

    def normalize_features(self, features):
        x = tf.cast(self.feature_norm(features), tf.float32)  # float32 also under mixed policies
        if self.mean_prior_frames:
            batch = tf.shape(x)[0]
            x, _, _ = running_mean_normalization(
                x, tf.zeros([batch, self.num_mel_bins]), tf.zeros([batch, 1]),
                self.mean_prior_frames)
        return x

    def get_config(self):
        return {**super().get_config(), "mean_prior_frames": self.mean_prior_frames}


@keras.saving.register_keras_serializable(package="tf_rnnt_conformer")
class LSTMPredictor(Predictor):
    """Embedding + LSTM prediction network over blank-prefixed labels: the speech recipe's
    `model.Predictor` with the Conformer's sizes and a cuDNN switch.

    Call: `predictor(labels)` with `[B, U]` labels padded with negative ids -> `[B, U+1, D]`:
    step 0 sees the blank, step u the label u.

    Args:
      vocab_size: V (with blank).
      embedding_dim: embedding width.
      predictor_dim: LSTM width D.
      blank: blank id.
      dropout: dropout on the output.
      use_cudnn: `keras.layers.LSTM`'s `use_cudnn`. "auto" turns cuDNN off under a
        `mixed_bfloat16` policy (Keras' cuDNN LSTM returns wrong bfloat16 gradients on H200
        GPUs with TensorFlow 2.21). False gives a `tf.while_loop` of LSTM cells, which XLA
        compiles (`jit_compile=True`) where the cuDNN kernel has no XLA lowering.
      unroll: `keras.layers.LSTM`'s `unroll` (no loop: one cell per label position, a graph
        that XLA fuses across steps; needs a static label length and compiles longer).
    """

    def __init__(self, vocab_size, embedding_dim=640, predictor_dim=640, blank=0, dropout=0.1,
                 use_cudnn="auto", unroll=False, **kwargs):
        # Read by _lstm_options while Predictor builds the LSTM.
        self.use_cudnn, self.unroll = use_cudnn, unroll
        super().__init__(vocab_size, embedding_dim, predictor_dim, blank, dropout, **kwargs)

    def _lstm_options(self):
        cudnn = self.use_cudnn
        if self.unroll or (cudnn == "auto" and self.dtype_policy.compute_dtype == "bfloat16"):
            cudnn = False
        return {"use_cudnn": cudnn, "unroll": self.unroll}

    def get_config(self):
        return {**super().get_config(), "use_cudnn": self.use_cudnn, "unroll": self.unroll}


@keras.saving.register_keras_serializable(package="tf_rnnt_conformer")
class LogitsJoint(keras.layers.Layer):
    """Full `[B, T, U+1, V]` logits from an `RNNTJoint`'s weights (`RNNTJoint.logits`), with the
    encoder's frame mask as the output's Keras mask (which `tf_rnnt.keras.RNNTLoss` reads).

    Call: `logits_joint([encoder_out, predictor_out])`.
    """

    def __init__(self, joint, **kwargs):
        super().__init__(**kwargs)
        self.joint = joint

    def build(self, input_shape):
        self.joint.build(list(input_shape) + [(None, None)])
        self.built = True

    def call(self, inputs, mask=None):
        return self.joint.logits(inputs[0], inputs[1])

    def compute_mask(self, inputs, mask=None):
        return None if mask is None else mask[0]

    def compute_output_shape(self, shapes):
        return (shapes[0][0], shapes[0][1], shapes[1][1], self.joint.vocab_size)


def build_conformer_transducer(vocab_size=1025, num_mel_bins=80, d_model=512, num_blocks=16,
                               num_heads=8, ff_dim=2048, conv_kernel_size=31,
                               subsampling_channels=512, embedding_dim=640, predictor_dim=640,
                               joint_dim=640, dropout=0.1, blank=0, output="lattice",
                               joint_mode="tiled", lstm_use_cudnn="auto", lstm_unroll=False,
                               attention="keras", max_labels=None,
                               name="conformer_transducer"):
    """The Conformer transducer as an uncompiled `keras.Model`.

    Inputs `{"features": [B, T_in, num_mel_bins] float, "feature_lengths": [B] int32,
    "labels": [B, U] int32 padded with -1}`. Output (`output`):

      * "lattice": the `[B, T, U+1, 2]` lattice of `RNNTJoint` (`T = ceil(T_in / 4)`); compile
        with `tf_rnnt.keras.FlashRNNTLoss()`.
      * "logits": the `[B, T, U+1, vocab_size]` logits of the same joint (`LogitsJoint`), with
        the frame mask; compile with `tf_rnnt.keras.RNNTLoss()` (and `jit_compile=False`).

    Layers "encoder" (`ConformerEncoder`), "predictor" (`LSTMPredictor`) and "joint"
    (`RNNTJoint`) are the parts for decoding. Builds under the current dtype policy (set
    `keras.mixed_precision.set_global_policy("mixed_bfloat16")` first for bfloat16 training).

    Args:
      vocab_size: V, with the blank.
      num_mel_bins: feature bins F.
      d_model, num_blocks, num_heads, ff_dim, conv_kernel_size, subsampling_channels, dropout:
        the encoder's sizes (`ConformerEncoder`).
      embedding_dim, predictor_dim: the predictor's sizes.
      joint_dim: the joint's hidden size H.
      blank: blank id.
      output: "lattice" or "logits".
      joint_mode: `RNNTJoint` mode ("tiled" or "untiled").
      lstm_use_cudnn, lstm_unroll: `LSTMPredictor`'s `use_cudnn` and `unroll`.
      attention: "keras" or "dot_product" (see `ConformerBlock`).
      max_labels: a static label length U for the `labels` input (None: any; `lstm_unroll`
        needs it).
      name: model name.

    Returns:
      `keras.Model`.
    """
    if output not in ("lattice", "logits"):
        raise ValueError(f"output must be 'lattice' or 'logits', got {output!r}.")
    features = keras.Input((None, num_mel_bins), name="features")
    feature_lengths = keras.Input((), dtype="int32", name="feature_lengths")
    if lstm_unroll and max_labels is None:
        raise ValueError("lstm_unroll=True needs a static label length (max_labels).")
    labels = keras.Input((max_labels,), dtype="int32", name="labels")
    encoder = ConformerEncoder(num_mel_bins, d_model, num_blocks, num_heads, ff_dim,
                               conv_kernel_size, subsampling_channels, dropout,
                               attention=attention, name="encoder")
    predictor = LSTMPredictor(vocab_size, embedding_dim, predictor_dim, blank, dropout,
                              use_cudnn=lstm_use_cudnn, unroll=lstm_unroll, name="predictor")
    joint = RNNTJoint(vocab_size, joint_dim, blank=blank, mode=joint_mode, name="joint")
    frames = encoder([features, feature_lengths])  # with the frames' Keras mask
    frame_lengths = output_lengths(feature_lengths)
    predictions = predictor(labels)
    if output == "lattice":
        out = joint([frames, predictions, labels, frame_lengths])
    else:
        out = LogitsJoint(joint, name="logits_joint")([frames, predictions])
    return keras.Model({"features": features, "feature_lengths": feature_lengths,
                        "labels": labels}, out, name=name)


# Sizes for tests and CPU smoke runs.
TINY = dict(vocab_size=17, num_mel_bins=16, d_model=32, num_blocks=2, num_heads=4, ff_dim=64,
            conv_kernel_size=5, subsampling_channels=8, embedding_dim=16, predictor_dim=32,
            joint_dim=24)
