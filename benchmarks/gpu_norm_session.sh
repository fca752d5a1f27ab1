#!/usr/bin/env bash
# One call on the lent GPU for gelu and layer_norm: their GPU tests, then the named benchmark steps.
#   bash benchmarks/gpu_norm_session.sh [tests] [ln-tests] [gelu-sweep] [ln-sweep] [gelu] [ln] [latency]
# Kernels prebuilt on a GPU-less machine (benchmarks/prebuild_norm.py) are read from ./prebuilt when present
# (a read-only root: builds by another NVRTC are accepted).  Logs and JSON land in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/jitops-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD:$PWD/tests" JITOPS_CACHE_DIR=/tmp/jitops-cache \
  JITOPS_TEST_CACHE=/tmp/jitops-test-cache JITOPS_BENCH_OUT="$OUT"
if [ -d prebuilt ]; then export JITOPS_CACHE_PATH="$PWD/prebuilt" JITOPS_TEST_CACHE_PATH="$PWD/prebuilt"; fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
status=0
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  local started=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1 || { echo "!!! $name failed or timed out (rc $?)"; status=1; }
  echo "=== $name: $((SECONDS - started)) s"
}
for step in "${@:-tests}"; do
  case "$step" in
    tests) run tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_layer_norm_gpu.py \
             tests/test_gelu_gpu.py tests/test_gpu_core.py \
             -k "layer_norm or gelu_cuda_tiles or gelu_backward_op or misaligned or stream or thread" ;;
    ln-tests) run ln-tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_layer_norm_gpu.py ;;
    gelu-sweep) run gelu-sweep 120 python3 benchmarks/bench_gelu.py --sweep ;;
    ln-sweep) run ln-sweep 120 python3 benchmarks/bench_layer_norm.py --sweep ;;
    gelu) run gelu 150 python3 benchmarks/bench_gelu.py ;;
    ln) run ln 240 python3 benchmarks/bench_layer_norm.py ;;
    latency) JITOPS_LATENCY_REPEATS=${JITOPS_LATENCY_REPEATS:-1} run latency 120 \
               python3 benchmarks/bench_jit_latency.py --methods jitops,layer_norm ;;
    *) echo "unknown step $step"; status=2 ;;
  esac
done
exit $status
