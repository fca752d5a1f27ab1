#!/usr/bin/env bash
# conv2d on the lent GPU in one call: per-operator smoke checks (each in its own process, so a fault or a hang
# costs one step), the GPU tests, the benchmark.
#   bash benchmarks/conv2d_session.sh smoke tests bench [sweep]
# Kernels come prebuilt, read-only and offline, from ./prebuilt (python benchmarks/bench_conv2d.py --prewarm
# sm_90a with JITOPS_CACHE_DIR=prebuilt, on any machine with nvcc): nothing compiles on the GPU machine.
# The wheels the GPU machine lacks travel in .wheels/.  Logs and JSON land in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/conv2d-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests"
export JITOPS_CACHE_DIR=/tmp/jitops-cache JITOPS_CACHE_PATH="$PWD/prebuilt" JITOPS_OFFLINE=1
export JITOPS_TEST_CACHE_PATH="$PWD/prebuilt" JITOPS_BENCH_OUT="$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
status=0
for step in "$@"; do
  case "$step" in
    smoke)
      for op in fprop dgrad wgrad; do
        timeout 60 python3 benchmarks/conv2d_smoke.py "$op" 2>&1 | tee -a "$OUT/smoke.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done ;;
    tests)
      timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_conv2d_gpu.py ${PYTEST_K:+-k "$PYTEST_K"} \
        2>&1 | tee "$OUT/gpu-tests.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    bench)
      timeout ${BENCH_TIMEOUT:-420} python3 benchmarks/bench_conv2d.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    sweep)
      timeout 420 python3 benchmarks/bench_conv2d.py --sweep --no-eager ${BENCH_ARGS:-} 2>&1 | tee "$OUT/sweep.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    *) echo "unknown step $step"; status=2 ;;
  esac
done
exit $status
