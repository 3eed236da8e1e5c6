"""The start of a child script that loads a SavedModel in a process that cannot import
tf_rnnt: it lists the ops of the SavedModel's graphs that this process has no kernel
registration for (`unregistered`) and loads the model (`model`). Its argv: the SavedModel's
folder, then an .npz file of audio. Also the parent's side: running such a child, and the tokens
the Keras model gives, to compare the child's with."""

import json
import os
import subprocess
import sys
import textwrap

import pipeline
import tensorflow as tf

from tf_rnnt import decoding

PREAMBLE = textwrap.dedent(r'''
    import importlib.abc, json, os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"

    class NoTfRnnt(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "tf_rnnt" or name.startswith("tf_rnnt."):
                raise ImportError("this process must not import tf_rnnt")
            return None

    sys.meta_path.insert(0, NoTfRnnt())
    import numpy as np
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow.python.framework import op_def_registry

    export_dir, audio_file = sys.argv[1], sys.argv[2]
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    ops = set()
    for graph in proto.meta_graphs:
        ops |= {node.op for node in graph.graph_def.node}
        for function in graph.graph_def.library.function:
            ops |= {node.op for node in function.node_def}
    unregistered = sorted(op for op in ops if op_def_registry.get(op) is None)

    model = tf.saved_model.load(export_dir)
''')


def keras_greedy_tokens(encoder, predictor, joint, audio, frame_lengths_fn):
    """`{"u<i>": labels}` of the Keras model's batched greedy decoding of each `audio[i]`.

    As a user of the Keras model would: features, encoder, greedy search, in a graph (eager and
    graph execution may round differently). `frame_lengths_fn` maps feature to frame lengths.
    """

    @tf.function
    def keras_greedy(audio):
        feats = pipeline.log_mel(audio)
        lengths = tf.shape(feats)[1:2]
        frames = encoder([feats, lengths])
        start = decoding.greedy_initial_state(predictor.step, predictor.initial_state(1))
        tokens, _ = decoding.greedy_search(frames, frame_lengths_fn(lengths), start,
                                           decoding.joint_fn_from_layer(joint), predictor.step)
        return tokens

    return {f"u{i}": [int(t) for t in keras_greedy(tf.constant(a[None]))[0]
                      if t != decoding.NO_TOKEN]
            for i, a in enumerate(audio)}


def run_child(child, export_dir, audio_file, cwd):
    """The JSON report of script `child` run on a SavedModel, in a process that cannot import
    tf_rnnt; asserts that it ran, did not load tf_rnnt and found every op registered."""
    env = dict(os.environ)
    # Keep PYTHONPATH entries that hold other packages (e.g. TensorFlow), drop those holding
    # tf_rnnt.
    kept = [p for p in env.pop("PYTHONPATH", "").split(os.pathsep)
            if p and not os.path.isdir(os.path.join(p, "tf_rnnt"))]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    proc = subprocess.run([sys.executable, "-c", child, export_dir, audio_file],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not report["tf_rnnt_loaded"]
    assert report["unregistered"] == [] and report["num_ops"] > 0
    return report
