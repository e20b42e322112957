# Two commands on a fresh machine:
#   make lab    install everything (Python venv, the JupyterLab extension) and open JupyterLab
#   make test   install everything and run every check (what CI runs through .ci/run)
PY ?= python3
VENV := .venv
BIN := $(abspath $(VENV)/bin)
export PATH := $(BIN):$(PATH)
# The CPU build of PyTorch (a local wheel on our machines); a plain `torch` would pull
# several GB of CUDA packages. Only the tests and examples use it.
TORCH ?= torch==2.13.0
LABEXT := jupyter_gpumem/labextension/static/style.js
TS_SOURCES := $(shell find labextension/src labextension/style labextension/schema labextension/scripts -type f 2>/dev/null) \
              labextension/package.json labextension/package-lock.json \
              jupyter_gpumem/protocol/schema.json

.PHONY: lab test install labext lint pytest ts-test ui-test ui-deps gpu-test bench clean screenshots architecture

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Build tools first, so that the editable install needs no isolated build environment.
$(VENV)/.tools: $(BIN)/python
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q hatchling editables "hatch-jupyter-builder>=0.9" "jupyterlab>=4.4,<5"
	touch $@

labextension/node_modules/.package-lock.json: labextension/package-lock.json
	cd labextension && npm ci --no-audit --no-fund
	touch $@

$(LABEXT): $(VENV)/.tools labextension/node_modules/.package-lock.json $(TS_SOURCES)
	cd labextension && npm run build:prod

labext: $(LABEXT)

$(VENV)/.installed: $(VENV)/.tools $(LABEXT) pyproject.toml
	$(BIN)/pip install -q --no-build-isolation -e ".[test,dev]"
	$(BIN)/jupyter labextension develop --overwrite .
	@# an editable install skips shared-data: put the server config where a wheel puts it
	mkdir -p $(VENV)/etc/jupyter/jupyter_server_config.d
	cp jupyter-config/server-config/jupyter_gpumem.json $(VENV)/etc/jupyter/jupyter_server_config.d/
	touch $@

install: $(VENV)/.installed

lab: install
	$(BIN)/jupyter lab examples/

lint: install
	$(BIN)/ruff check jupyter_gpumem gpumem tests benchmarks scripts
	$(BIN)/ruff format --check jupyter_gpumem gpumem tests benchmarks scripts
	$(BIN)/mypy
	cd labextension && npm run lint

pytest: install
	$(BIN)/python -m pytest -q -ra tests

ts-test: labextension/node_modules/.package-lock.json
	cd labextension && npm test

# Debian's Chromium for the UI test (root on CI; elsewhere install it yourself).
ui-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	  else echo "UI test needs Debian's chromium: sudo apt-get install chromium" >&2; exit 1; fi; }

ui-test: install ui-deps
	JUPYTER=$(BIN)/jupyter ui-tests/run.sh

# The README's pictures of the panel: taken by the UI tests (ui-tests/screenshots), copied here.
README_SHOTS := tab-overview tab-overview-dark tab-history tab-history-dark tab-segments \
  tab-segments-dark panel-who-replay panel-who-replay-dark panel-who-replay-oom panel-gpu panel-gpu-dark
screenshots: ui-test
	mkdir -p docs/panel
	for s in $(README_SHOTS); do cp ui-tests/screenshots/$$s.png docs/panel/$$s.png; done
	cp ui-tests/screenshots/replay-allocated.png docs/panel.png

test: lint ts-test pytest ui-test

# On a machine with a CUDA GPU and torch: the GPU tests and the benchmarks.
gpu-test:
	$(PY) -m pytest -q -ra -m gpu tests/gpu

bench:
	$(PY) benchmarks/bench_cell_overhead.py
	$(PY) benchmarks/bench_panel.py

# docs/architecture.svg: the import graph, layer by layer (a test fails when it is stale)
architecture:
	$(PY) scripts/architecture.py --write

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache \
	  jupyter_gpumem/labextension labextension/lib labextension/node_modules ui-tests/node_modules
