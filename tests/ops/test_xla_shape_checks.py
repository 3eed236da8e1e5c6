"""Shape checks of the XLA kernels: the graph kernels' checks, with their messages.

Each bad input runs through a tf.function whose input_signature leaves every dimension
unknown, so neither the Python checks nor the ops' shape functions see the problem at trace
time: the graph kernel reports it when it runs, and the XLA lowering (jit_compile=True) when it
compiles for the concrete shapes. Both must raise InvalidArgumentError with the same message.
"""

import numpy as np
import oracle
import pytest
import tensorflow as tf

import tf_rnnt

B, T, U, H, V = 2, 4, 3, 8, 7


def _joint_inputs():
    enc, pred, kernel, bias, labels, logit_lengths, label_lengths = \
        oracle.float32_joint_problem(5, (B, T, U, H, V), blank=0)
    return dict(encoder=enc.astype(np.float32), predictor=pred.astype(np.float32),
                kernel=kernel.astype(np.float32), bias=bias.astype(np.float32), labels=labels,
                logit_lengths=logit_lengths, label_lengths=label_lengths)


def _flash(encoder, predictor, kernel, bias, labels, logit_lengths, label_lengths):
    return tf_rnnt.flash_rnnt_loss(encoder, predictor, kernel, bias, labels, logit_lengths,
                                   label_lengths)


def _lattice_loss(lattice, logit_lengths, label_lengths):
    return tf_rnnt.lattice_loss(lattice, logit_lengths, label_lengths)


def _rnnt_loss(logits, labels, logit_lengths, label_lengths):
    return tf_rnnt.rnnt_loss(logits, labels, logit_lengths, label_lengths)


def _lattice_inputs(channels=2, batch=B):
    rng = np.random.default_rng(6)
    return dict(lattice=np.log(rng.uniform(0.1, 1.0, (B, T, U + 1, channels))).astype(np.float32),
                logit_lengths=np.full([batch], T, np.int32),
                label_lengths=np.full([batch], U, np.int32))


def _logits_inputs(labels_width=U):
    rng = np.random.default_rng(7)
    return dict(logits=rng.normal(size=(B, T, U + 1, V)).astype(np.float32),
                labels=rng.integers(1, V, (B, labels_width)).astype(np.int32),
                logit_lengths=np.full([B], T, np.int32),
                label_lengths=np.full([B], min(U, labels_width), np.int32))


def _with(inputs, **changes):
    return {**inputs, **changes}


CASES = [
    pytest.param(_flash, lambda: _with(_joint_inputs(),
                                       labels=np.ones([B, U - 1], np.int32),
                                       label_lengths=np.full([B], U - 1, np.int32)),
                 "labels must have shape [2, 3]", id="joint_labels_narrower_than_U"),
    pytest.param(_flash,
                 lambda: _with(_joint_inputs(), logit_lengths=np.full([B + 1], T, np.int32)),
                 "logit_lengths must have shape [2]", id="joint_logit_lengths_batch"),
    pytest.param(_flash,
                 lambda: _with(_joint_inputs(), label_lengths=np.full([B - 1], 1, np.int32)),
                 "label_lengths must have shape [2]", id="joint_label_lengths_batch"),
    pytest.param(_lattice_loss, lambda: _lattice_inputs(channels=3),
                 "lattice must have shape [B, T, U+1, 2]", id="lattice_3_channels"),
    pytest.param(_lattice_loss, lambda: _lattice_inputs(batch=B + 1),
                 "logit_lengths must have shape [2]", id="lattice_lengths_batch"),
    pytest.param(_rnnt_loss, lambda: _logits_inputs(labels_width=U - 1),
                 "labels must have shape [2, 3]", id="logits_labels_narrower_than_U"),
]


def _error(fn, inputs, jit_compile):
    args = [tf.constant(x) for x in inputs.values()]
    spec = [tf.TensorSpec([None] * a.shape.rank, a.dtype) for a in args]
    compiled = tf.function(fn, input_signature=spec, jit_compile=jit_compile)
    with tf.device("/CPU:0"), pytest.raises(tf.errors.InvalidArgumentError) as info:
        compiled(*args)
    return info.value.message


@pytest.mark.parametrize("fn, make_inputs, expected", CASES)
def test_xla_makes_the_graph_kernels_shape_checks(fn, make_inputs, expected):
    inputs = make_inputs()
    graph_message = _error(fn, inputs, jit_compile=False)
    assert expected in graph_message
    # The graph kernel's own message (TensorFlow adds the function and node around it).
    check = graph_message[graph_message.index(expected):].splitlines()[0].split("\t")[0].strip()
    assert check in _error(fn, inputs, jit_compile=True)
