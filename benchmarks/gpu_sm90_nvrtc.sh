#!/usr/bin/env bash
# On the lent GPU: jitops.gemm's NVRTC-built sm_90a kernels against the nvcc builds, and their cold compiles.
#
#   bash benchmarks/gpu_sm90_nvrtc.sh [probe] [build] [tests] [options] [families] [bench]
#
# Run from a checkout whose .wheels/ (nvidia-cutlass, platformdirs) is at WHEELS (default: ../../.wheels, the
# main checkout when this runs in a worktree) and whose build/prebuilt.tar.gz holds the prebuilt kernels
# (cache_tools export of `prebuild_gemm.py --probe-sm90`: the nvcc references, which are never compiled here).
#   probe     probe_sm90_nvrtc.py: bit for bit, kernel time NVRTC vs nvcc build, host time per call
#   build-probe  prebuild_gemm.py --probe-sm90 --only nvrtc --jobs 16: the probe's NVRTC kernels (one wave), timed
#   build     prebuild_gemm.py --jobs 16: every gemm kernel the GPU tests load, through NVRTC, timed
#   export    what this call compiled, as $OUT/built.tar.gz (carry it as build/built.tar.gz next time)
#   tests     tests/test_gemm_gpu.py
#   options   probe_nvrtc_options.py: where the compile time goes, and which options shorten it
#   options-bg   the same in the background (CPU only: beside the GPU tests, not beside timings); wait: for it
#   families  bench_jit_latency.py --cold-compile: one kernel per CUTLASS family, one at a time
#   bench     bench_gemm.py (the six shapes against torch.matmul)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/jitops-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "${WHEELS:-../../.wheels}"/*.whl || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests:$PWD/benchmarks" PYTHONUNBUFFERED=1 JITOPS_BENCH_OUT="$OUT"
export JITOPS_CACHE_DIR=/tmp/jitops-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
python3 -c "from jitops.backends import toolkit as t; print('nvrtc', t.nvrtc_identity(), t.cuda_headers().identity)"
for archive in build/prebuilt.tar.gz build/built.tar.gz; do
  [ -f "$archive" ] || continue
  python3 -m cache_tools --cache-dir /tmp/jitops-prebuilt import "$archive" > "$OUT/import.log" 2>&1 \
    || tail -5 "$OUT/import.log"
  export JITOPS_CACHE_PATH=/tmp/jitops-prebuilt JITOPS_TEST_CACHE_PATH=/tmp/jitops-prebuilt
done
status=0
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(probe build tests)
for step in "${steps[@]}"; do
  echo "=== $step $(date +%T)"
  case "$step" in
    probe) python3 benchmarks/probe_sm90_nvrtc.py 2>&1 | tee "$OUT/probe.log"; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    build-probe) start=$SECONDS
                 python3 benchmarks/prebuild_gemm.py --probe-sm90 --only nvrtc --jobs 16 > "$OUT/build-probe.log" 2>&1 \
                   || status=1
                 grep -E "kernels:|compiled|FAILED" "$OUT/build-probe.log"; echo "build-probe wall $((SECONDS - start)) s" ;;
    export) env -u JITOPS_CACHE_PATH python3 -m cache_tools --cache-dir "$JITOPS_CACHE_DIR" export "$OUT/built.tar.gz" \
              > "$OUT/export.log" 2>&1 || { status=1; tail -3 "$OUT/export.log"; }; ls -la "$OUT/built.tar.gz" ;;
    build) start=$SECONDS
           python3 benchmarks/prebuild_gemm.py --jobs 16 > "$OUT/build.log" 2>&1 || status=1
           grep -E "kernels:|FAILED" "$OUT/build.log"; grep -c compiled "$OUT/build.log"
           echo "build wall $((SECONDS - start)) s" ;;
    tests) python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gemm_gpu.py 2>&1 | tee "$OUT/tests.log" | tail -15
           [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    options) python3 benchmarks/probe_nvrtc_options.py 2>&1 | tee "$OUT/options.log" | tail -12 ;;
    options-bg) python3 benchmarks/probe_nvrtc_options.py > "$OUT/options.log" 2>&1 &
                options_pid=$! ;;
    wait) [ -n "${options_pid:-}" ] && wait "$options_pid"; tail -12 "$OUT/options.log" ;;
    families) python3 benchmarks/bench_jit_latency.py --cold-compile gemm_sm90,gemm_sm80 2>&1 | tail -6 ;;
    bench) python3 benchmarks/bench_gemm.py 2>&1 | tee "$OUT/bench.log" | tail -30 ;;
    *) echo "unknown step $step"; status=2 ;;
  esac
done
exit $status
