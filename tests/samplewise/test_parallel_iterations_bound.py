"""samplewise_rnnt_loss's parallel_iterations: bounded (TensorFlow reserves memory for every
potential iteration of a while loop), lowered to a static batch, results unchanged."""

import subprocess
import sys

import numpy as np
import oracle
import pytest
import tensorflow as tf

import tf_rnnt
from tf_rnnt.samplewise import MAX_PARALLEL_ITERATIONS


def _problem(seed=0, batch=2, frames=4, labels=2, hidden=3, vocab=5):
    rng = np.random.default_rng(seed)
    return dict(
        encoder=rng.normal(size=(batch, frames, hidden)).astype(np.float32),
        predictor=rng.normal(size=(batch, labels + 1, hidden)).astype(np.float32),
        kernel=rng.normal(size=(hidden, vocab)).astype(np.float32),
        bias=rng.normal(size=(vocab,)).astype(np.float32),
        labels=rng.integers(1, vocab, size=(batch, labels)).astype(np.int32),
        logit_lengths=np.array([frames, frames - 1][:batch], np.int32),
        label_lengths=np.array([labels, labels - 1][:batch], np.int32))


def test_huge_parallel_iterations_is_rejected_without_allocating():
    # Run in a child: before the bound, this allocated per potential iteration until killed.
    code = ("import numpy as np, tf_rnnt\n"
            "z = np.zeros\n"
            "try:\n"
            "    tf_rnnt.samplewise_rnnt_loss(z((1, 2, 2), 'f4'), z((1, 2, 2), 'f4'), "
            "z((2, 3), 'f4'), z(3, 'f4'), np.ones((1, 1), 'i4'), [2], [1], "
            "parallel_iterations=2**31 - 1)\n"
            "except ValueError as e:\n"
            "    print('REJECTED', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "REJECTED" in out.stdout and "parallel_iterations" in out.stdout


@pytest.mark.parametrize("parallel_iterations", [1, 7, MAX_PARALLEL_ITERATIONS])
def test_bounded_values_give_the_oracle_costs(parallel_iterations):
    p = _problem()
    costs = tf_rnnt.samplewise_rnnt_loss(**p, parallel_iterations=parallel_iterations)
    expected = oracle.flash_rnnt_loss(*(p[k].astype(np.float64) for k in (
        "encoder", "predictor", "kernel", "bias")), p["labels"], p["logit_lengths"],
        p["label_lengths"])[0]
    np.testing.assert_allclose(costs, expected, rtol=1e-5)


def test_above_the_maximum_is_rejected_with_the_bound():
    p = _problem()
    with pytest.raises(ValueError, match=r"parallel_iterations.*4096"):
        tf_rnnt.samplewise_rnnt_loss(**p, parallel_iterations=MAX_PARALLEL_ITERATIONS + 1)


def test_a_value_above_the_static_batch_is_lowered_to_it():
    p = {k: tf.constant(v) for k, v in _problem().items()}
    concrete = tf.function(lambda: tf_rnnt.samplewise_rnnt_loss(
        **p, parallel_iterations=MAX_PARALLEL_ITERATIONS)).get_concrete_function()
    graph_def = concrete.graph.as_graph_def()
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    loops = [n.attr["parallel_iterations"].i for n in nodes
             if n.op in ("While", "StatelessWhile") and "samplewise_batch_loop" in n.name]
    assert loops == [2]  # the batch
