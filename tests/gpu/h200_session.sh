#!/usr/bin/env bash
# Runs on the lent H200 machine (device tool), after ../shared/tools/tfgpu/prepare staged
# TensorFlow there. Carry build/gpu (the sm_90 op library built here) and .tfgpu/bin.
#   bash tests/gpu/h200_session.sh STEP...    steps run in the order given:
#     quick       GPU variants of the joint-op tests (pytest -n 8)
#     tests       the GPU variants of every op/Keras/robustness/property test file (pytest -n 8)
#     robustness  tests/gpu/robustness_gpu.py and tests/gpu/extremes_gpu.py
#     ab          flash step at "target", float32 and bfloat16, for each library in $AB_LIBS
#                 (default build/gpu_old build/gpu); methods $AB_METHODS (default tiled,untiled)
#     profile     per-kernel times (Nsight Compute) of one tiled step, $PROFILE_DTYPES (default
#                 float32 bfloat16), for each library in $PROFILE_LIBS (default build/gpu)
#     bench       benchmarks/bench_rnnt.py --suite all
#     lstm        tests/gpu/lstm_bf16_repro.py: Keras LSTM bfloat16 gradients, cuDNN or not
#     mixed       tests/gpu/mixed_bf16_check.py: where a mixed_bfloat16 training step turns NaN
#     sanitize    compute-sanitizer memcheck, racecheck, initcheck on tests/gpu/sanitizer_case.py
#     speech      start examples/speech/train.py --large on the last GPU, detached (setsid)
#     speech-wait wait for it and copy its results to $OUT
# Logs and results go to $OUT (or /tmp/out).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source .tfgpu/bin/activate
# LIB=... picks another build; every step uses it.
LIB=${LIB:-$PWD/build/gpu/tf_rnnt/_tf_rnnt_ops.so}
export TF_RNNT_LIBRARY=$LIB PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
# Memory growth only where processes share a GPU (pytest -n); benchmarks read the allocator's peak.
export TF_CPP_MIN_LOG_LEVEL=2
GPUS=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# Tests and benchmarks use GPU 0; the speech run uses the last GPU when there are two.
gpu0() { CUDA_VISIBLE_DEVICES=0 "$@"; }
for step in "$@"; do
  echo "=== $step ($(date +%T))"
  case $step in
    quick)
      TF_FORCE_GPU_ALLOW_GROWTH=true gpu0 python3 -m pytest -q -p no:cacheprovider -n 8 -k "GPU or gpu" tests/test_joint_lattice.py \
        2>&1 | tee "$OUT/pytest_quick.log" | tail -15 ;;
    tests)
      TF_FORCE_GPU_ALLOW_GROWTH=true gpu0 python3 -m pytest -q -p no:cacheprovider -n 12 tests/test_rnnt_ops.py tests/test_joint_lattice.py \
        tests/test_golden.py tests/test_keras.py tests/test_samplewise.py tests/test_robustness.py \
        tests/test_properties.py 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25 ;;
    robustness)
      gpu0 python3 tests/gpu/robustness_gpu.py 2>&1 | tee "$OUT/robustness_gpu.log" | grep -E "PASS|FAIL"
      gpu0 python3 tests/gpu/extremes_gpu.py 2>&1 | tee "$OUT/extremes_gpu.log" | grep -E "PASS|FAIL" ;;
    ab)
      for lib in ${AB_LIBS:-build/gpu_old build/gpu}; do
        echo "-- $lib"
        TF_RNNT_LIBRARY=$PWD/$lib/tf_rnnt/_tf_rnnt_ops.so gpu0 python3 benchmarks/bench_rnnt.py \
          --suite flash --profile target --methods ${AB_METHODS:-tiled,untiled} --dtypes float32,bfloat16 2>&1 \
          | grep -E "^\| target|matmul rate"
      done ;;
    profile)
      for lib in ${PROFILE_LIBS:-build/gpu}; do
        for dtype in ${PROFILE_DTYPES:-float32 bfloat16}; do
          csv="$OUT/ncu_$(basename $lib)_$dtype.csv"
          TF_RNNT_LIBRARY=$PWD/$lib/tf_rnnt/_tf_rnnt_ops.so gpu0 ncu --profile-from-start off \
            --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
            python3 benchmarks/profile_joint.py --dtype $dtype > "$csv" 2>/dev/null
          echo "-- $lib $dtype"; python3 benchmarks/profile_joint.py --summarize "$csv" | head -16
        done
      done ;;
    bench)
      gpu0 python3 benchmarks/bench_rnnt.py --suite all --out "$OUT/h200.md" 2>&1 \
        | grep -v -E "^(WARNING|I0000)" | tail -60 ;;
    lstm)
      gpu0 python3 tests/gpu/lstm_bf16_repro.py 2>&1 | grep -E "^(GPUs|mask)" ;;
    mixed)
      gpu0 python3 tests/gpu/mixed_bf16_check.py ${MIXED_ARGS:-} 2>&1 | tee "$OUT/mixed.log" \
        | grep -v -E "^(WARNING|[IWE]0000|To enable|  self.data_adapter|/.*UserWarning)" ;;
    sanitize)
      for tool in memcheck racecheck initcheck; do
        args=""; [[ $tool == racecheck ]] && args="--joint-dtypes float32"
        gpu0 compute-sanitizer --tool $tool --kernel-name kns=tf_rnnt --error-exitcode 9 \
          python3 tests/gpu/sanitizer_case.py $args > "$OUT/sanitizer_$tool.log" 2>&1
        echo "compute-sanitizer $tool exit=$? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -2 | tr '\n' ' ')"
      done ;;
    initcheck-all)
      # Every kernel instrumented (cuBLAS included), so reads of GEMM outputs are judged too.
      timeout 300 compute-sanitizer --tool initcheck --print-limit 100000 python3 tests/gpu/sanitizer_case.py \
        --dtypes float32 --joint-dtypes float32 > "$OUT/sanitizer_initcheck_all.log" 2>&1
      echo "initcheck (all kernels) exit=$?: $(grep -c 'Uninitialized' "$OUT/sanitizer_initcheck_all.log") reports, in tf_rnnt kernels: $(grep -A1 Uninitialized "$OUT/sanitizer_initcheck_all.log" | grep -c 'tf_rnnt::')" ;;
    speech)
      # The bigger speech set travels as zstd pieces (make_data.py --train 3000 --test 300).
      mkdir -p /tmp/speech
      if [[ ! -d /tmp/speech/speech_big ]]; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/zst /tmp/tfp/zstandard*.whl
        cat /tmp/tfp/sp.* | PYTHONPATH=/tmp/zst python3 -c "import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(sys.stdin.buffer, sys.stdout.buffer)" | tar x -C /tmp/speech
      fi
      # Two runs side by side on the last GPU: the --large defaults, and the same at half the
      # learning rate.
      for run in large:1e-3 large_lr5e-4:5e-4; do
        TF_FORCE_GPU_ALLOW_GROWTH=true CUDA_VISIBLE_DEVICES=$((GPUS - 1)) setsid nohup python3 examples/speech/train.py --large \
          --data /tmp/speech/speech_big --out /tmp/speech/${run%%:*} --learning-rate ${run##*:} \
          --time-limit ${SPEECH_MINUTES:-14} > /tmp/speech/${run%%:*}.log 2>&1 < /dev/null &
      done
      sleep 20; tail -2 /tmp/speech/large.log ;;
    speech-wait)
      while pgrep -f "examples/speech/train.py" > /dev/null; do sleep 10; done
      for run in large large_lr5e-4; do
        echo "-- $run"; tr '\r' '\n' < /tmp/speech/$run.log | grep -E "WER|53/53" | tail -4 | cut -c1-160
      done
      (cd /tmp/speech && tar czf "$OUT/speech_runs.tgz" *.log */results.json */history.csv */training_curve.png) ;;
  esac
done
