"""Every recorded benchmark result follows the one schema that docs and notebooks/04_performance.ipynb read."""
import json
from pathlib import Path

import pytest

RESULTS = sorted((Path(__file__).resolve().parent.parent / "benchmarks" / "results").glob("*.json"))
ROW_FIELDS = {"op", "shape", "dtype", "ours_ms", "baseline_ms", "baseline", "metric", "ours_rate", "baseline_rate",
              "speedup", "extra"}


@pytest.mark.parametrize("path", RESULTS, ids=[p.stem for p in RESULTS])
def test_result_file_schema(path):
    data = json.loads(path.read_text())
    assert set(data) >= {"benchmark", "date", "device", "command", "notes", "rows"}, path.name
    assert isinstance(data["device"], dict) and data["device"].get("name"), f"{path.name}: device must be a dict"
    assert data["command"].startswith("python"), f"{path.name}: the command that produced it"
    assert isinstance(data["notes"], dict) and isinstance(data["rows"], list)
    for row in data["rows"]:
        assert set(row) >= ROW_FIELDS, f"{path.name}: row {row.get('op')} lacks {ROW_FIELDS - set(row)}"
