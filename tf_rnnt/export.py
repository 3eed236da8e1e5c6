"""Streaming export of a trained transducer: a SavedModel that needs only TensorFlow, and TFLite.

The model is given as its streaming pieces (the protocol of `tf_rnnt.decoding`, with state):

  encoder: `initial_state(batch_size) -> state` (a nest of `[B, ...]` float tensors) and
      `stream(features [B, C, F], state) -> (frames [B, C // subsampling, D], new_state)`,
      causal, so that chunks of a multiple of `subsampling` feature frames give the frames of the
      whole utterance.
  predictor: `initial_state(batch_size) -> state` (a nest of `[B, ...]` tensors; integer ones
      are carried as floats in the flat state, exact up to 2^24) and
      `step(tokens [B] int32, state) -> (output [B, P], new_state)`.
  joint: a `tf_rnnt.keras.RNNTJoint` (its plain-TF `logits`) or a `joint_fn` callable.
  feature_fn: `audio [B, N] float32 -> features [B, T, F]` (e.g. log-mel), and
      `feature_lengths_fn(num_samples [B]) -> [B]` frames, `frame_lengths_fn(feature_lengths)`
      -> encoder frames.

`StreamingTranscriber` wraps them in a `tf.Module` with these signatures (states are flat
`[B, S]` float32 tensors, so they pass through signatures and TFLite unchanged):

  features(audio [B, N]) -> {"features": [B, T, F]}
  initial_state(batch_size int32) -> {"encoder_state": [B, S_enc], "decoder_state": [B, S_dec]}
  encode_chunk(features [B, C, F], encoder_state) -> {"frames": [B, C', D], "encoder_state"}
  decode_chunk(frames [B, C', D], decoder_state) -> {"tokens": [B, C' * S] int32 (-1: none),
      "text": [B] string (this chunk's labels as text), "decoder_state"}
      Greedy search with at most S labels per frame (`tf_rnnt.decoding.greedy_search`; for a
      TDT joint, `tdt_greedy_search`, whose state carries the frames left to skip).
  transcribe(audio [B, N], audio_lengths [B] int32) -> {"text": [B] string,
      "tokens": [B, K] int32 (-1: none)}

`export_saved_model` writes them; `convert_streaming_step_to_tflite` converts one streaming step
(features chunk -> tokens, with both states) at a fixed chunk size to a TFLite model of builtin
ops only (no Flex): recurrent Keras layers are unrolled over the chunk's static length, and the
greedy search's loops are `tf.while_loop`s over plain tensors (TFLite WHILE).
"""

import contextlib

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import convert_to_constants

from tf_rnnt import _contract as contract
from tf_rnnt import decoding

SIGNATURES = ("features", "initial_state", "encode_chunk", "decode_chunk", "transcribe")


class _FlatState:
    """Packs a nest of `[B, ...]` tensors into one `[B, S]` float32 tensor and back."""

    def __init__(self, example):
        self.structure = example
        flat = tf.nest.flatten(example)
        self.shapes = [tuple(x.shape[1:]) for x in flat]
        self.dtypes = [x.dtype for x in flat]
        self.sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.size = sum(self.sizes)

    def flatten(self, nest):
        flat = tf.nest.flatten(nest)
        batch = tf.shape(flat[0])[0]
        return tf.concat([tf.reshape(tf.cast(x, tf.float32), [batch, n])
                          for x, n in zip(flat, self.sizes)], axis=1)

    def unflatten(self, flat):
        batch = tf.shape(flat)[0]
        parts, offset = [], 0
        for shape, dtype, n in zip(self.shapes, self.dtypes, self.sizes):
            part = tf.reshape(flat[:, offset:offset + n],
                              tf.concat([[batch], tf.constant(shape, tf.int32)], 0))
            parts.append(tf.cast(tf.round(part), dtype) if dtype.is_integer else part)
            offset += n
        return tf.nest.pack_sequence_as(self.structure, parts)


def _check_protocol(model, argument, methods):
    missing = [m for m in methods if not callable(getattr(model, m, None))]
    if missing:
        raise TypeError(
            f"StreamingTranscriber: `{argument}` ({type(model).__name__}) lacks "
            f"{', '.join(missing)}: it must implement {' and '.join(methods)} (see the "
            f"tf_rnnt.export module docstring). A plain keras.Model runs whole sequences "
            f"without a carried state; wrap it in a keras.layers.Layer that exposes "
            f"initial_state(batch_size) and "
            f"{'stream(features, state)' if argument == 'encoder' else 'step(tokens, state)'} "
            f"(e.g. an LSTM called with initial_state=... and return_state=True).")


def _check_flat_state(state, size, argument, batch=None):
    """Run-time checks of a flat `[B, size]` state (a loaded signature does not enforce its
    input shapes); returns the checks."""
    shape = tf.shape(state)
    checks = [tf.debugging.assert_rank(state, 2, message=f"`{argument}` must be [B, {size}]"),
              tf.debugging.assert_equal(shape[-1], size, message=(
                  f"`{argument}` must be [B, {size}] (the width of this model's state)"))]
    if batch is not None:
        checks.append(tf.debugging.assert_equal(shape[0], batch, message=(
            f"the batch of `{argument}` differs from the batch of the frames or features")))
    return checks


def _checked_chunk(chunk, rank_message, state, state_size, state_argument):
    """`(chunk, state)` behind run-time checks: chunk of rank 3, state a flat one of its batch."""
    checks = [tf.debugging.assert_rank(chunk, 3, message=rank_message)]
    checks += _check_flat_state(state, state_size, state_argument, tf.shape(chunk)[0])
    with tf.control_dependencies(checks):  # the state too: unflattening it reshapes it
        return tf.identity(chunk), tf.identity(state)


class StreamingTranscriber(tf.Module):
    """The streaming signatures of a transducer (see the module docstring).

    Args:
      encoder, predictor, joint, feature_fn: see the module docstring.
      num_features: `F`, features per frame.
      vocabulary: the text of each token id (the blank's is ignored).
      feature_lengths_fn: `[B]` samples -> `[B]` feature frames.
      frame_lengths_fn: `[B]` feature frames -> `[B]` encoder frames.
      blank: the blank id.
      max_symbols_per_frame: the greedy search's limit.
      durations: None (RNN-T), or a TDT model's durations (default: the joint's `durations`
        attribute, as `RNNTJoint(..., durations=...)` has): decoding is then
        `tf_rnnt.decoding.tdt_greedy_search` over the joint's `V + D` logits (`vocabulary` holds
        the `V` tokens), and the decoder state carries the frames left to skip.
    """

    def __init__(self, encoder, predictor, joint, feature_fn, num_features, vocabulary,
                 feature_lengths_fn, frame_lengths_fn, blank=0, max_symbols_per_frame=5,
                 durations=None, name="streaming_transducer"):
        super().__init__(name=name)
        _check_protocol(encoder, "encoder", ("initial_state", "stream"))
        _check_protocol(predictor, "predictor", ("initial_state", "step"))
        if isinstance(max_symbols_per_frame, bool) or not isinstance(max_symbols_per_frame, int) \
                or max_symbols_per_frame < 1:
            raise ValueError(f"StreamingTranscriber: max_symbols_per_frame must be an int >= 1, "
                             f"got {max_symbols_per_frame!r}.")
        vocabulary = list(vocabulary)
        if isinstance(blank, bool) or not isinstance(blank, int) or \
                not -len(vocabulary) <= blank < len(vocabulary):
            raise ValueError(f"StreamingTranscriber: blank must be an int in [-V, V) for the "
                             f"V={len(vocabulary)} entries of `vocabulary`, got {blank!r}.")
        blank %= len(vocabulary)
        if durations is None:
            durations = getattr(joint, "durations", None)
        self.durations = None if durations is None else list(
            contract.check_durations(durations, "StreamingTranscriber"))
        self.encoder = encoder
        self.predictor = predictor
        self.joint = joint
        self.joint_fn = joint if not hasattr(joint, "logits") else \
            decoding.joint_fn_from_layer(joint)
        self._feature_fn = feature_fn
        self._feature_lengths_fn = feature_lengths_fn
        self._frame_lengths_fn = frame_lengths_fn
        self.blank = blank
        self.max_symbols_per_frame = max_symbols_per_frame
        self.num_features = num_features
        self._characters = tf.constant(
            ["" if i == blank else str(v) for i, v in enumerate(vocabulary)])
        self._encoder_state = _FlatState(encoder.initial_state(1))
        self._decoder_state = _FlatState(self._greedy_start(1))
        frames, _ = encoder.stream(tf.zeros([1, 16, num_features]), encoder.initial_state(1))
        self.frame_dim = int(frames.shape[-1])
        self.encoder_state_size = self._encoder_state.size
        self.decoder_state_size = self._decoder_state.size
        f, d = num_features, self.frame_dim
        self.features = tf.function(
            self._features, input_signature=[tf.TensorSpec([None, None], tf.float32, "audio")])
        self.initial_state = tf.function(
            self._initial_state, input_signature=[tf.TensorSpec([], tf.int32, "batch_size")])
        self.encode_chunk = tf.function(self._encode_chunk, input_signature=[
            tf.TensorSpec([None, None, f], tf.float32, "features"),
            tf.TensorSpec([None, self.encoder_state_size], tf.float32, "encoder_state")])
        self.decode_chunk = tf.function(self._decode_chunk, input_signature=[
            tf.TensorSpec([None, None, d], tf.float32, "frames"),
            tf.TensorSpec([None, self.decoder_state_size], tf.float32, "decoder_state")])
        self.transcribe = tf.function(self._transcribe, input_signature=[
            tf.TensorSpec([None, None], tf.float32, "audio"),
            tf.TensorSpec([None], tf.int32, "audio_lengths")])

    # -- pieces --------------------------------------------------------------------------------
    def _greedy_start(self, batch_size):
        start = self.predictor.initial_state(batch_size)
        if self.durations is not None:
            return decoding.tdt_greedy_initial_state(self.predictor.step, start, self.blank)
        return decoding.greedy_initial_state(self.predictor.step, start, self.blank)

    def _greedy(self, frames, frame_lengths, flat_state):
        state = self._decoder_state.unflatten(flat_state)
        if self.durations is not None:
            tokens, state = decoding.tdt_greedy_search(
                frames, frame_lengths, state, self.joint_fn, self.predictor.step,
                self.durations, self.max_symbols_per_frame, self.blank)
        else:
            tokens, state = decoding.greedy_search(
                frames, frame_lengths, state, self.joint_fn, self.predictor.step,
                self.max_symbols_per_frame, self.blank)
        return tokens, self._decoder_state.flatten(state)

    def _text(self, tokens):
        return tf.strings.reduce_join(tf.gather(self._characters, tf.maximum(tokens, 0)), axis=-1)

    # -- signatures ----------------------------------------------------------------------------
    def _features(self, audio):
        return {"features": self._feature_fn(audio)}

    def _initial_state(self, batch_size):
        return {"encoder_state": self._encoder_state.flatten(
                    self.encoder.initial_state(batch_size)),
                "decoder_state": self._decoder_state.flatten(self._greedy_start(batch_size))}

    def _encode_chunk(self, features, encoder_state):
        features, encoder_state = _checked_chunk(features, "`features` must be [B, C, F]",
                                                 encoder_state, self.encoder_state_size,
                                                 "encoder_state")
        frames, state = self.encoder.stream(features, self._encoder_state.unflatten(encoder_state))
        return {"frames": frames, "encoder_state": self._encoder_state.flatten(state)}

    def _decode_chunk(self, frames, decoder_state):
        frames, decoder_state = _checked_chunk(frames, "`frames` must be [B, C', D]",
                                               decoder_state, self.decoder_state_size,
                                               "decoder_state")
        lengths = tf.fill([tf.shape(frames)[0]], tf.shape(frames)[1])
        tokens, state = self._greedy(frames, lengths, decoder_state)
        return {"tokens": tokens, "text": self._text(tokens), "decoder_state": state}

    def _transcribe(self, audio, audio_lengths):
        features = self._feature_fn(audio)
        batch = tf.shape(audio)[0]
        frames, _ = self.encoder.stream(features, self.encoder.initial_state(batch))
        frame_lengths = self._frame_lengths_fn(self._feature_lengths_fn(audio_lengths))
        start = self._decoder_state.flatten(self._greedy_start(batch))
        tokens, _ = self._greedy(frames, frame_lengths, start)
        return {"text": self._text(tokens), "tokens": decoding.compact_tokens(tokens)}

    def streaming_step(self, features, encoder_state, decoder_state):
        """encode_chunk then decode_chunk: `(tokens, encoder_state, decoder_state)`."""
        encoded = self._encode_chunk(features, encoder_state)
        frames = encoded["frames"]
        lengths = tf.fill([tf.shape(frames)[0]], tf.shape(frames)[1])
        tokens, state = self._greedy(frames, lengths, decoder_state)
        return {"tokens": tokens, "encoder_state": encoded["encoder_state"],
                "decoder_state": state}


def export_saved_model(transcriber, path):
    """Writes a `StreamingTranscriber`'s signatures (`SIGNATURES`) as a SavedModel at `path`.

    The SavedModel holds core TensorFlow ops only (the joint runs through `RNNTJoint.logits`, not
    the custom op): `tf.saved_model.load(path).signatures[...]` works without tf_rnnt.
    """
    signatures = {name: getattr(transcriber, name) for name in SIGNATURES}
    tf.saved_model.save(transcriber, path, signatures=signatures)


def _keras_layers_in(obj, seen=None):
    """Every Keras layer reachable from `obj`: a layer and its sublayers, or the attributes
    (also inside lists, tuples and dicts) of a tf.Module or plain object."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, keras.layers.Layer):
        return list(obj._flatten_layers(include_self=True, recursive=True))
    if isinstance(obj, (list, tuple)):
        children = list(obj)
    elif isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, tf.Module) or hasattr(obj, "__dict__") and not isinstance(obj, type):
        children = [v for k, v in vars(obj).items() if not k.startswith("__")]
    else:
        return []
    found = []
    for child in children:
        if isinstance(child, (keras.layers.Layer, tf.Module, list, tuple, dict)):
            found += _keras_layers_in(child, seen)
    return found


@contextlib.contextmanager
def unrolled_recurrent_layers(*layers):
    """Sets `unroll=True` on every `keras.layers.RNN` (LSTM, GRU, ...) inside `layers` (Keras
    layers, or tf.Modules and objects holding them) while the context lasts: traced over a
    static number of steps they become plain ops, no while loop over TensorLists (which TFLite
    only runs through Flex)."""
    found, ids = [], set()
    for layer in layers:
        for sub in _keras_layers_in(layer):
            if isinstance(sub, keras.layers.RNN) and id(sub) not in ids:
                ids.add(id(sub))
                found.append(sub)
    previous = [rnn.unroll for rnn in found]
    try:
        for rnn in found:
            rnn.unroll = True
        yield found
    finally:
        for rnn, unroll in zip(found, previous):
            rnn.unroll = unroll


class WholeChunkEncoder(keras.layers.Layer):
    """A Keras encoder model in the streaming protocol, each chunk encoded on its own.

    For encoders without a carried state, e.g. the Keras recipe's (convolutions and a
    bidirectional LSTM): `stream` runs the model on the chunk alone (its state is a `[B, 1]`
    placeholder), so a chunk that holds the whole utterance gives the model's own frames;
    shorter chunks of a non-causal encoder give other frames.

    Args:
      model: `features [B, T, F] -> frames [B, T', D]`, or `[features, feature_lengths [B]] ->
        frames` (then every frame of a chunk is valid).
    """

    def __init__(self, model, **kwargs):
        super().__init__(**kwargs)
        self.model = model
        self._with_lengths = len(getattr(model, "inputs", None) or [None]) == 2

    def initial_state(self, batch_size):
        return tf.zeros([batch_size, 1])

    def stream(self, features, state):
        features = tf.convert_to_tensor(features, tf.float32)
        if self._with_lengths:
            shape = tf.shape(features)
            return self.model([features, tf.fill([shape[0]], shape[1])]), state
        return self.model(features), state


class RNNPredictor(keras.layers.Layer):
    """A predictor of an `Embedding` and a recurrent layer (LSTM, GRU, SimpleRNN), e.g. the
    Keras recipe's, in the streaming protocol: one token per step through the layer's cell.

    Args:
      embedding: the trained `keras.layers.Embedding`.
      rnn: the trained recurrent layer (its cell's weights are used).
    """

    def __init__(self, embedding, rnn, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding
        self.rnn = rnn

    def initial_state(self, batch_size):
        sizes = self.rnn.cell.state_size
        sizes = sizes if isinstance(sizes, (list, tuple)) else [sizes]
        return [tf.zeros([batch_size, n]) for n in sizes]

    def step(self, tokens, state):
        output, new_state = self.rnn.cell(self.embedding(tokens), list(state))
        return output, list(tf.nest.flatten(new_state))


def convert_streaming_step_to_tflite(transcriber, chunk_features, batch_size=1, optimize=False):
    """The streaming step (features chunk -> encoder -> greedy search) as a TFLite model.

    Inputs `features [batch_size, chunk_features, F]`, `encoder_state [batch_size, S_enc]`,
    `decoder_state [batch_size, S_dec]`; outputs `tokens [batch_size, C' * S]` (-1: none) and the
    new states, as `StreamingTranscriber.streaming_step`. Builtin TFLite ops only.

    Args:
      transcriber: a `StreamingTranscriber`.
      chunk_features: feature frames per chunk (a multiple of the encoder's subsampling).
      batch_size: the static batch size.
      optimize: apply `tf.lite.Optimize.DEFAULT` (dynamic-range int8 weights).

    Returns:
      The TFLite flatbuffer (`bytes`); run it with `tflite_step_runner` (which checks the
      inputs' shapes), or with an interpreter's "serving_default" signature runner directly
      (which resizes inputs of other shapes instead of refusing them).
    """
    specs = [tf.TensorSpec([batch_size, chunk_features, transcriber.num_features], tf.float32,
                           "features"),
             tf.TensorSpec([batch_size, transcriber.encoder_state_size], tf.float32,
                           "encoder_state"),
             tf.TensorSpec([batch_size, transcriber.decoder_state_size], tf.float32,
                           "decoder_state")]
    step = tf.function(transcriber.streaming_step, input_signature=specs)
    with unrolled_recurrent_layers(transcriber.encoder, transcriber.predictor):
        concrete = step.get_concrete_function()
    # Weights as constants, also those read inside the loops' body functions (the converter
    # alone leaves those as resource variables, which its interpreter cannot read).
    frozen = convert_to_constants.convert_variables_to_constants_v2(concrete)
    output_names = sorted(concrete.structured_outputs)  # the frozen function's output order

    @tf.function(input_signature=specs)
    def named_step(features, encoder_state, decoder_state):
        return dict(zip(output_names, frozen(features, encoder_state, decoder_state)))

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [named_step.get_concrete_function()], transcriber)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if optimize:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    return converter.convert()


def tflite_interpreter(model_content=None, model_path=None, **kwargs):
    """A TFLite interpreter: LiteRT's (`ai_edge_litert`) when installed, else
    `tf.lite.Interpreter` (deprecated in TensorFlow 2.21). Arguments as the interpreter's."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        Interpreter = tf.lite.Interpreter
    return Interpreter(model_content=model_content, model_path=model_path, **kwargs)


def tflite_step_runner(flatbuffer):
    """Runs the TFLite streaming step with its inputs checked.

    A TFLite signature runner resizes an input of another shape instead of refusing it (a
    decoder state of the wrong width or batch would be misread), and TFLite has no assertion
    among its builtin ops, so the model itself cannot refuse it: this wrapper compares each
    input's shape with the model's before running it.

    Args:
      flatbuffer: from `convert_streaming_step_to_tflite`.

    Returns:
      `step(features, encoder_state, decoder_state) -> {"tokens", "encoder_state",
      "decoder_state"}` (NumPy arrays); ValueError names an input of the wrong shape.
    """
    interpreter = tflite_interpreter(flatbuffer)
    runner = interpreter.get_signature_runner()
    expected = {name: tuple(detail["shape"]) for name, detail in
                runner.get_input_details().items()}

    def step(features, encoder_state, decoder_state):
        inputs = {"features": features, "encoder_state": encoder_state,
                  "decoder_state": decoder_state}
        for name, value in inputs.items():
            shape = np.shape(value)
            if tuple(shape) != expected[name]:
                raise ValueError(f"TFLite streaming step: `{name}` must have shape "
                                 f"{list(expected[name])}, got {list(shape)}.")
        return runner(**{k: np.asarray(v, np.float32) for k, v in inputs.items()})

    return step
