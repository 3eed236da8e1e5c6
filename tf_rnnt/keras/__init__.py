"""Keras 3 API: the `RNNTJoint` layer, the `FlashRNNTLoss` / `FlashTDTLoss` / `RNNTLoss` losses
and the length utilities `conv_output_lengths`, `LengthMask` and `PredictorInput`.

A transducer trained with Keras ends in an `RNNTJoint` layer and is compiled with the loss the
layer hands out, so blank and label padding are set once:

```python
joint = tf_rnnt.keras.RNNTJoint(vocab_size=V, units=320)
lattice = joint([encoder_out, predictor_out, labels, frame_lengths])   # [B, T, U+1, 2]
model = keras.Model([features, feature_lengths, labels], lattice)
model.compile(optimizer="adam", loss=joint.loss())
```

A TDT transducer (Xu et al. 2023) takes `RNNTJoint(..., durations=[0, 1, 2, 3, 4])`: its
lattice has `2 + D` channels and `joint.loss(sigma=..., omega=...)` is a `FlashTDTLoss`.

Lengths:
  * Frame lengths of `encoder_out`: the optional 4th input of `RNNTJoint` (after subsampling:
    `conv_output_lengths`), else the Keras mask of `encoder_out`. With neither, `RNNTJoint`
    raises unless built with `all_frames_valid=True`.
  * Label lengths come from padding: label entries equal to `pad_value` (default -1) are
    padding, at the end of each row.

The padded-node convention (how the loss gets the lengths): `RNNTJoint` writes
`PAD_NODE_VALUE` (+1.0) into both channels of every lattice node outside a sample's valid
rectangle (`t >= logit_length` or `u > label_length`). Real nodes hold log-probabilities, which
are never positive, so the marking is unambiguous; `FlashRNNTLoss` reads the lengths back
(`lattice_lengths`). The label channel of the last node column (`u = U`), never read by the
loss, holds `2 + blank`, so a loss given another blank fails. Lattices built without
`RNNTJoint` (e.g. with `tf_rnnt.joint_lattice`) are marked with `mark_lattice_padding`.

XLA: `model.compile(jit_compile=True)` (and Keras' "auto", which turns XLA on for a GPU model)
compiles the whole training step, these layers and losses included: the op library's XLA
kernels lower each op to an XLA custom call running the same CPU/CUDA code. With a library
without XLA kernels for the devices in use (built against a TensorFlow without the XLA FFI,
2.17, or without CUDA on a GPU machine) `RNNTJoint.supports_jit` is False, so Keras compiles a
model with an `RNNTJoint` without XLA, under "auto" and `jit_compile=True` alike (a warning
names the layer), and the fused joint stays. The input checks that guard against silently
wrong values (labels padded in the middle, a mask with a hole, a loss whose blank or pad_value
differs from the layer's) run as a compiled op in the data flow, so they hold under XLA too;
without usable XLA kernels, tracing them under XLA (e.g. `RNNTLoss` in a model compiled with
`jit_compile=True`) raises `tf_rnnt.ops.XlaCheckUnavailableError` rather than train unchecked.
"""

from tf_rnnt.keras.lattice import PAD_NODE_VALUE, lattice_lengths, mark_lattice_padding
from tf_rnnt.keras.layer import RNNTJoint
from tf_rnnt.keras.lengths import LengthMask, PredictorInput, conv_output_lengths
from tf_rnnt.keras.losses import FlashRNNTLoss, FlashTDTLoss, RNNTLoss

__all__ = ["RNNTJoint", "FlashRNNTLoss", "FlashTDTLoss", "RNNTLoss", "PredictorInput", "LengthMask",
           "conv_output_lengths", "mark_lattice_padding", "lattice_lengths", "PAD_NODE_VALUE"]
