#!/usr/bin/env bash
# Wheel job: builds the binary wheel for TensorFlow 2.21 (scripts/build_wheel.sh: CUDA kernels
# for sm_80/86/89/90 + PTX), installs it with its `tensorflow` extra into a clean virtualenv,
# and, with no nvcc on PATH, checks its build record and GPU kernel registrations and runs the
# CPU test suite against the installed wheel: the tests (tests/, the examples and benchmarks with
# their tests, the shared conftest.py, pyproject.toml's pytest settings and the README, whose
# examples a test runs) are copied to a scratch directory that has no tf_rnnt/ source package.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TF_MINOR=${TF_RNNT_WHEEL_TF:-2.21}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

start=$SECONDS
bash scripts/build_wheel.sh "$TF_MINOR" "$work/dist"
echo "run_wheel.sh: wheel built in $((SECONDS - start)) s"
wheel=$(ls "$work"/dist/tf_rnnt-*.whl)

"$PY" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip
"$work/venv/bin/python" -m pip install -q "$wheel[tensorflow,test]"

no_nvcc_path=$(echo "$PATH" | tr ':' '\n' | while read -r dir; do
  [ -n "$dir" ] && [ ! -e "$dir/nvcc" ] && printf '%s:' "$dir"; done)
mkdir "$work/run"
cp -r tests examples benchmarks conftest.py pyproject.toml README.md "$work/run/"
cd "$work/run"
env -u CUDA_HOME -u CUDA_PATH -u PYTHONPATH -u TF_RNNT_LIBRARY PATH="$work/venv/bin:$no_nvcc_path" \
  TF_RNNT_EXPECT_WHEEL=1 bash -c '
set -euo pipefail
if command -v nvcc; then echo "nvcc still on PATH" >&2; exit 1; fi
python - <<PY
import json, os, tf_rnnt
from tf_rnnt import _loader
assert "site-packages" in tf_rnnt.__file__, tf_rnnt.__file__
assert tf_rnnt.library_available()
info = tf_rnnt.build_info()
print("installed:", tf_rnnt.__file__)
print("build_info:", json.dumps(info, sort_keys=True))
missing = [op for op in _loader.OPS if op not in _loader.gpu_kernel_ops()]
assert info["cuda"] and not missing, ("ops without GPU kernels", missing)
PY
exec python -m pytest -q -p no:cacheprovider tests examples benchmarks "$@"
' run_wheel "$@"
