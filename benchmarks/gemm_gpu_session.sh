#!/usr/bin/env bash
# One call on the lent GPU for jitops.gemm: GPU tests, the benchmark (and --tune), and a cold compile of one
# sm_90a and one sm_80 configuration on that machine, all in one run.  Kernels come prebuilt from ./prebuilt
# (benchmarks/prebuild_gemm.py on a GPU-less machine) as a read-only cache root, so nothing else compiles there;
# JITOPS_RECORD lists any kernel that did.
#   bash benchmarks/gemm_gpu_session.sh [--tune] [--no-tests] [--no-bench] [--no-cold]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/jitops-out}
mkdir -p "$OUT"
tune=""; tests=1; bench=1; cold=1
for arg in "$@"; do
  case "$arg" in --tune) tune=--tune ;; --no-tests) tests=0 ;; --no-bench) bench=0 ;; --no-cold) cold=0 ;; esac
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests" PYTHONUNBUFFERED=1 JITOPS_BENCH_OUT="$OUT"
export JITOPS_CACHE_PATH="$PWD/prebuilt" JITOPS_CACHE_DIR=/tmp/jitops-cache JITOPS_RECORD="$OUT/compiled-here.jsonl"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
status=0
if [ $cold -eq 1 ]; then  # CPU only: runs beside the GPU work
  (JITOPS_RECORD= timeout 500 python3 benchmarks/bench_gemm.py --cold-compile /tmp/jitops-cold > "$OUT/cold-compile.log" 2>&1 &)
fi
if [ $tests -eq 1 ]; then
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm_gpu.py 2>&1 | tee "$OUT/gemm-gpu-tests.log" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [ $bench -eq 1 ]; then
  timeout 210 python3 benchmarks/bench_gemm.py $tune 2>&1 | tee "$OUT/bench-gemm.log" | grep -v "^  gemm\|^  tune" | tail -60
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  grep "^  tune" "$OUT/bench-gemm.log" | sort | tail -80
fi
if [ $cold -eq 1 ]; then
  for _ in $(seq 100); do grep -q cold_compile_seconds "$OUT/cold-compile.log" 2>/dev/null && break; sleep 3; done
  cat "$OUT/cold-compile.log"
fi
echo "kernels compiled on this machine: $(cat "$OUT/compiled-here.jsonl" 2>/dev/null | wc -l)"
exit $status
