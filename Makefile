# Two commands on a fresh machine (README, "Set-up", says how long each step takes):
#   make run    set up .venv; prewarm the kernels that `python -m jitops` runs, for $(ARCHS) (its own manifest,
#               `python -m jitops --manifest`; no GPU needed; kernels that need a compiler this machine lacks are
#               reported and skipped); then run every public op against torch on the CPU (and the GPU, if there
#               is one: all but linear), which compiles nothing.  ARCHS=cpu make run: the CPU only.
#   make test   set up .venv, run the test suite (GPU tests run where a GPU is, and skip elsewhere)
ARCHS ?= sm_80,sm_90a,cpu
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: run test setup clean
run: setup
	$(PY) -m jitops --manifest --arch $(ARCHS) > $(VENV)/jitops-run-manifest.json
	$(PY) -m cache_tools prewarm --manifest $(VENV)/jitops-run-manifest.json --skip-unbuildable
	$(PY) -m jitops

test: setup
	$(PY) -m pytest -q

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: a bare "torch" requirement would pull several GB of CUDA packages on a CPU box.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	touch $@

clean:
	rm -rf $(VENV) build dist *.egg-info
