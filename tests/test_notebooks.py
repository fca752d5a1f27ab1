"""Every notebook in notebooks/ runs top to bottom in a fresh Jupyter kernel, so none of them can rot.

Each runs with nbclient in a new kernel (this interpreter), from notebooks/, with its own JITOPS_CACHE_DIR and
TMPDIR, and fails on the first cell that raises.  The notebooks assert what they teach (a first call compiles, a
fresh process is a disk hit, an offline run compiles nothing), so a behaviour change fails here too.  Where a
GPU is present the GPU cells run; elsewhere they print a "No GPU here" note, which is checked both ways.

Where nbclient or ipykernel is not installed (a bare GPU machine), the code cells run in order as one script in
a fresh interpreter instead: the notebooks use no IPython syntax, so that is the same program.

Without a GPU the four notebooks take about 45 s on an idle 2-core machine; their C++ compiles (01: gelu; 02: the
custom op, then its edited source; 03: gelu for the recorded run, then the prewarm) take about a second each.
Each notebook uses temporary caches of its own on purpose: a first call must compile, an edit must recompile,
a recorded run must miss, and a prewarm must build.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
CELL_TIMEOUT = 900  # seconds; generous: a loaded CI machine can be several times slower than an idle one
HAVE_NBCLIENT = all(importlib.util.find_spec(m) is not None for m in ("nbclient", "nbformat", "ipykernel"))
GPU = torch.cuda.is_available()


def _env(monkeypatch, tmp_path: Path, **extra: str) -> None:
    """The kernel inherits this process's environment: a cache and temp dir of its own, this checkout first
    on the path, and no leftover JITOPS_* settings from the caller."""
    for name in ("JITOPS_CACHE_PATH", "JITOPS_OFFLINE", "JITOPS_RECORD", "JITOPS_BENCH_OUT", "MPLBACKEND"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    for name, value in extra.items():
        monkeypatch.setenv(name, value)


def _text(outputs: list) -> str:
    """Everything a cell printed: streams, results and error tracebacks."""
    parts = []
    for out in outputs:
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif out.get("output_type") in ("execute_result", "display_data"):
            parts.append(out.get("data", {}).get("text/plain", ""))
        elif out.get("output_type") == "error":
            parts.append("\n".join(out.get("traceback", [])))
    return "".join(parts)


class Ran:
    """A notebook after execution: the text each code cell printed, and how many images it showed."""

    def __init__(self, cells: list[str], images: int) -> None:
        self.cells, self.images = cells, images
        self.text = "\n".join(cells)


def execute(path: Path, tmp_path: Path) -> Ran:
    if not HAVE_NBCLIENT:
        return _execute_as_script(path, tmp_path)
    import nbclient
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    notebook = nbformat.read(path, as_version=4)
    # No kernel directories: the "python3" kernel is then ipykernel's own spec, which runs this interpreter
    # (sys.executable), whatever kernelspecs the machine has installed.
    specs = KernelSpecManager(kernel_dirs=[])
    manager = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=specs)
    client = nbclient.NotebookClient(notebook, km=manager, timeout=CELL_TIMEOUT, startup_timeout=120,
                                     resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    try:
        client.execute()
    finally:
        code_cells = [c for c in notebook.cells if c.cell_type == "code"]
        (tmp_path / f"{path.stem}.out.txt").write_text("\n\n".join(_text(c.outputs) for c in code_cells))
    images = sum("image/png" in out.get("data", {}) for c in code_cells for out in c.outputs)
    return Ran([_text(c.outputs) for c in code_cells], images)


def _execute_as_script(path: Path, tmp_path: Path) -> Ran:
    notebook = json.loads(path.read_text())
    cells = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
    script = tmp_path / f"{path.stem}.py"
    script.write_text("\n\n".join(cells) + "\n")
    result = subprocess.run([sys.executable, str(script)], cwd=NOTEBOOK_DIR, capture_output=True, text=True,
                            timeout=CELL_TIMEOUT * 2, env={**os.environ, "MPLBACKEND": "Agg"})
    print(result.stdout + result.stderr)
    assert result.returncode == 0, f"{path.name} failed (run as a script):\n{result.stderr[-6000:]}"
    return Ran([result.stdout + result.stderr], images=-1)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path, tmp_path, monkeypatch):
    _env(monkeypatch, tmp_path)
    ran = execute(path, tmp_path)
    if GPU:
        assert "No GPU here" not in ran.text, "a GPU is present but a notebook cell took its CPU-only branch"
    elif path.stem != "04_performance":
        assert "No GPU here" in ran.text, "no GPU, and no cell said what it skipped"
    if path.stem == "01_quickstart":
        assert "[jitops] compiling" in ran.text  # the first call's progress line reaches the notebook
        assert re.search(r"first call in a fresh process: [\d.]+ ms", ran.text)
    if path.stem == "02_custom_op":
        assert ran.text.count("[jitops] compiling particle_step") >= 2  # first call, then after the edit
        assert "CompileError" in ran.text or "compiling kernel 'particle_step" in ran.text
    if path.stem == "04_performance" and HAVE_NBCLIENT:
        assert ran.images >= 1  # benchmarks/results/jit_latency.json is committed


def _synthetic_result(name: str, metric: str, rows: int) -> dict:
    return {"benchmark": name, "date": "2026-11-22 07:00 UTC", "command": f"python3 benchmarks/bench_{name}.py",
            "device": {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "torch": "2.11.0+cu130",
                       "cuda": "13.0", "driver": "580.159.04"}, "notes": {},
            "rows": [{"op": f"{name} fwd", "shape": f"({1024 * (i + 1)}, 8192)", "dtype": "bf16", "ours_ms": 0.1,
                      "baseline_ms": 0.11, "baseline": "torch", "metric": metric, "ours_rate": 2.5 + i * 0.1,
                      "baseline_rate": 2.3, "speedup": 1.1, "extra": {}} for i in range(rows)]}


@pytest.mark.timeout(600)
def test_performance_notebook_plots_every_benchmark_file(tmp_path, monkeypatch):
    """04 against a full set of results (the real files arrive one benchmark at a time): one figure for the
    latency and one per benchmark and metric, each titled with the device and the date."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "jit_latency.json").write_text((REPO / "benchmarks" / "results" / "jit_latency.json").read_text())
    throughput = {"gelu": "TB/s", "layer_norm": "TB/s", "gemm": "TFLOP/s", "grouped_gemm": "TFLOP/s",
                  "conv2d": "TFLOP/s"}
    for name, metric in throughput.items():
        (results / f"{name}.json").write_text(json.dumps(_synthetic_result(name, metric, rows=3)))
    _env(monkeypatch, tmp_path, JITOPS_BENCH_OUT=str(results))
    ran = execute(NOTEBOOK_DIR / "04_performance.ipynb", tmp_path)
    assert "6 result file(s)" in ran.text
    assert "not measured yet" not in ran.text and "No throughput rows" not in ran.text
    if HAVE_NBCLIENT:
        assert ran.images == 1 + len(throughput)


def test_notebooks_are_built_from_their_sources_without_outputs():
    """The .ipynb files are generated from notebooks/src/*.py (the reviewable source) and carry no outputs."""
    assert [p.stem for p in NOTEBOOKS] == [p.stem for p in sorted((NOTEBOOK_DIR / "src").glob("[0-9][0-9]_*.py"))]
    for path in NOTEBOOKS:
        notebook = json.loads(path.read_text())
        for cell in notebook["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, f"{path.name} has outputs"
    if importlib.util.find_spec("nbformat") is None:
        pytest.skip("nbformat is not installed: cannot rebuild the notebooks to compare")
    result = subprocess.run([sys.executable, str(NOTEBOOK_DIR / "build_notebooks.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_readme_links_every_notebook():
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Notebooks", 1)[1].split("\n## ", 1)[0]
    for path in NOTEBOOKS:
        assert f"(notebooks/{path.name})" in section, f"README's Notebooks section does not link {path.name}"
