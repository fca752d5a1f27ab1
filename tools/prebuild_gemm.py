"""Build, on a machine without a GPU, every gemm kernel the GPU tests and bench_gemm.py load, so that a session
on the lent GPU compiles nothing: ship the cache directory as a read-only root (JITOPS_CACHE_PATH).

    JITOPS_CACHE_DIR=.hw/gemm/prebuilt python tools/prebuild_gemm.py [--tune | --tune-only] [--jobs 2] [--list]

Builds for the H100 (compute capability 9.0), all through NVRTC: the sm_90a light and CUTLASS 3 kernels, and the
CUTLASS 2 kernels that the tests run there (unaligned shapes, config.scope(gemm_family="sm80")) as sm_90 cubins,
and the nvcc-built references of the bit-for-bit test (SM90_GEMM_REFERENCE).
"""
from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT), str(ROOT / "tests")]

import jitops
from jitops.specs import Target


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--tune", action="store_true", help="also the candidate configurations of bench --tune")
    parser.add_argument("--tune-only", action="store_true",
                        help="only the candidates of bench --tune that nothing else loads (a second build root)")
    parser.add_argument("--survey-only", action="store_true",
                        help="only the candidates of bench --sweep-survey that nothing else loads")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--list", action="store_true", help="print what would be built, build nothing")
    parser.add_argument("--only", choices=["nvcc", "nvrtc"], help="build only this backend's kernels")
    args = parser.parse_args()

    import bench_gemm
    import gemm_cases

    target = Target.parse(args.arch)
    wanted = {}
    for case in gemm_cases.ALL:
        wanted.update(gemm_cases.requests(case, target))
    for r in bench_gemm.requests(target).values():
        wanted[r.label() + " " + str(r.params)] = r
    for case in gemm_cases.BIT_FOR_BIT:  # nvcc's references (cases share them: one per shape class)
        r = gemm_cases.bit_for_bit_reference(*case)
        wanted[r.label() + " " + str(r.params)] = r
    if args.survey_only:
        survey = {r.label() + " " + str(r.params): r for r in bench_gemm.requests(target, survey=True).values()}
        wanted = {key: r for key, r in survey.items() if key not in wanted}
    elif args.tune or args.tune_only:
        tune = {r.label() + " " + str(r.params): r for r in bench_gemm.requests(target, tune=True).values()}
        wanted = {key: r for key, r in tune.items() if key not in wanted} if args.tune_only else {**wanted, **tune}
    unique = {}
    for r in wanted.values():
        unique.setdefault((r.backend, r.kernel, r.entry, r.params, r.dtype), r)
    todo = sorted(unique.values(), key=lambda r: (r.backend != "nvcc", str(r.params)))
    if args.only:
        todo = [r for r in todo if r.backend == args.only]
    print(f"{len(todo)} kernels: {sum(r.backend == 'nvcc' for r in todo)} nvcc, "
          f"{sum(r.backend == 'nvrtc' for r in todo)} nvrtc", flush=True)
    if args.list:
        for r in todo:
            print(" ", r.backend, bench_gemm._describe(r) if r.kernel.startswith("gemm") else r.label())
        return

    # Processes, not threads: NVRTC runs one compile at a time per process (CuPy's binding releases the GIL,
    # but on the lent H100 16 threads' CUTLASS 3 compiles finished one after another, about 25 s apart).
    started = time.perf_counter()
    failed = []
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for what, outcome, seconds, error in pool.map(build, [(r, target) for r in todo]):
            if error:
                failed.append(what)
                print(f"  {what}: {error}", flush=True)
            print(f"  {outcome:8s} {seconds:6.1f} s  {what}", flush=True)
    print(f"prebuild_gemm: {len(todo)} kernels in {time.perf_counter() - started:.1f} s, {args.jobs} processes",
          flush=True)
    if failed:
        raise SystemExit(f"prebuild_gemm: {len(failed)} of {len(todo)} builds failed: {failed}")


def build(item) -> tuple[str, str, float, str | None]:
    """One kernel, in a worker process: (description, outcome, seconds, error)."""
    import bench_gemm

    request, target = item
    started = time.perf_counter()
    what = bench_gemm._describe(request) if request.kernel.startswith("gemm") else request.label()
    try:
        return what, jitops.runtime.prewarm(request, target), time.perf_counter() - started, None
    except Exception as exc:  # noqa: BLE001 - one failed configuration must not stop the others' builds
        return what, "FAILED", time.perf_counter() - started, str(exc)[-2000:]


if __name__ == "__main__":
    main()
