"""Loading the op library: at `import tf_rnnt`, so saved graphs that use the ops reload.

Each check runs in a fresh Python process, since a process loads the library once: a
SavedModel whose functions call the compiled ops reloads (and computes the same costs) in a
process that only ran `import tf_rnnt`; the first op call inside a tf.function prints no
AutoGraph "could not transform" warning; and without the library `import tf_rnnt` still works,
while calling an op raises the error that says how to build it.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from rnnt_testing import REPO_ROOT, TESTS_DIR, pythonpath

import tf_rnnt

requires_library = pytest.mark.skipif(not tf_rnnt.ops.library_available(),
                                      reason="op library not built")


def _run(script, env=None, directory=None):
    """Runs `script` in a fresh interpreter, from a file in `directory` when given (AutoGraph
    only converts functions whose source file it can read)."""
    full_env = dict(os.environ, PYTHONPATH=pythonpath(REPO_ROOT, TESTS_DIR),
                    TF_CPP_MIN_LOG_LEVEL="2")
    full_env.update(env or {})
    command = [sys.executable, "-c", textwrap.dedent(script)]
    if directory is not None:
        path = os.path.join(directory, "script.py")
        with open(path, "w") as f:
            f.write(textwrap.dedent(script))
        command = [sys.executable, path]
    result = subprocess.run(command, env=full_env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"subprocess failed:\n{result.stdout}\n{result.stderr}"
    return result


_SAVE = """
    import json, sys
    import numpy as np
    import tensorflow as tf
    import oracle
    import tf_rnnt

    # Exact GEMMs on a GPU: the joint op takes TensorFlow's TF32 setting when it is traced.
    tf.config.experimental.enable_tensor_float_32_execution(False)
    encoder, predictor, kernel, bias, labels, t_len, u_len = oracle.float32_joint_problem(
        5, (2, 4, 2, 3, 5))
    logits = oracle.joint_logits(encoder, predictor, kernel, bias).astype(np.float32)

    class Losses(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None, 3]),
                                      tf.TensorSpec([None, None, 3]), tf.TensorSpec([3, 5]),
                                      tf.TensorSpec([5]), tf.TensorSpec([None, None], tf.int32),
                                      tf.TensorSpec([None], tf.int32),
                                      tf.TensorSpec([None], tf.int32)])
        def flash(self, *args):
            return tf_rnnt.flash_rnnt_loss(*args)

        @tf.function(input_signature=[tf.TensorSpec([None, None, None, 5]),
                                      tf.TensorSpec([None, None], tf.int32),
                                      tf.TensorSpec([None], tf.int32),
                                      tf.TensorSpec([None], tf.int32)])
        def rnnt(self, *args):
            return tf_rnnt.rnnt_loss(*args)

    tf.saved_model.save(Losses(), sys.argv[1])
    np.savez(sys.argv[1] + "/inputs.npz", encoder=encoder, predictor=predictor, kernel=kernel,
             bias=bias, labels=labels, t_len=t_len, u_len=u_len, logits=logits)
"""

_LOAD = """
    import json, sys
    import numpy as np
    import tensorflow as tf
    import tf_rnnt

    tf.config.experimental.enable_tensor_float_32_execution(False)  # exact GEMMs on a GPU
    path = sys.argv[1]
    x = np.load(path + "/inputs.npz")
    module = tf.saved_model.load(path)
    joint = [tf.constant(x[k], tf.float32) for k in ("encoder", "predictor", "kernel", "bias")]
    ints = [tf.constant(x[k], tf.int32) for k in ("labels", "t_len", "u_len")]
    print(json.dumps(dict(flash=module.flash(*joint, *ints).numpy().tolist(),
                          rnnt=module.rnnt(tf.constant(x["logits"]), *ints).numpy().tolist())))
"""


@requires_library
def test_saved_model_reloads_after_import(tmp_path):
    import numpy as np
    import oracle

    path = str(tmp_path / "losses")
    _run(_SAVE.replace("sys.argv[1]", repr(path)))
    result = _run(_LOAD.replace("sys.argv[1]", repr(path)))
    costs = json.loads(result.stdout.strip().splitlines()[-1])
    problem = oracle.float32_joint_problem(5, (2, 4, 2, 3, 5))
    expected = oracle.flash_rnnt_loss(*problem)[0]
    np.testing.assert_allclose(costs["flash"], expected, rtol=1e-5)
    np.testing.assert_allclose(costs["rnnt"], expected, rtol=1e-5)


@requires_library
def test_first_op_call_in_tf_function_prints_no_autograph_warning(tmp_path):
    result = _run("""
        import tensorflow as tf
        import tf_rnnt

        @tf.function
        def cost(lattice):
            return tf_rnnt.lattice_loss(lattice, [2], [1])

        print(float(cost(tf.zeros([1, 2, 2, 2]))[0]))
    """, directory=str(tmp_path))
    assert "could not transform" not in result.stderr + result.stdout


def test_import_without_library_works_and_the_op_says_how_to_build_it(tmp_path):
    result = _run("""
        import tensorflow as tf
        import tf_rnnt
        from tf_rnnt import _loader

        assert not tf_rnnt.ops.library_available()
        try:
            tf_rnnt.lattice_loss(tf.zeros([1, 2, 2, 2]), [2], [1])
        except _loader.OpLibraryError as e:
            print("OpLibraryError", e)
    """, env={"TF_RNNT_LIBRARY": str(tmp_path / "missing.so")})
    assert "OpLibraryError" in result.stdout and "build" in result.stdout
