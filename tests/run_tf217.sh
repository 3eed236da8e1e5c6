#!/usr/bin/env bash
# Second CI job: TensorFlow 2.17.1 (the newest release whose native ops tensorflow-io 0.37.1
# loads) + tensorflow-io. Builds the op library against 2.17 into build/tf217 and runs the CPU op
# tests and the speech pipeline tests (tfio decoding and resampling) there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${TF_RNNT_VENV_217:-.venv-tf217}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "tensorflow==2.17.1" "tensorflow-io==0.37.1" "keras>=3.2" \
  numpy pytest hypothesis setuptools wheel
TF_RNNT_WITH_CUDA=0 "$VENV/bin/python" custom_ops/build.py --out build/tf217/tf_rnnt/_tf_rnnt_ops.so
export TF_RNNT_LIBRARY=$PWD/build/tf217/tf_rnnt/_tf_rnnt_ops.so PYTHONPATH=$PWD
"$VENV/bin/python" -c "import tensorflow_io as tfio, tensorflow as tf; print('tensorflow', tf.__version__, 'tensorflow-io', tfio.__version__)"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/ops/test_rnnt_ops.py \
  tests/ops/test_joint_lattice.py tests/ops/test_golden.py \
  examples/speech/tests/test_speech_pipeline.py examples/speech/tests/test_export.py \
  tests/ops/test_jit.py tests/packaging/test_packaging.py "$@"
