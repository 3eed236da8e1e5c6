#!/usr/bin/env bash
# Sourced by tests/run.sh and examples/run_main.sh: creates $VENV (default .venv) with the pinned
# TensorFlow 2.21, Keras 3, numpy and pytest, and builds the op library in place (CPU kernels;
# CUDA kernels too when nvcc is found, for TF_RNNT_CUDA_ARCHS, default 90 here to keep it short).
set -euo pipefail
PY=${PYTHON:-python3}
VENV=${TF_RNNT_VENV:-.venv}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
export TF_RNNT_CUDA_ARCHS=${TF_RNNT_CUDA_ARCHS:-90}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "tensorflow==2.21.*" "keras>=3.10" numpy pytest hypothesis \
  setuptools wheel "ruff==0.14.0" "clang-format==23.1.5"
"$VENV/bin/python" -m pip install -q --no-build-isolation --no-deps -e .
# TensorFlowASR's loss: a benchmark baseline only (benchmarks/tfasr_baseline.py), kept out of the
# environment's packages: its own __init__ needs Keras 2.
"$VENV/bin/python" -m pip install -q --no-deps --upgrade --target "$VENV/tfasr" "TensorFlowASR==2.1.0"
