#!/usr/bin/env bash
# GPU checks of tf_rnnt, for any machine with a CUDA GPU and TensorFlow installed.
#   bash tests/gpu/run.sh STEP...      steps run in the order given; run from the checkout root
# Steps:
#   build       python custom_ops/build.py: the in-tree library, CUDA kernels included (needs nvcc)
#   core        custom_ops/tests/core_test on the GPU: the CUDA launchers against float64 brute
#               force, no TensorFlow in the process (built by build.py --tests where nvcc is
#               found, else taken from build/tests/core_test as built elsewhere); cuBLAS from
#               $TF_RNNT_CUBLAS, default the nvidia-cublas wheel's libcublas.so.*
#   timing      build/tests/joint_timing: the CUDA launchers timed without TensorFlow, the
#               cuBLAS path against both fused tile kernels ($TIMING_DTYPES, $TIMING_ARGS)
#   tests       the test suite ($TEST_FILES, default "tests examples benchmarks": every test
#               folder) with GPU memory growth, so that pytest-xdist workers share the GPU
#               (PYTEST_ARGS="-n 8"; "-k gpu" keeps mostly the GPU variants)
#   robustness  tests/gpu/robustness_gpu.py: long lattices, logits ~1e4 in half precision,
#               concurrency, out-of-memory errors, determinism
#   xla         tests/gpu/xla_gpu_check.py: each op under XLA (jit_compile) against no XLA, and a
#               Keras model trained with jit_compile=True
#   sanitize    compute-sanitizer memcheck, racecheck and initcheck on tests/gpu/sanitizer_case.py,
#               memcheck on the core test, and all three on its fused-kernel cases
#   bench       benchmarks/bench_rnnt.py --suite all (results in $OUT/bench.md)
#   tdt         Flash TDT beside Flash RNN-T: joint_timing --durations 5, and
#               benchmarks/bench_rnnt.py --loss tdt ($TDT_METHODS, default tiled,untiled)
#   profile     per-kernel times (Nsight Compute) of one tiled step, for $PROFILE_DTYPES
#               (default "float32 bfloat16")
#   ab          the flash step at the "medium" profile for each library in $AB_LIBS (paths of
#               _tf_rnnt_ops*.so files), methods $AB_METHODS (default tiled,untiled)
# Environment: PYTHON (default python3); TF_RNNT_LIBRARY picks the op library (default: the
# in-tree tf_rnnt/_tf_rnnt_ops.so if built, else the installed package's); OUT (default /tmp/out)
# receives the logs; PYTEST_ARGS is added to the pytest command (e.g. "-n 8" with pytest-xdist).
# Exit status: non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
if [[ -z ${TF_RNNT_LIBRARY:-} ]] && compgen -G "tf_rnnt/_tf_rnnt_ops*.so" > /dev/null; then
  TF_RNNT_LIBRARY=$(ls tf_rnnt/_tf_rnnt_ops*.so | head -1)
  export TF_RNNT_LIBRARY=$PWD/$TF_RNNT_LIBRARY
fi
echo "op library: ${TF_RNNT_LIBRARY:-that of the installed tf_rnnt package}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# Everything runs on GPU 0.
gpu0() { CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} "$@"; }
# The cuBLAS library TensorFlow uses (the nvidia-cublas wheel), for the TensorFlow-free core test.
cublas_path() {
  "$PYTHON" - <<'EOF'
import glob, os
try:
    import nvidia.cublas
    roots = list(nvidia.cublas.__path__)
except ImportError:
    roots = []
hits = [p for r in roots for p in sorted(glob.glob(os.path.join(r, "lib", "libcublas.so.*")))
        if "Lt" not in os.path.basename(p)]
print(hits[0] if hits else "")
EOF
}
status=0
fail() { echo "FAILED: $1"; status=1; }
for step in "$@"; do
  echo "=== $step ($(date +%T))"
  case $step in
    build)
      "$PYTHON" custom_ops/build.py || fail build
      export TF_RNNT_LIBRARY=$PWD/$(ls tf_rnnt/_tf_rnnt_ops*.so | head -1) ;;
    core)
      # Without nvcc here, a core_test built elsewhere (build.py --tests) must be in build/tests.
      if command -v nvcc > /dev/null || [[ -x ${CUDA_HOME:-/nonexistent}/bin/nvcc ]]; then
        "$PYTHON" custom_ops/build.py --tests > "$OUT/core_build.log" 2>&1 \
          || { tail -20 "$OUT/core_build.log"; fail core; continue; }
      fi
      [[ -x build/tests/core_test ]] || { fail "core (no nvcc and no build/tests/core_test)"; continue; }
      # On compute capability 9.0 the fused tile kernels must run, not be skipped.
      cap=$(gpu0 nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1)
      fused_required=0; [[ $cap == 9.0 ]] && fused_required=1
      TF_RNNT_CUBLAS=${TF_RNNT_CUBLAS:-$(cublas_path)} TF_RNNT_CORE_TEST_REQUIRE_GPU=1 \
        TF_RNNT_CORE_TEST_REQUIRE_FUSED=$fused_required \
        gpu0 build/tests/core_test > "$OUT/core_test.log" 2>&1 || fail core
      grep -E "FAIL|SKIPPED|^CPU:|^GPU:|PASSED" "$OUT/core_test.log" ;;
    tdt)
      # Flash TDT beside Flash RNN-T: the launchers without TensorFlow (a TDT joint of 5
      # durations on the cuBLAS path), then bench_rnnt.py's tdt suite ($OUT/tdt.md and .json).
      [[ -x build/tests/joint_timing ]] || { fail "tdt (no build/tests/joint_timing)"; continue; }
      for dtype in bfloat16 float32; do
        for lengths in full ragged; do
          TF_RNNT_CUBLAS=${TF_RNNT_CUBLAS:-$(cublas_path)} gpu0 build/tests/joint_timing \
            --dtype "$dtype" --lengths "$lengths" --durations 5 --kernels cublas,untiled 2>&1 \
            | tee -a "$OUT/tdt_timing.log" || fail "tdt timing $dtype $lengths"
        done
      done
      gpu0 "$PYTHON" benchmarks/bench_rnnt.py --loss tdt --methods "${TDT_METHODS:-tiled,untiled}" \
        --out "$OUT/tdt.md" > "$OUT/tdt_bench.log" 2>&1 || fail "tdt benchmark"
      grep -E '^\|' "$OUT/tdt.md" ;;
    timing)
      # The CUDA launchers without TensorFlow, cuBLAS path against the fused kernels.
      [[ -x build/tests/joint_timing ]] || { fail "timing (no build/tests/joint_timing)"; continue; }
      for dtype in ${TIMING_DTYPES:-bfloat16 float16}; do
        for lengths in full ragged; do
          TF_RNNT_CUBLAS=${TF_RNNT_CUBLAS:-$(cublas_path)} gpu0 build/tests/joint_timing \
            --dtype "$dtype" --lengths "$lengths" ${TIMING_ARGS:-} 2>&1 | tee -a "$OUT/timing.log" \
            || fail "timing $dtype $lengths"
        done
      done ;;
    tests)
      TF_FORCE_GPU_ALLOW_GROWTH=true gpu0 "$PYTHON" -m pytest -q -rs -p no:cacheprovider \
        ${PYTEST_ARGS:-} ${TEST_FILES:-tests examples benchmarks} 2>&1 \
        | tee "$OUT/pytest_gpu.log" | tail -40
      [[ ${PIPESTATUS[0]} == 0 ]] || fail tests ;;
    robustness)
      gpu0 "$PYTHON" tests/gpu/robustness_gpu.py > "$OUT/robustness_gpu.log" 2>&1 || fail robustness
      grep -E "^(PASS|FAIL|ALL|FAILED)" "$OUT/robustness_gpu.log" ;;
    xla)
      gpu0 "$PYTHON" tests/gpu/xla_gpu_check.py > "$OUT/xla_gpu_check.log" 2>&1 || fail xla
      grep -E "^(PASS|FAIL|ALL|FAILED|keras|library)" "$OUT/xla_gpu_check.log" ;;
    sanitize)
      for tool in memcheck racecheck initcheck; do
        # initcheck does not see what cuBLAS's GEMMs write: it flags the float32 joint's reads
        # of the logits tile cuBLAS wrote. There the joint runs in 16-bit dtypes only (the
        # fused kernels' on Hopper); memcheck and racecheck run the float32 joint too.
        args=""; [[ $tool == racecheck ]] && args="--joint-dtypes float32"
        [[ $tool == initcheck ]] && args="--joint-dtypes float16,bfloat16"
        gpu0 compute-sanitizer --tool $tool --kernel-name kns=tf_rnnt --error-exitcode 9 \
          "$PYTHON" tests/gpu/sanitizer_case.py $args > "$OUT/sanitizer_$tool.log" 2>&1 || fail "sanitize $tool"
        echo "compute-sanitizer $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -2 | tr '\n' ' ')"
      done
      if [[ -x build/tests/core_test ]]; then
        TF_RNNT_CUBLAS=${TF_RNNT_CUBLAS:-$(cublas_path)} gpu0 compute-sanitizer --tool memcheck \
          --kernel-name kns=tf_rnnt --error-exitcode 9 build/tests/core_test \
          > "$OUT/sanitizer_core_test.log" 2>&1 || fail "sanitize core_test"
        echo "compute-sanitizer memcheck core_test: $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer_core_test.log" | tail -1)"
        # The fused-kernel cases alone: initcheck cannot see what cuBLAS writes, and only the
        # fused path never reads a buffer that cuBLAS alone wrote.
        for tool in memcheck initcheck; do
          log="$OUT/sanitizer_core_test_fused_$tool.log"
          TF_RNNT_CUBLAS=${TF_RNNT_CUBLAS:-$(cublas_path)} TF_RNNT_CORE_TEST_FUSED_ONLY=1 \
            gpu0 compute-sanitizer --tool $tool --kernel-name kns=tf_rnnt --error-exitcode 9 \
            build/tests/core_test > "$log" 2>&1 || fail "sanitize core_test fused $tool"
          echo "compute-sanitizer $tool core_test fused: $(grep -E '^GPU:' "$log") $(grep -E 'ERROR SUMMARY' "$log" | tail -1)"
        done
        # racecheck over every kernel, the fused cases alone: with a kernel filter it stops at the
        # fused launches ("Internal Sanitizer Error"). Only hazards in tf_rnnt's kernels count;
        # cuBLAS's own GEMM kernels report some.
        log="$OUT/sanitizer_core_test_fused_racecheck.log"
        TF_RNNT_CUBLAS=${TF_RNNT_CUBLAS:-$(cublas_path)} TF_RNNT_CORE_TEST_FUSED_ONLY=1 \
          gpu0 compute-sanitizer --tool racecheck --print-limit 100000 build/tests/core_test \
          > "$log" 2>&1 || fail "sanitize core_test fused racecheck"
        # A hazard is two lines: "Race reported between ... access at <kernel>" and "and ...".
        ours=$(awk '/Race reported/ {r = $0; next}
          r != "" {if ((r $0) ~ /tf_rnnt/) n++; r = ""} END {print n + 0}' "$log")
        others=$(grep -c 'Race reported' "$log")
        grep -q 'Internal Sanitizer Error' "$log" && fail "racecheck: internal error"
        [[ $ours == 0 ]] || fail "racecheck: hazards in tf_rnnt kernels"
        echo "compute-sanitizer racecheck core_test fused: $(grep -E '^GPU:' "$log"); hazards in tf_rnnt kernels: $ours, in all kernels: $others"
      fi ;;
    bench)
      gpu0 "$PYTHON" benchmarks/bench_rnnt.py --suite all --out "$OUT/bench.md" 2>&1 \
        | grep -v -E "^(WARNING|I0000)" | tail -60
      [[ ${PIPESTATUS[0]} == 0 ]] || fail bench ;;
    profile)
      for dtype in ${PROFILE_DTYPES:-float32 bfloat16}; do
        csv="$OUT/ncu_$dtype.csv"
        gpu0 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \
          --csv --page raw "$PYTHON" benchmarks/profile_joint.py --dtype "$dtype" > "$csv" 2>/dev/null \
          || fail "profile $dtype"
        echo "-- $dtype"; "$PYTHON" benchmarks/profile_joint.py --summarize "$csv" --top 14
      done ;;
    ab)
      for lib in ${AB_LIBS:?set AB_LIBS to the op libraries to compare}; do
        echo "-- $lib"
        TF_RNNT_LIBRARY=$(realpath "$lib") gpu0 "$PYTHON" benchmarks/bench_rnnt.py --suite flash \
          --profile medium --methods "${AB_METHODS:-tiled,untiled}" --dtypes float32,bfloat16 2>&1 \
          | grep -E "^\| medium|matmul rate"
      done ;;
    *)
      fail "unknown step $step (see the header of $0)" ;;
  esac
done
exit $status
