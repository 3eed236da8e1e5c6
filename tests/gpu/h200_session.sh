#!/usr/bin/env bash
# Runs on the lent H200 machine (device tool), after ../shared/tools/tfgpu/prepare staged
# TensorFlow there. Carry build/gpu (the sm_90 op library built here) and .tfgpu/bin.
#   bash tests/gpu/h200_session.sh tests|robustness|bench|sanitize|all
# Logs and results go to $OUT (or /tmp/out).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source .tfgpu/bin/activate
export TF_RNNT_LIBRARY=$PWD/build/gpu/tf_rnnt/_tf_rnnt_ops.so PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
export TF_CPP_MIN_LOG_LEVEL=2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
what=${1:-all}; shift || true
if [[ $what == tests || $what == all ]]; then
  python3 -m pytest -q -p no:cacheprovider -x "$@" tests/test_rnnt_ops.py tests/test_joint_lattice.py \
    tests/test_golden.py tests/test_keras.py tests/test_samplewise.py tests/test_robustness.py \
    tests/test_properties.py 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25
fi
if [[ $what == robustness || $what == all ]]; then
  python3 tests/gpu/robustness_gpu.py 2>&1 | grep -E "PASS|FAIL"
  python3 tests/gpu/extremes_gpu.py 2>&1 | grep -E "PASS|FAIL"
fi
if [[ $what == bench || $what == all ]]; then
  python3 benchmarks/bench_rnnt.py --suite all --out "$OUT/h200.md" 2>&1 | grep -v -E "^(WARNING|I0000)" | tail -60
fi
if [[ $what == sanitize || $what == all ]]; then
  for tool in memcheck racecheck initcheck; do
    compute-sanitizer --tool $tool --kernel-name kns=tf_rnnt --error-exitcode 9 \
      python3 tests/gpu/sanitizer_case.py > "$OUT/sanitizer_$tool.log" 2>&1
    echo "compute-sanitizer $tool exit=$? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -2 | tr '\n' ' ')"
  done
fi
