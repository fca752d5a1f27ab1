"""Helpers shared by the cache_tools tests: run the CLI in-process, write manifests, snapshot a cache."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from cache_tools.cli import main

# Two NVRTC kernels (0.1-1 s each, no GPU): gelu forward bf16 and fp32, approximate=tanh ("grad": false: the
# calls without a gradient, so not the backward's kernels).
GELU_ITEM = {"op": "gelu", "grad": False, "dtypes": ["bf16", "fp32"], "shapes": [[[1024, 64]]],
             "kwargs": {"approximate": "tanh"}}


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run `jitops-cache argv...` in this process; (exit code, stdout, stderr)."""
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys, *argv: str) -> tuple[int, Any]:
    code, out, err = cli(capsys, *argv, "--json")
    assert out.strip(), err
    return code, json.loads(out)


def write_manifest(path: Path, *items: dict[str, Any], archs: list[str] | None = None) -> Path:
    data: dict[str, Any] = {"ops": list(items)}
    if archs is not None:
        data["archs"] = archs
    path.write_text(json.dumps(data))
    return path


def snapshot(root: Path) -> dict[str, str]:
    """Every file under a cache root with its sha256: what 'nothing in the cache is lost' compares."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "/locks/" not in f"/{p.relative_to(root)}"}


def entry_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob("v1/*/*/*/meta.json"))
