"""The full-logits baselines that the Keras benchmarks (and tests/keras_api/test_keras.py) set
against `RNNTJoint` + `FlashRNNTLoss`: `LogitsHead`, the `[B, T, U+1, V]` logits of an `RNNTJoint`'s
weights, and `ReferenceRNNTLoss`, `tf_rnnt.reference.rnnt_loss` on them.

Imports Keras and TensorFlow: the benchmarks import it in their worker processes only.
"""

import keras
import tensorflow as tf

from tf_rnnt import reference


@keras.saving.register_keras_serializable(package="tf_rnnt_benchmarks")
class LogitsHead(keras.layers.Layer):
    """Full logits from an RNNTJoint's weights (`joint.logits`), keeping the frame mask.

    Call: `head([encoder_out, predictor_out])`.
    """

    def __init__(self, joint, **kwargs):
        super().__init__(**kwargs)
        self.joint = joint

    def build(self, input_shape):
        self.joint.build(list(input_shape) + [(None, None)])

    def call(self, inputs, mask=None):
        return self.joint.logits(inputs[0], inputs[1])

    def compute_mask(self, inputs, mask=None):
        return None if mask is None else mask[0]

    def compute_output_shape(self, input_shape):
        return (input_shape[0][0], input_shape[0][1], input_shape[1][1], self.joint.vocab_size)


def labels_and_lengths(y_true, y_pred):
    """int32 `(labels, logit_lengths, label_lengths)` of a baseline loss' inputs: labels padded
    with -1, frame lengths from the logits' Keras mask (all frames without one)."""
    mask = getattr(y_pred, "_keras_mask", None)
    labels = tf.cast(tf.round(y_true), tf.int32)
    label_lengths = tf.reduce_sum(tf.cast(labels >= 0, tf.int32), axis=1)
    if mask is None:
        logit_lengths = tf.fill([tf.shape(y_pred)[0]], tf.shape(y_pred)[1])
    else:
        logit_lengths = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)
    return labels, logit_lengths, label_lengths


class ReferenceRNNTLoss(keras.losses.Loss):
    """tf_rnnt.reference.rnnt_loss (pure TensorFlow, autodiff) on full logits, frame lengths from
    their Keras mask: what a TensorFlow user writes today.

    Returns the per-sample costs with reduction=None, else their mean over the replica's batch
    divided by the number of replicas.
    """

    def __init__(self, blank=0, reduction="sum_over_batch_size"):
        super().__init__(name="reference_rnnt_loss", reduction=reduction)
        self.blank = blank
        self.per_sample = reduction is None

    def __call__(self, y_true, y_pred, sample_weight=None):
        labels, logit_lengths, label_lengths = labels_and_lengths(y_true, y_pred)
        costs = reference.rnnt_loss(y_pred, tf.maximum(labels, 0), logit_lengths, label_lengths,
                                    blank=self.blank)
        if self.per_sample:
            return costs
        return tf.reduce_mean(costs) / tf.distribute.get_strategy().num_replicas_in_sync
