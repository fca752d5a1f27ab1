#!/usr/bin/env bash
# One call on the lent GPU machine: install what it lacks, run the GPU tests, run the benchmarks.
#   bash benchmarks/gpu_session.sh [prebuilt] [build-gemm] [prewarm-models] [smoke] [notebooks-bg] [tests] [wait]
#                                  [bench NAME...] [notebooks]  (default: tests and every benchmark)
# prebuilt: import every archive in .prebuilt-pack/ (cache_tools export archives of the CUTLASS ops' kernels, made on
#   a GPU-less machine or by an earlier call here; conv2d's, gemm's and grouped_gemm's were 47 MB on 2026-11-22, under
#   the 64 MiB a call carries with the tree) into one root that the GPU tests and benchmarks read, so nvcc runs
#   nowhere here.
# build-gemm: build jitops.gemm's sm_90a kernels here instead (16 cores: about 3 minutes, against an hour or more
#   on the 2-core development box), those the tests and bench_gemm.py load and, in a second root, the other
#   candidates of bench_gemm.py --tune; both are exported to $OUT (gemm.tar.gz, gemm-tune.tar.gz) to be carried
#   in .prebuilt-pack/ next time.
# prewarm-models: build the kernels of bench_models.py's models ($MODELS, comma-separated, default all), listed from
#   a step on meta tensors, with every core; exported to $OUT/models-kernels.tar.gz for .prebuilt-pack/.
# smoke: tools/conv2d_smoke.py per conv operator, each in its own process with a minute's limit (a fault
#   or a hang in a new kernel costs one step, not the call).
# bench NAME: benchmarks/bench_NAME.py with the arguments in $BENCH_ARGS_NAME, else $BENCH_ARGS; each writes its
#   record (benchmarks/harness.py) to $OUT: copy a full run's NAME.json into benchmarks/results/.
# notebooks-bg: the notebooks in the background (their cost is CPU compiles); wait: until they finish, so that
#   a benchmark after it runs alone.
# The machine has torch, CuPy, NVRTC, Triton and nvcc but no nvidia-cutlass or platformdirs, and no network:
# their wheels travel in .wheels/ (carry it).  Results and logs land in $OUT (or /tmp/jitops-out).
# docs/contributing.md walks through a session.
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
    prebuilt)
      root=/tmp/jitops-prebuilt
      for archive in .prebuilt-pack/*.tar*; do
        python3 -m cache_tools --cache-dir "$root" import "$archive" || status=1
      done
      export JITOPS_TEST_CACHE_PATH=$root JITOPS_CACHE_PATH=$root ;;  # read-only roots (tests/conftest.py)
    build-gemm)
      roots=${JITOPS_CACHE_PATH:-}
      JITOPS_CACHE_DIR=/tmp/jitops-gemm python3 tools/prebuild_gemm.py --jobs 10 > "$OUT/build-gemm.log" 2>&1 &
      main_build=$!
      JITOPS_CACHE_DIR=/tmp/jitops-gemm-tune python3 tools/prebuild_gemm.py --tune-only --jobs 8 \
        > "$OUT/build-gemm-tune.log" 2>&1
      wait $main_build || status=1
      tail -2 "$OUT/build-gemm.log" "$OUT/build-gemm-tune.log"
      grep -h FAILED "$OUT"/build-gemm*.log
      for part in gemm gemm-tune; do
        env -u JITOPS_CACHE_PATH python3 -m cache_tools --cache-dir "/tmp/jitops-$part" export "$OUT/$part.tar.gz" \
          || status=1
      done
      roots=${roots:+$roots:}/tmp/jitops-gemm:/tmp/jitops-gemm-tune
      export JITOPS_TEST_CACHE_PATH=$roots JITOPS_CACHE_PATH=$roots ;;
    prewarm-models)  # not `models`: `bench models` names the benchmark
      python3 benchmarks/bench_models.py --prewarm-only --models "${MODELS:-gpt2,llama,vit,resnet50}" \
        --jobs "$(nproc)" > "$OUT/models-prewarm.log" 2>&1 || status=1
      tail -4 "$OUT/models-prewarm.log"
      # and the kernels of the GPU tests whose calls are data (tests/test_linear_gpu.py)
      python3 tests/test_linear_gpu.py --manifest /tmp/linear-manifest.json && \
        python3 -m cache_tools prewarm --manifest /tmp/linear-manifest.json --jobs "$(nproc)" \
        > "$OUT/tests-prewarm.log" 2>&1 || status=1
      tail -2 "$OUT/tests-prewarm.log"
      python3 -m cache_tools --cache-dir "$JITOPS_CACHE_DIR" export "$OUT/models-kernels.tar.gz" || status=1
      # the tests read them as a read-only root (tests/conftest.py gives each session its own writable one)
      export JITOPS_TEST_CACHE_PATH=${JITOPS_TEST_CACHE_PATH:+$JITOPS_TEST_CACHE_PATH:}$JITOPS_CACHE_DIR ;;
    smoke)
      for op in fprop dgrad wgrad; do
        timeout 60 python3 tools/conv2d_smoke.py "$op" 2>&1 | tee -a "$OUT/smoke.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done ;;
    notebooks-bg)
      (timeout 420 python3 -m pytest -q -p no:cacheprovider tests/test_notebooks.py > "$OUT/notebooks.log" 2>&1; \
       echo "exit $?" >> "$OUT/notebooks.log") &
      notebooks_pid=$! ;;
    wait)
      [ -n "${notebooks_pid:-}" ] && wait "$notebooks_pid"
      tail -3 "$OUT/notebooks.log" 2>/dev/null
      grep -q "^exit 0" "$OUT/notebooks.log" 2>/dev/null || status=1 ;;
    tests)
      # $GPU_TESTS: test files (default: every file with GPU tests).  One pytest process per file, $GPU_TEST_JOBS
      # (default 8) at a time, each stopped by SIGINT after $GPU_TEST_TIMEOUT seconds (default 400) so that it
      # still prints its summary: one serial run of every GPU test did not fit a 600 s call on the H100.  Logs:
      # $OUT/tests/FILE.log.  The kernels the tests had to compile are recorded in $OUT/gpu-tests-misses.jsonl:
      # `cache_tools prewarm --record` builds them into the next pack (40-70 s per nvcc kernel here otherwise).
      # The two longest files also spread their tests over pytest-xdist workers ($GPU_TEST_WORKERS, "FILE=N ...";
      # the machine's image has xdist): in one process each, test_gemm_gpu.py (its NVRTC-against-nvcc tests build
      # CUTLASS kernels with nvcc) and test_conv2d_gpu.py ran past 300 s, seven other files running beside them.
      mkdir -p "$OUT/tests"
      files=${GPU_TESTS:-$(grep -l "mark.gpu" tests/test_*.py)}
      workers=${GPU_TEST_WORKERS:-"test_gemm_gpu=4 test_conv2d_gpu=3"}
      python3 -c "import xdist" 2>/dev/null || workers=""
      printf '%s\n' $files | JITOPS_TEST_RECORD="$OUT/gpu-tests-misses.jsonl" xargs -P "${GPU_TEST_JOBS:-8}" -I{} \
        sh -c 'name=$(basename {} .py); log="$0/tests/$name.log"; n=""; \
               for w in $2; do [ "${w%%=*}" = "$name" ] && n="-n ${w#*=}"; done; \
               timeout -s INT -k 30 "$1" python3 -m pytest -q -m gpu $n \
               -p no:cacheprovider -p no:benchmark -rfE --tb=short {} > "$log" 2>&1; \
               echo "{}: exit $? $(grep -E "passed|failed|error|skipped|no tests ran" "$log" | tail -1)"' \
        "$OUT" "${GPU_TEST_TIMEOUT:-400}" "$workers" \
        | tee "$OUT/gpu-tests.log"
      grep -h -E '^(FAILED|ERROR)' "$OUT"/tests/*.log | tee -a "$OUT/gpu-tests.log"
      grep -q -v ": exit 0 " "$OUT/gpu-tests.log" && status=1 ;;
    bench)
      names=()
      while [ $((i + 1)) -lt ${#steps[@]} ] && [[ ! "${steps[$((i + 1))]}" =~ ^(tests|bench|prewarm-models|notebooks|notebooks-bg|wait|prebuilt|build-gemm|smoke)$ ]]; do
        i=$((i + 1)); names+=("${steps[$i]}")
      done
      [ ${#names[@]} -eq 0 ] && names=($(ls benchmarks/bench_*.py | xargs -n1 basename | sed 's/^bench_//; s/\.py$//'))
      for name in "${names[@]}"; do
        echo "=== benchmark $name"
        # BENCH_ARGS_NAME (e.g. BENCH_ARGS_gemm=--tune-only), else BENCH_ARGS, goes to the benchmark NAME.
        args_var="BENCH_ARGS_$name"
        python3 "benchmarks/bench_$name.py" ${!args_var:-${BENCH_ARGS:-}} 2>&1 | tee "$OUT/bench-$name.log"
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
