"""FlashRNNTLoss reads no lattice-derived value on the host before its loss op.

The loss recovers the lengths from the lattice, which the device computes only after the joint;
a host copy of them (a HostMemory input, or an assert gating the op) would stall every step.
The graph tests inspect a traced training step; the value tests compare costs and gradients
with tf_rnnt.reference (full logits, autodiff), and check that invalid lattices still fail.
"""

import numpy as np
import pytest
import tensorflow as tf

from tf_rnnt import ops, reference
from tf_rnnt.keras import FlashRNNTLoss, RNNTJoint, mark_lattice_padding

VOCAB, ENCODER_DIM, PREDICTOR_DIM, UNITS, PAD = 7, 8, 6, 10, -1
_METADATA_OPS = ("Shape", "ShapeN", "Size", "Rank")


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    frame_lengths = np.array([6, 2, 4], np.int32)
    label_lengths = np.array([4, 0, 2], np.int32)
    labels = rng.integers(1, VOCAB, size=(3, 4)).astype(np.int32)
    labels[np.arange(4)[None, :] >= label_lengths[:, None]] = PAD
    encoder_out = rng.normal(size=(3, 6, ENCODER_DIM)).astype(np.float32)
    predictor_out = rng.normal(size=(3, 5, PREDICTOR_DIM)).astype(np.float32)
    return encoder_out, predictor_out, labels, frame_lengths, label_lengths


def _value_ancestors(op):
    """Ops whose values `op` waits for (data and control inputs), not looking through shape
    ops: a shape is host metadata, known once its input is dispatched."""
    seen, stack = set(), [op]
    while stack:
        current = stack.pop()
        if current is not op and current.type in _METADATA_OPS:
            continue
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def _training_step_graph(joint, loss):
    @tf.function
    def step(encoder_out, predictor_out, labels, frame_lengths):
        with tf.GradientTape() as tape:
            lattice = joint([encoder_out, predictor_out, labels, frame_lengths])
            value = loss(tf.cast(labels, tf.float32), lattice)
        return value, tape.gradient(value, joint.trainable_variables)

    encoder_out, predictor_out, labels, frame_lengths, _ = _inputs()
    joint([encoder_out, predictor_out, labels, frame_lengths])  # builds the weights
    return step.get_concrete_function(
        tf.TensorSpec([None, None, ENCODER_DIM]), tf.TensorSpec([None, None, PREDICTOR_DIM]),
        tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.int32)).graph


def _one_op(graph, op_type):
    found = [op for op in graph.get_operations() if op.type == op_type]
    assert len(found) == 1, (op_type, found)
    return found[0]


def test_loss_op_takes_no_lattice_derived_host_input_nor_gate():
    joint = RNNTJoint(VOCAB, UNITS, blank=0, pad_value=PAD)
    graph = _training_step_graph(joint, joint.loss(reduction="sum"))
    loss_op = _one_op(graph, "TfRnntLatticeLoss")
    joint_op = _one_op(graph, "TfRnntJointLattice")
    assert loss_op.get_attr("validate_lengths") is False
    # The device inputs come from the lattice; the host inputs are empty and not derived from it.
    assert joint_op in _value_ancestors(loss_op.inputs[1].op)
    for host_input in loss_op.inputs[3:5]:
        assert host_input.shape.as_list() == [0]
        assert joint_op not in _value_ancestors(host_input.op)
    # No assert the loss op waits for reads a lattice value ...
    gates = [op for op in _value_ancestors(loss_op) if op.type == "Assert"]
    assert gates, "the static batch and U+1 checks should still gate the op"
    for gate in gates:
        assert joint_op not in _value_ancestors(gate), gate.name
    # ... but the lattice checks (frames, pad_value, blank) are in the graph, after the op:
    # compiled checks (TfRnntCheck), which gate the costs and so also hold under XLA.
    lattice_checks = [op for op in graph.get_operations()
                      if op.type == "TfRnntCheck" and joint_op in _value_ancestors(op)]
    assert not any(op in _value_ancestors(loss_op) for op in lattice_checks)
    messages = " ".join(op.get_attr("message").decode() for op in lattice_checks)
    for expected in ("without frames", "disagree", "differs from the blank"):
        assert expected in messages, expected
    # The weights' gradients wait for them, so invalid data fails the step before any update.
    grad_inputs = _value_ancestors(_one_op(graph, "TfRnntJointLatticeGrad"))
    assert set(lattice_checks) <= grad_inputs


@pytest.mark.parametrize("fastemit_lambda, clamp", [(0.0, -1.0), (0.5, 0.3)])
def test_costs_and_gradients_match_reference_in_a_traced_step(fastemit_lambda, clamp):
    encoder_out, predictor_out, labels, frame_lengths, label_lengths = _inputs(1)
    joint = RNNTJoint(VOCAB, UNITS, blank=0, pad_value=PAD)
    joint([encoder_out, predictor_out, labels, frame_lengths])
    weights = tf.constant([0.5, 2.0, 1.25])
    loss = joint.loss(reduction="none", fastemit_lambda=fastemit_lambda, clamp=clamp)

    @tf.function
    def flash():
        with tf.GradientTape() as tape:
            costs = loss(tf.cast(labels, tf.float32),
                         joint([encoder_out, predictor_out, labels, frame_lengths]))
            total = tf.reduce_sum(costs * weights)
        return costs, tape.gradient(total, joint.trainable_variables)

    with tf.GradientTape() as tape:
        expected = reference.rnnt_loss(
            joint.logits(encoder_out, predictor_out), np.where(labels == PAD, 0, labels),
            frame_lengths, label_lengths, fastemit_lambda=fastemit_lambda, clamp=clamp)
        total = tf.reduce_sum(expected * weights)
    expected_grads = tape.gradient(total, joint.trainable_variables)
    costs, grads = flash()
    np.testing.assert_allclose(costs, expected, rtol=1e-5)
    for got, want, variable in zip(grads, expected_grads, joint.trainable_variables):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=variable.path)


def test_unvalidated_op_matches_validated_op():
    rng = np.random.default_rng(2)
    lattice = tf.constant(np.log(rng.uniform(0.05, 1.0, size=(3, 5, 4, 2))), tf.float32)
    logit_lengths, label_lengths = np.array([5, 1, 3]), np.array([3, 0, 2])
    results = []
    for validated in (False, True):
        with tf.GradientTape() as tape:
            tape.watch(lattice)
            costs = ops._lattice_loss(lattice, logit_lengths, label_lengths, 0.0, -1.0, "test",
                                      lengths_validated=validated)
        results.append((costs, tape.gradient(costs, lattice)))
    expected = reference.lattice_loss(lattice, logit_lengths, label_lengths)
    np.testing.assert_allclose(results[0][0], expected, rtol=1e-5)
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf.function"])
def test_lattice_without_frames_still_fails(traced):
    encoder_out, predictor_out, labels, _, label_lengths = _inputs(3)
    rng = np.random.default_rng(3)
    lattice = np.log(rng.uniform(0.05, 1.0, size=(3, 6, 5, 2))).astype(np.float32)
    marked = mark_lattice_padding(lattice, np.array([6, 0, 4]), label_lengths)

    def costs():
        return FlashRNNTLoss(reduction="none", lattice="marked")(labels.astype(np.float32),
                                                                 marked)

    with pytest.raises(tf.errors.InvalidArgumentError, match="without frames"):
        (tf.function(costs) if traced else costs)()
