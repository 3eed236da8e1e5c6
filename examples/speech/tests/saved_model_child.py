"""The start of a child script that loads a SavedModel in a process that cannot import
tf_rnnt: it lists the ops of the SavedModel's graphs that this process has no kernel
registration for (`unregistered`) and loads the model (`model`). Its argv: the SavedModel's
folder, then an .npz file of audio."""

import textwrap

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
