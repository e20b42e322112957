# Two commands on a fresh machine:
#   make lab    install everything (Python venv, the JupyterLab extension) and open JupyterLab
#   make test   install everything and run every check (what CI runs through .ci/run)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of PyTorch (a local wheel on our machines); a plain `torch` would pull
# several GB of CUDA packages. Only the tests and examples use it.
TORCH ?= torch==2.13.0

.PHONY: lab test install lint pytest gpu-test bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test,dev]"
	touch $@

install: $(VENV)/.installed

lab: install
	$(BIN)/jupyter lab examples/

lint: install
	$(BIN)/ruff check jupyter_gpumem gpumem tests benchmarks
	$(BIN)/ruff format --check jupyter_gpumem gpumem tests benchmarks
	$(BIN)/mypy

pytest: install
	$(BIN)/python -m pytest -q -ra tests

test: lint pytest

# On a machine with a CUDA GPU and torch: the GPU tests and the benchmarks.
gpu-test:
	$(PY) -m pytest -q -ra -m gpu tests/gpu

bench:
	$(PY) benchmarks/bench_cell_overhead.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
