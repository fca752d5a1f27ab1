"""info: the cache roots with their sizes and counts, and the compilers this machine would use."""
from __future__ import annotations

import platform
import sys
from typing import Any, Callable, Sequence

import jitops
from jitops import config, runtime
from jitops.backends import toolkit
from jitops.cache import CacheEntry

from .common import dir_size, entry_archs
from .remote import remote_info


def info(archs: Sequence[str] = ()) -> dict[str, Any]:
    disk = runtime.disk_cache()
    selected = entry_archs(archs) if archs else None
    per_root: dict[str, dict[str, Any]] = {}
    for root in disk.roots:
        per_root[str(root.path)] = {
            "path": str(root.path), "writable": root.writable, "exists": root.path.is_dir(),
            "size_on_disk": dir_size(root.path) if root.path.is_dir() else 0,
            "entries": 0, "entries_size": 0, "unreadable": 0, "by_arch": {}, "by_backend": {}}
    for item in disk.entries():
        if isinstance(item, CacheEntry):
            arch = item.meta.get("request", {}).get("arch", "?")
            if selected is not None and arch not in selected:
                continue
            row = per_root[str(item.root.path)]
            size = dir_size(item.path)
            row["entries"] += 1
            row["entries_size"] += size
            for group, name in (("by_arch", arch), ("by_backend", item.meta.get("request", {}).get("backend", "?"))):
                count = row[group].setdefault(name, {"entries": 0, "size": 0})
                count["entries"] += 1
                count["size"] += size
        else:
            per_root[str(item[1].path)]["unreadable"] += 1
    if disk.writable is not None:
        quarantined = disk.quarantined()
        per_root[str(disk.writable.path)].update(
            quarantined=len(quarantined), quarantined_size=sum(dir_size(p) for p in quarantined))
    import torch

    return {
        "jitops": jitops.__version__, "python": sys.version.split()[0], "machine": platform.machine(),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "roots": list(per_root.values()),
        "remote": remote_info(archs),
        "compilers": compilers(),
        "settings": [{"variable": env, "value": value, "meaning": doc} for env, value, doc in config.describe()],
    }


def compilers() -> dict[str, Any]:
    """Each compiler's identity as the cache key records it, or why it is missing."""
    def headers() -> str:
        found = toolkit.cuda_headers()
        return ", ".join(f"{k} {v}" for k, v in found.identity.items()) + f" ({found.dirs[-1]})"

    def nvcc() -> str | None:
        path = toolkit.nvcc_path()
        return f"{toolkit.nvcc_identity()} ({path})" if path else None

    probes: dict[str, Callable[[], Any]] = {
        "nvrtc": toolkit.nvrtc_identity, "cuda_headers": headers, "nvcc": nvcc,
        "host_cxx": toolkit.host_compiler_identity, "cutlass": toolkit.cutlass_version}
    result: dict[str, Any] = {}
    for name, probe in probes.items():
        try:
            result[name] = probe() or "not found"
        except Exception as exc:  # noqa: BLE001 - ToolchainError and friends: say why
            result[name] = f"not found: {str(exc).removeprefix('jitops: ')}"
    return result
