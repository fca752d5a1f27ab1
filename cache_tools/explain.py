"""explain: for one op call, the key of every kernel it needs, whether a call here would find it, and if not,
what differs from the nearest cached entry of the same kernel."""
from __future__ import annotations

from typing import Any, Sequence

from jitops import config, runtime
from jitops.backends import BACKENDS
from jitops.cache import CacheEntry, CorruptEntry
from jitops.keys import CacheKey, explain_difference

from .entries import cache_entries
from .common import UsageError
from .manifest import Call, Job, RejectedCalls, plan


def explain(calls: Sequence[Call], archs: Sequence[str] = (),
            fix_command: str = "jitops-cache verify --fix") -> list[dict[str, Any]]:
    """One report per (call, arch): per kernel (of every op call a public op's call leads to, or of the one
    op call an item with kernel_op names), the op and shape class that ask for it, key, status and nearest
    entry.  "shape_class" is the first op call's."""
    entries, _ = cache_entries()
    by_kernel: dict[str, list[CacheEntry]] = {}
    for entry in entries:
        by_kernel.setdefault(entry.meta.get("request", {}).get("kernel", ""), []).append(entry)
    reports = []
    for call in calls:
        for arch in list(archs) or list(call.archs) or [""]:
            try:
                result = plan([call], [arch] if arch else ())
            except RejectedCalls as exc:  # one call, described on the command line: no manifest words
                raise UsageError(f"{call.describe()} on {arch or 'its archs'}: {exc.reasons[0]}") from None
            report: dict[str, Any] = {"call": call.item(), "arch": arch, "kernels": [],
                                      "skipped": [s["reason"] for s in result.skipped],
                                      "no_kernel": bool(result.no_kernel)}
            for job in result.jobs:
                report.setdefault("shape_class", job.shape_class)
                report["kernels"].append(_explain_job(job, by_kernel.get(job.request.kernel, []),
                                                      len(entries), fix_command))
            reports.append(report)
    return reports


def _explain_job(job: Job, same_kernel: list[CacheEntry], total_entries: int, fix_command: str) -> dict[str, Any]:
    key, can_compile = runtime.key_for(job.request, job.target)
    any_toolchain = config.offline or not can_compile
    found = runtime.find_entry(key, any_toolchain=any_toolchain)
    info: dict[str, Any] = {
        "name": job.name, "kernel_op": job.kernel_op, "shape_class": job.shape_class,
        "kernel": job.request.kernel, "label": job.label, "backend": job.request.backend,
        "arch": job.arch, "dtype": job.request.dtype, "key": {"request": key.request, "toolchain": key.toolchain},
        "request_hash": key.request_hash, "toolchain_hash": key.toolchain_hash, "entry_name": key.dirname(),
        "status": "hit" if found is not None else "miss", "entry": str(found.path) if found else None,
        "nearest": None}
    if found is not None:
        if found.meta.get("toolchain_hash") == key.toolchain_hash:
            info["verdict"] = "a call loads this cached entry"
        else:
            why = "offline mode" if config.offline else "no compiler here" if not can_compile else "a read-only root"
            info["verdict"] = (f"a call loads this entry, built by another toolchain ({why} accepts any "
                               "toolchain's build of the same request)")
        return info
    if config.offline:
        info["verdict"] = "a call raises CacheMissError (offline mode) - prewarm this kernel and ship it"
    elif not can_compile:
        reason = BACKENDS[job.request.backend].unavailable_reason(job.request) or "no toolchain"
        info["verdict"] = f"a call raises ToolchainError ({reason}) - prewarm it on a machine that can build it"
    else:
        info["verdict"] = f"a call compiles it ({job.request.backend} is available here)"
    exact = [e for e in same_kernel if e.meta.get("request_hash") == key.request_hash]
    corrupt = []
    for entry in exact:
        try:
            entry.verify()
        except CorruptEntry as exc:
            corrupt.append(f"{entry.path}: {exc}")
    if corrupt:
        info["corrupt"] = corrupt
    nearest = _nearest(key, same_kernel)
    if nearest is None:
        info["nearest"] = None
        info["note"] = (f"no build of kernel {job.request.kernel!r} is cached in any root "
                        f"({total_entries} entries of other kernels)")
        return info
    entry, request_diff, toolchain_diff = nearest
    info["nearest"] = {"path": str(entry.path), "root": str(entry.root.path), "writable": entry.root.writable,
                       "differences": request_diff, "toolchain_differences": toolchain_diff}
    if not request_diff and toolchain_diff:
        info["note"] = ("the same request is cached, built by another toolchain; a machine that can compile "
                        "builds its own in its writable root.  Offline mode (JITOPS_OFFLINE=1) or shipping "
                        "that cache as a read-only root (JITOPS_CACHE_PATH) would use it")
    elif not request_diff and not toolchain_diff:
        info["note"] = f"an entry with this key exists but fails its checksum: run `{fix_command}`"
    return info


def _nearest(key: CacheKey, candidates: list[CacheEntry]) -> tuple[CacheEntry, list[str], list[str]] | None:
    """The cached entry of the same kernel whose key differs in the fewest components."""
    best = None
    for entry in candidates:
        request_diff = explain_difference(key.request, entry.meta.get("request", {}))
        toolchain_diff = explain_difference(key.toolchain, entry.meta.get("toolchain", {}), "toolchain.")
        rank = (len(request_diff), len(toolchain_diff), -float(entry.meta.get("created") or 0))
        if best is None or rank < best[0]:
            best = (rank, entry, request_diff, toolchain_diff)
    return None if best is None else best[1:]
