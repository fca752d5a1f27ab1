"""Benchmark runner shared by every benchmark: times ours and a baseline in the same run on the same GPU,
prints one table and writes JSON for plots (notebooks/04_performance.ipynb reads it).

    from harness import Bench
    bench = Bench("gelu", device_note=...)
    bench.compare(op="gelu fwd", shape=(16384, 8192), dtype="bf16",
                  ours=lambda: jitops.gelu(x), baseline=lambda: F.gelu(x), baseline_name="torch",
                  bytes_moved=2 * x.numel() * 2)           # or flops=...
    bench.finish()   # table on stdout, JSON under benchmarks/results/

Timing: CUDA events around each call, after warm-up (which also absorbs JIT compiles), median of many
repetitions.  Inputs over 64 MB make the 50 MB L2 irrelevant; smaller cases rotate over enough copies of
their inputs to spill it (see `rotate`).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def time_cuda(fn: Callable[[], Any], *, warmup: int = 10, reps: int = 100, min_ms: float = 200.0) -> float:
    """Median milliseconds per call of fn, measured with CUDA events (one event pair per call)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    # Estimate, then repeat enough to cover min_ms in total.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    reps = max(reps, min(int(min_ms / estimate), 10000))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def rotate(make: Callable[[], Sequence[Any]], bytes_per_set: int,
           l2_bytes: int = 50 * 2**20) -> Callable[[], Sequence[Any]]:
    """Cycle through enough input sets that consecutive calls do not find their inputs in L2."""
    count = max(1, min(64, (3 * l2_bytes) // max(bytes_per_set, 1) + 1))
    sets = [make() for _ in range(count)]
    state = {"i": 0}

    def next_set() -> Sequence[Any]:
        state["i"] = (state["i"] + 1) % count
        return sets[state["i"]]

    return next_set


def copy_bandwidth(nbytes: int = 2 * 2**30) -> float:
    """Device-to-device copy in TB/s counting bytes read plus bytes written: the memory roofline of this run."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = time_cuda(lambda: dst.copy_(src), warmup=5, reps=30)
    return 2 * nbytes / (ms * 1e-3) / 1e12


def device_description() -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError:
        driver = "?"
    return {"name": props.name, "sms": props.multi_processor_count, "capability": f"{props.major}.{props.minor}",
            "driver": driver, "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version()}


@dataclass
class Row:
    op: str
    shape: str
    dtype: str
    ours_ms: float
    baseline_ms: float
    baseline: str
    metric: str          # "TB/s" or "TFLOP/s"
    ours_rate: float
    baseline_rate: float
    speedup: float       # baseline time / our time: > 1 means we are faster
    extra: dict[str, Any] = field(default_factory=dict)


class Bench:
    def __init__(self, name: str) -> None:
        self.name = name
        self.rows: list[Row] = []
        self.notes: dict[str, Any] = {}
        self.started = _dt.datetime.now(_dt.timezone.utc)

    def compare(self, *, op: str, shape: Any, dtype: str, ours: Callable[[], Any], baseline: Callable[[], Any],
                baseline_name: str, bytes_moved: float | None = None, flops: float | None = None,
                check: Callable[[], None] | None = None, **extra: Any) -> Row:
        if check is not None:
            check()
        ours_ms = time_cuda(ours)
        base_ms = time_cuda(baseline)
        if flops is not None:
            metric, scale = "TFLOP/s", flops / 1e12
        else:
            metric, scale = "TB/s", (bytes_moved or 0) / 1e12
        row = Row(op, str(shape), dtype, ours_ms, base_ms, baseline_name, metric,
                  scale / (ours_ms * 1e-3), scale / (base_ms * 1e-3), base_ms / ours_ms, extra)
        self.rows.append(row)
        print(f"  {op:22s} {str(shape):28s} {dtype:5s} ours {ours_ms * 1e3:9.1f} us  "
              f"{baseline_name} {base_ms * 1e3:9.1f} us  x{row.speedup:.2f}", flush=True)
        return row

    def note(self, **values: Any) -> None:
        self.notes.update(values)

    def table(self) -> str:
        header = (f"| op | shape | dtype | ours (us) | baseline (us) | ours {self.rows[0].metric if self.rows else ''} "
                  f"| baseline rate | baseline | ours/baseline speed |")
        lines = [header, "|" + " --- |" * 9]
        for r in self.rows:
            lines.append(f"| {r.op} | {r.shape} | {r.dtype} | {r.ours_ms * 1e3:.1f} | {r.baseline_ms * 1e3:.1f} | "
                         f"{r.ours_rate:.2f} {r.metric} | {r.baseline_rate:.2f} {r.metric} | {r.baseline} | "
                         f"{r.speedup:.2f} |")
        return "\n".join(lines)

    def finish(self) -> Path:
        device = device_description() if torch.cuda.is_available() else {"name": "cpu"}
        record = {"benchmark": self.name, "date": self.started.strftime("%Y-%m-%d %H:%M UTC"), "device": device,
                  "command": " ".join([Path(sys.executable).name, *sys.argv]), "notes": self.notes,
                  "rows": [asdict(r) for r in self.rows]}
        out_dir = Path(os.environ.get("JITOPS_BENCH_OUT", RESULTS))
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{self.name}.json"
        path.write_text(json.dumps(record, indent=1))
        print(f"\n## {self.name} - {device.get('name')} - {record['date']}\n`{record['command']}`\n")
        for key, value in self.notes.items():
            print(f"- {key}: {value}")
        print()
        print(self.table())
        print(f"\nJSON: {path}")
        return path
