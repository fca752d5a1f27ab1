#!/usr/bin/env bash
# One call on the lent GPU machine: install what it lacks, run the GPU tests, run the benchmarks.
#   bash benchmarks/gpu_session.sh [tests] [bench NAME...] [notebooks]     (default: tests and every benchmark)
# The machine has torch, CuPy, NVRTC, Triton and nvcc but no nvidia-cutlass or platformdirs, and no network:
# their wheels travel in .wheels/ (carry it).  Results land in $OUT (or /tmp/jitops-out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/jitops-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests"
export JITOPS_CACHE_DIR=${JITOPS_CACHE_DIR:-/tmp/jitops-cache}
export JITOPS_BENCH_OUT="$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__)"

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests bench)
status=0
i=0
while [ $i -lt ${#steps[@]} ]; do
  step=${steps[$i]}
  case "$step" in
    tests)
      python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu-tests.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    bench)
      names=()
      while [ $((i + 1)) -lt ${#steps[@]} ] && [[ "${steps[$((i + 1))]}" != tests && "${steps[$((i + 1))]}" != bench && "${steps[$((i + 1))]}" != notebooks ]]; do
        i=$((i + 1)); names+=("${steps[$i]}")
      done
      [ ${#names[@]} -eq 0 ] && names=($(ls benchmarks/bench_*.py | xargs -n1 basename | sed 's/^bench_//; s/\.py$//'))
      for name in "${names[@]}"; do
        echo "=== benchmark $name"
        python3 "benchmarks/bench_$name.py" 2>&1 | tee "$OUT/bench-$name.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done ;;
    notebooks)
      python3 -m pytest -q -p no:cacheprovider tests/test_notebooks.py 2>&1 | tee "$OUT/notebooks.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    *) echo "unknown step $step"; status=2 ;;
  esac
  i=$((i + 1))
done
exit $status
