"""benchmarks/results/ holds the latest record of each benchmark, one file each, in the one schema that
benchmarks/harness.py writes and docs/benchmarks.md and notebooks/04_performance.ipynb read; the fitters in
tools/ still reproduce conv2d's constants from the sweeps kept in tools/data/."""
from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO / "benchmarks"))
import harness  # noqa: E402

FILES = sorted(RESULTS.iterdir())
ROW_FIELDS = {field.name for field in dataclasses.fields(harness.Row)}
# bench_jit_latency.py's rows: one per way of getting a kernel (jitops, CuPy, Triton, load_inline, ...)
LATENCY_FIELDS = {"op", "method", "baseline", "cold_first_ms", "warm_first_ms", "hot_us", "baseline_hot_us"}
# bench_models.py's rows: one per (model, mode)
MODEL_FIELDS = {"model", "mode", "step_ms", "host_ms", "first_step_s", "first_step_compiles", "speedup_vs_eager"}
# bench_remote_cache.py's rows: one per case (disk hit, remote hit, Redis down, the race)
REMOTE_FIELDS = {"case", "first_call_ms", "processes", "compiles", "disk_hits", "remote_hits"}


def test_results_hold_one_json_record_per_benchmark():
    assert FILES, "benchmarks/results/ is empty"
    assert [p.name for p in FILES if p.suffix != ".json"] == [], "logs and profiler dumps do not go in results/"
    for path in FILES:
        benchmark = json.loads(path.read_text())["benchmark"]
        assert path.stem == benchmark, f"{path.name} holds benchmark {benchmark!r}: name it {benchmark}.json"
        assert (REPO / "benchmarks" / f"bench_{benchmark}.py").is_file(), f"{path.name}: no bench_{benchmark}.py"


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_result_record_schema(path):
    data = json.loads(path.read_text())
    assert list(data) == list(harness.RECORD_KEYS), f"{path.name}: keys {list(data)}, not {harness.RECORD_KEYS}"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", data["date"]), f"{path.name}: date {data['date']!r}"
    device = data["device"]
    assert isinstance(device, dict) and device.get("name") and device.get("driver") and device.get("torch"), \
        f"{path.name}: the device, its driver and torch version"
    assert re.match(rf"python3? benchmarks/bench_{data['benchmark']}\.py", data["command"]), \
        f"{path.name}: the command that produced it, not {data['command']!r}"
    assert isinstance(data["baseline"], str) and data["baseline"], f"{path.name}: what ours is compared with"
    assert isinstance(data["summary"], dict)
    rows = data["rows"]
    assert isinstance(rows, list) and rows, f"{path.name}: a record of no measurements"
    fields = {"jit_latency": LATENCY_FIELDS, "models": MODEL_FIELDS, "remote_cache": REMOTE_FIELDS}.get(
        data["benchmark"], ROW_FIELDS)
    for row in rows:
        assert set(row) >= fields, f"{path.name}: row {row.get('op')} lacks {sorted(fields - set(row))}"
        if fields is ROW_FIELDS:
            assert row["metric"] in ("TB/s", "TFLOP/s"), row["metric"]
            assert row["ours_ms"] > 0 and row["baseline_ms"] > 0
            assert math.isclose(row["speedup"], row["baseline_ms"] / row["ours_ms"], rel_tol=1e-6), \
                f"{path.name}: speedup is baseline time / our time"


def test_harness_writes_the_schema_the_test_checks(tmp_path, monkeypatch):
    monkeypatch.setenv("JITOPS_BENCH_OUT", str(tmp_path))
    path, record = harness.save_record("gelu", baseline="torch", rows=[], summary={"copy TB/s": 3.0})
    assert path == tmp_path / "gelu.json" and list(json.loads(path.read_text())) == list(harness.RECORD_KEYS)
    path, record = harness.save_record("gemm", baseline="torch.matmul", rows=[], summary={}, variant="survey")
    assert path == tmp_path / "gemm-survey.json" and record["variant"] == "survey"
    with pytest.raises(ValueError, match="bench_gemm_survey"):
        harness.save_record("gemm_survey", baseline="torch.matmul", rows=[], summary={})
    monkeypatch.setenv("JITOPS_BENCH_COMMIT", "abc1234")
    assert harness.save_record("gelu", baseline="torch", rows=[], summary={})[1]["summary"]["commit"] == "abc1234"
    monkeypatch.delenv("JITOPS_BENCH_COMMIT")
    commit = harness.save_record("gelu", baseline="torch", rows=[], summary={})[1]["summary"]["commit"]
    if (REPO / ".git").exists():  # git's HEAD in a checkout (CI's clone), None outside one
        assert re.fullmatch(r"[0-9a-f]{7,}(-dirty)?", commit or ""), commit
    monkeypatch.delenv("JITOPS_BENCH_OUT")
    assert harness.record_path("conv2d") == RESULTS / "conv2d.json"
    assert harness.record_path("conv2d", "tiles-wgrad").parent.name == "out"  # sweeps stay out of results/


def _printed_constants(module: str, argv: list[str], capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "tools"))
    monkeypatch.setattr(sys, "argv", [module, *argv])
    fit = __import__(module)
    assert fit.main() == 0
    return fit, capsys.readouterr().out


def _close(printed: dict, kept: dict) -> bool:
    return printed.keys() == kept.keys() and all(
        math.isclose(a, b, abs_tol=0.006) for key in kept for a, b in zip(printed[key], kept[key]))


def test_wgrad_fitter_reproduces_conv2d_constants_from_tools_data(capsys, monkeypatch):
    fit, out = _printed_constants("fit_wgrad_cost", [], capsys, monkeypatch)
    assert "1322 timings" in out, out
    printed = ast.literal_eval(re.search(r"^WGRAD_TILE_US = (\{.*\})$", out, re.M).group(1))
    assert _close(printed, fit.costs.WGRAD_TILE_US), (printed, fit.costs.WGRAD_TILE_US)
    loaded = float(re.search(r"^WGRAD_US_PER_GB_LOADED = ([\d.]+)$", out, re.M).group(1))
    assert math.isclose(loaded, fit.costs.WGRAD_US_PER_GB_LOADED, abs_tol=0.06)


def test_wgrad_fitter_reproduces_the_light_kernels_constants_from_tools_data(capsys, monkeypatch):
    fit, out = _printed_constants("fit_wgrad_cost", ["--light"], capsys, monkeypatch)
    assert "1083 timings" in out, out
    printed = ast.literal_eval(re.search(r"^LIGHT_WGRAD_TILE_US = (\{.*\})$", out, re.M).group(1))
    assert _close(printed, fit.costs.LIGHT_WGRAD_TILE_US), (printed, fit.costs.LIGHT_WGRAD_TILE_US)
    for name in ("LIGHT_WGRAD_SPLIT_US", "LIGHT_WGRAD_US_PER_MB_SLICES", "LIGHT_WGRAD_US_PER_SLICE_DEPTH"):
        value = float(re.search(rf"^{name} = ([\d.]+)$", out, re.M).group(1))
        assert math.isclose(value, getattr(fit.costs, name), abs_tol=0.006), name


def test_fprop_dgrad_fitter_reproduces_conv2d_constants_from_tools_data(capsys, monkeypatch):
    fit, out = _printed_constants("fit_conv_gemm_cost", [], capsys, monkeypatch)
    for operator in ("fprop", "dgrad"):
        printed = ast.literal_eval(re.search(rf'^    "{operator}": (\{{.*\}}),$', out, re.M).group(1))
        assert _close(printed, fit.costs.GEMM_TILE_US[operator]), (operator, printed)


def test_benchmarks_page_stays_a_results_page():
    """docs/benchmarks.md holds the latest table per op, not a history (issue 20: under 300 lines); git keeps
    earlier runs."""
    lines = (REPO / "docs" / "benchmarks.md").read_text().splitlines()
    assert len(lines) < 300, f"docs/benchmarks.md has {len(lines)} lines: keep the latest figures, drop history"
