#!/usr/bin/env bash
# The test command (README): sets up .venv with pinned TensorFlow 2.21, Keras 3, numpy and
# pytest, builds the op library in place (CPU kernels; CUDA kernels too when nvcc is present,
# for TF_RNNT_CUDA_ARCHS, default 90 here to keep the build short), checks that
# `pip install .` builds and loads, then runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${TF_RNNT_VENV:-.venv}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
export TF_RNNT_CUDA_ARCHS=${TF_RNNT_CUDA_ARCHS:-90}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "tensorflow==2.21.*" "keras>=3.10" numpy pytest hypothesis setuptools wheel
"$VENV/bin/python" -m pip install -q --no-build-isolation --no-deps -e .
# A regular (non-editable) install must build and load too: into a scratch target.
scratch=$(mktemp -d)
"$VENV/bin/python" -m pip install -q --no-build-isolation --no-deps --target "$scratch" .
(cd "$scratch" && PYTHONPATH="$scratch" "$OLDPWD/$VENV/bin/python" -c \
  "import tf_rnnt, tf_rnnt.ops as o; assert o.library_available(), 'installed op library does not load'; print('pip install . OK:', tf_rnnt.__file__)")
rm -rf "$scratch"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
