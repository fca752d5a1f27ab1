"""The disk cache keys of the built-in ops' kernels are pinned: a refactor of the op modules (plans moved out,
overrides made config, modules renamed) must not move a key, or every prewarmed cache and deployment image
would miss.

tests/data/cache_keys.json records, for every kernel that the built-in ops' PREWARM items and
`python -m jitops --manifest` can request on cpu, sm_80 and sm_90a, the key the runtime computes
(`runtime.key_for`: nothing is compiled, no GPU is needed).  This test recomputes them.

    python tests/test_cache_key_golden.py --write     # re-record, only when a kernel change is meant to
                                                       # move keys (say so in the commit)

The request half (sources and their include closure, flags, arch, dtype, shape class...) must match exactly.
The full key also hashes the toolchain (NVRTC, nvcc, gcc, torch versions); it is compared whenever this
machine's toolchain for that backend is the recorded one (the development and CI machines), and otherwise the
request half alone is compared and the differing toolchain named.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).parent / "data" / "cache_keys.json"
ARCHS = ("cpu", "sm_80", "sm_90a")


def _calls() -> list[Any]:
    """Every built-in PREWARM item and every call `python -m jitops` makes, as cache_tools calls."""
    from cache_tools import manifest as cache_manifest
    from jitops.__main__ import manifest as run_manifest

    calls = cache_manifest.builtin_calls()
    for index, item in enumerate(run_manifest(list(ARCHS))["ops"]):
        item = {k: v for k, v in item.items() if k != "archs"}
        calls += cache_manifest.parse_item(item, (), f"python -m jitops --manifest ops[{index}]")
    return calls


def compute() -> dict[str, Any]:
    """{"toolchains": {hash: components}, "kernels": {id: {...}}} for this checkout on this machine."""
    from cache_tools import manifest as cache_manifest
    from jitops import runtime

    plan = cache_manifest.plan(_calls(), ARCHS, strict=False)
    toolchains: dict[str, Any] = {}
    kernels: dict[str, Any] = {}
    for job in plan.jobs:
        key, _ = runtime.key_for(job.request, job.target)
        ident = f"{job.request.backend}:{job.arch}:{key.kernel}:{key.request_hash[:16]}"
        toolchains[key.toolchain_hash] = key.toolchain
        kernels[ident] = {"op": job.kernel_op, "label": job.label, "full": key.full,
                          "request_hash": key.request_hash, "toolchain_hash": key.toolchain_hash,
                          "request": key.request}
    return {"archs": list(ARCHS), "toolchains": dict(sorted(toolchains.items())),
            "kernels": dict(sorted(kernels.items()))}


def _differences(want: Any, have: Any, prefix: str = "") -> list[str]:
    from jitops.keys import explain_difference

    return explain_difference(want, have, prefix)


def test_cache_keys_of_builtin_kernels_are_unchanged():
    golden = json.loads(GOLDEN.read_text())
    current = compute()
    # Match kernels by backend, arch, name and request hash; a moved request hash shows up as one missing and
    # one new entry, explained below field by field against the recorded entry of the same label and arch.
    missing = sorted(set(golden["kernels"]) - set(current["kernels"]))
    new = sorted(set(current["kernels"]) - set(golden["kernels"]))
    problems: list[str] = []
    for ident in missing:
        was = golden["kernels"][ident]
        arch = ident.split(":")[1]
        twins = [c for i, c in current["kernels"].items() if i in new and c["label"] == was["label"]
                 and i.split(":")[1] == arch]
        if twins:
            fields = _differences(was["request"], twins[0]["request"])
            problems.append(f"{was['op']} kernel {was['label']} [{arch}]: request key moved "
                            f"({was['request_hash'][:16]} -> {twins[0]['request_hash'][:16]}):\n      " +
                            "\n      ".join(f.replace("wanted", "recorded").replace("cached", "now")
                                            for f in fields))
        else:
            problems.append(f"{was['op']} kernel {was['label']} [{arch}] ({ident}) is no longer requested")
    for ident in new:
        now = current["kernels"][ident]
        arch = ident.split(":")[1]
        if not any(w["label"] == now["label"] and i.split(":")[1] == arch
                   for i, w in golden["kernels"].items() if i in missing):
            problems.append(f"{now['op']} kernel {now['label']} [{arch}] ({ident}) is new: record it with "
                            f"`python tests/test_cache_key_golden.py --write` if that is meant")
    toolchain_notes: set[str] = set()
    for ident in sorted(set(golden["kernels"]) & set(current["kernels"])):
        was, now = golden["kernels"][ident], current["kernels"][ident]
        if was["full"] == now["full"]:
            continue
        if was["toolchain_hash"] != now["toolchain_hash"]:
            fields = _differences(golden["toolchains"].get(was["toolchain_hash"], {}),
                                  current["toolchains"][now["toolchain_hash"]])
            toolchain_notes.add(f"{ident.split(':')[0]}: " + "; ".join(fields))
        else:
            problems.append(f"{now['op']} kernel {now['label']}: full key moved with the same halves ({ident})")
    assert not problems, (f"{len(problems)} cache keys moved (kernel sources and their request fields must not "
                          "change in a refactor):\n  " + "\n  ".join(problems))
    if toolchain_notes:  # not a failure: another machine's compilers; the request halves all matched
        print("toolchain differs from the recorded one, request halves compared:\n  " +
              "\n  ".join(sorted(toolchain_notes)))


def test_golden_file_covers_every_arch_and_builtin_op():
    """The record can fail: it must hold kernels of every arch and of every op that has kernels there."""
    golden = json.loads(GOLDEN.read_text())
    archs = {ident.split(":")[1] for ident in golden["kernels"]}
    assert {"cpu", "sm_80", "sm_90a"} <= archs | {"sm_90"}, archs
    ops = {k["op"] for k in golden["kernels"].values()}
    for name in ("add", "gelu", "layer_norm", "conv2d", "grouped_gemm", "gemm"):
        assert any(op == name or op.startswith(name) for op in ops), (name, sorted(ops))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {sys.argv[0]} --write   (re-records {GOLDEN})")
    GOLDEN.parent.mkdir(exist_ok=True)
    record = compute()
    lines = [f" {json.dumps(name)}: {json.dumps(value, sort_keys=True)}" for name, value in record.items()
             if name != "kernels"]
    lines += [f"  {json.dumps(name)}: {json.dumps(value, sort_keys=True)}" for name, value in record["kernels"].items()]
    head, kernels = ",\n".join(lines[:len(record) - 1]), ",\n".join(lines[len(record) - 1:])
    GOLDEN.write_text("{\n" + head + ',\n "kernels": {\n' + kernels + "\n }\n}\n")  # one kernel a line
    print(f"wrote {GOLDEN}")
