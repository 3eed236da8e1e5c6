"""tf_rnnt.ops.check (the compiled TfRnntCheck op): passes its value through and fails with its
message (and details) eagerly, in a tf.function and under XLA, where tf.debugging is dropped."""

import numpy as np
import pytest
import tensorflow as tf

from tf_rnnt import ops as rnnt_ops


@pytest.mark.parametrize("mode", ["eager", "tf.function", "jit_compile"])
def test_check_passes_values_and_fails_with_its_message(mode):
    def run(x, ok):
        return rnnt_ops.check(x * 2.0, ok, 'a "quoted" message: {x}', data=tf.cast(x, tf.int32))
    if mode != "eager":
        run = tf.function(run, jit_compile=mode == "jit_compile")
    x = tf.constant([1.0, 3.0])
    np.testing.assert_array_equal(run(x, tf.constant([True, True])), [2.0, 6.0])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r'a "quoted" message: \{x\} \[1, 3\]'):
        run(x, tf.constant([True, False]))


def test_tf_debugging_is_dropped_under_xla_but_check_holds():
    # The reason the op exists: the same condition through tf.debugging passes under XLA.
    @tf.function(jit_compile=True)
    def debugging(x):
        tf.debugging.assert_non_negative(x, message="negative")
        return x + 1

    np.testing.assert_array_equal(debugging(tf.constant([-1])), [0])

    @tf.function(jit_compile=True)
    def checked(x):
        return rnnt_ops.check(x, x >= 0, "negative") + 1

    with pytest.raises(tf.errors.InvalidArgumentError, match="negative"):
        checked(tf.constant([-1]))


def test_gradient_is_the_upstream_gradient():
    x = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(rnnt_ops.check(x * x, True, "unused"))
    np.testing.assert_allclose(tape.gradient(y, x), [2.0, 4.0])
