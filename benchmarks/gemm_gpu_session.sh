#!/usr/bin/env bash
# One call on the lent GPU for jitops.gemm: build whatever ./prebuilt lacks (in parallel, on that machine's
# cores), the GPU tests, the benchmark; optionally --tune and a cold compile of one sm_90a and one sm_80
# configuration.  Kernels come prebuilt from ./prebuilt (benchmarks/prebuild_gemm.py on a GPU-less machine) as a
# read-only cache root, so normally nothing compiles there.
#   bash benchmarks/gemm_gpu_session.sh [--tune] [--cold] [--no-tests] [--no-bench]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/jitops-out}
mkdir -p "$OUT"
tune=""; tests=1; bench=1; cold=0
for arg in "$@"; do
  case "$arg" in --tune) tune=--tune ;; --no-tests) tests=0 ;; --no-bench) bench=0 ;; --cold) cold=1 ;; esac
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests" PYTHONUNBUFFERED=1 JITOPS_BENCH_OUT="$OUT"
export JITOPS_CACHE_PATH="$PWD/prebuilt" JITOPS_CACHE_DIR=/tmp/jitops-cache
export JITOPS_TEST_CACHE_PATH="$PWD/prebuilt:/tmp/jitops-cache"  # the tests' view (conftest empties the cache)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 150 python3 benchmarks/prebuild_gemm.py $tune --jobs 16 2>&1 | grep -v "cached\|compiling" | cut -c1-160
status=0
if [ $cold -eq 1 ]; then  # CPU only: runs beside the GPU work
  (timeout 500 python3 benchmarks/bench_gemm.py --cold-compile /tmp/jitops-cold > "$OUT/cold-compile.log" 2>&1 &)
fi
if [ $tests -eq 1 ]; then
  JITOPS_GEMM_STATS="$OUT/test-stats.json" timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_gemm_gpu.py 2>&1 | tee "$OUT/gemm-gpu-tests.log" | grep -v "^  \|^$" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ $bench -eq 1 ]; then
  timeout 210 python3 benchmarks/bench_gemm.py $tune 2>&1 | tee "$OUT/bench-gemm.log" | grep -v "^  gemm\|^  tune" | tail -45
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  grep "^  tune" "$OUT/bench-gemm.log" | sort | tail -80
fi
if [ $cold -eq 1 ]; then
  for _ in $(seq 100); do grep -q cold_compile_seconds "$OUT/cold-compile.log" 2>/dev/null && break; sleep 3; done
  cat "$OUT/cold-compile.log"
fi
echo "jitops stats of the test run: $(cat "$OUT/test-stats.json" 2>/dev/null)"
exit $status
