"""Build every kernel of a plan into the writable cache root, in parallel, with progress and a report.

Parallelism: --jobs worker threads, so at most N compiles run at once.  NVRTC compiles in the thread (CuPy's
binding releases the GIL); nvcc, the C++ compiler and load_inline's ninja run as subprocesses, each in a
process group of its own (jitops.backends.processes).  An interrupt (SIGINT, or SIGTERM, which the command line
turns into one) starts nothing new, stops every compiler process group and lets the worker threads remove their
build directories before the command exits; NVRTC compiles under way (seconds) finish and publish.

Nothing here decides what is cached: jitops.runtime.prewarm() takes the per-key lock, re-checks and publishes
atomically, so a prewarm and processes using the ops on the same cache are safe together.
"""
from __future__ import annotations

import contextlib
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, TextIO

from jitops import MissContext, config, runtime
from jitops.backends import BACKENDS, processes

from .common import os_error_message, storage_error
from .manifest import Job, Plan
from .progress import Progress

OUTCOMES = ("compiled", "cached", "failed", "unbuildable")


@dataclass
class Result:
    job: Job
    outcome: str          # one of OUTCOMES
    seconds: float = 0.0
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        job = self.job
        return {"op": job.op, "kernel_op": job.kernel_op, "kernel": job.request.kernel, "label": job.label,
                "backend": job.request.backend,
                "arch": job.arch, "dtype": job.request.dtype, "shape_class": job.shape_class,
                "call": job.call.item(), "outcome": self.outcome, "seconds": round(self.seconds, 3),
                "error": self.error}


@dataclass
class PrewarmReport:
    results: list[Result]
    skipped: list[dict[str, str]] = field(default_factory=list)
    wall_seconds: float = 0.0
    jobs: int = 1

    def count(self, outcome: str) -> int:
        return sum(r.outcome == outcome for r in self.results)

    @property
    def ok(self) -> bool:
        return not self.count("failed") and not self.count("unbuildable")

    def by_arch(self) -> list[dict[str, Any]]:
        """Rows of the final table: one per compile arch, then the total.  Seconds are the kernels' build
        times added up (with --jobs N, up to N times the wall time)."""
        archs = sorted({r.job.arch for r in self.results} | {s["arch"] for s in self.skipped},
                       key=lambda a: (a == "cpu", a))
        rows = []
        for arch in archs + ["total"]:
            mine = [r for r in self.results if arch in ("total", r.job.arch)]
            row: dict[str, Any] = {"arch": arch}
            row.update({o: sum(r.outcome == o for r in mine) for o in OUTCOMES})
            row["skipped"] = sum(arch in ("total", s["arch"]) for s in self.skipped)
            row["seconds"] = round(sum(r.seconds for r in mine), 2)
            rows.append(row)
        return rows

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "jobs": self.jobs, "wall_seconds": round(self.wall_seconds, 3),
                "summary": self.by_arch(), "results": [r.as_dict() for r in self.results],
                "skipped": self.skipped}


def prewarm(plan: Plan, jobs: int | None = None, progress: bool = True, stream: TextIO | None = None) -> PrewarmReport:
    """Build the plan's kernels into the writable root of the current jitops.config (see config.scope)."""
    jobs = max(1, jobs or config.jobs)
    started = time.perf_counter()
    results: list[Result | None] = [None] * len(plan.jobs)
    todo: list[int] = []
    for index, job in enumerate(plan.jobs):  # what is cached or cannot be built is settled here, at once
        settled = _settle(job)
        if settled is None:
            todo.append(index)
        else:
            results[index] = settled
    display = Progress(len(todo), stream=stream, enabled=progress)
    # The display reports progress; the runtime's own "compiling ..." lines would break the bar.  Without the
    # display (--no-progress) they are the only sign of a long compile, so they stay.
    with config.scope(progress_seconds=1e9) if progress else contextlib.nullcontext():
        try:
            with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="prewarm") as threads:
                futures: dict[Future, int] = {threads.submit(_build, i, plan.jobs[i], display): i for i in todo}
                try:
                    for future in as_completed(futures):
                        results[futures[future]] = future.result()
                except BaseException:  # Ctrl-C, SIGTERM: start nothing new, stop the compilers under way
                    for future in futures:
                        future.cancel()
                    processes.stop_all(refuse_new=True)
                    raise
        finally:
            processes.allow_new()
            display.close()
    return PrewarmReport([r for r in results if r is not None], list(plan.skipped),
                         time.perf_counter() - started, jobs)


def _settle(job: Job) -> Result | None:
    """'cached' or 'unbuildable' without building, or None: it must be built."""
    try:
        key, can_compile = runtime.key_for(job.request, job.target)
        if runtime.find_entry(key, any_toolchain=not can_compile) is not None:
            return Result(job, "cached")
    except Exception as exc:  # noqa: BLE001 - e.g. CUTLASS headers missing: report it by name
        return Result(job, "failed", error=f"{type(exc).__name__}: {exc}")
    backend = BACKENDS[job.request.backend]
    if not can_compile:
        reason = backend.unavailable_reason(job.request) or f"no {job.request.backend} toolchain here"
        return Result(job, "unbuildable", error=reason)
    unsupported = backend.unsupported_arch(job.request, job.arch)
    if unsupported:
        return Result(job, "unbuildable", error=unsupported)
    return None


def _build(index: int, job: Job, display: Progress) -> Result:
    """One job, in a worker thread."""
    display.start(index, f"{job.label} [{job.arch}]")
    started = time.perf_counter()
    try:
        outcome = runtime.prewarm(job.request, job.target,
                                  MissContext(job.op, job.shape_class, job.item, kernel_op=job.kernel_op))
        error = None
    except Exception as exc:  # noqa: BLE001 - CompileError, ToolchainError, OSError: reported per kernel
        outcome, error = "failed", str(exc) or traceback.format_exc(limit=3)
        if isinstance(exc, OSError) and storage_error(exc):  # a full disk, a read-only root: where, what to do
            error = os_error_message(exc)
    result = Result(job, outcome, time.perf_counter() - started, error)
    display.finish(index, job.label, outcome, job.arch, result.seconds)
    return result
