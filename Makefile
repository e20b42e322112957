# Two commands on a fresh machine:
#   make lab    install into .venv and open JupyterLab; without a GPU, the demo (make demo)
#   make test   install the test environment (.venv-test) and run every check (= .ci/run)
#
# .venv (the main job) sees the packages of the Python that made it (--system-site-packages):
# your torch, CUDA build included, is used as it is; nothing here installs or replaces a torch
# in it. .venv-test gets its own CPU build of torch for the tests.
PY ?= python3
VENV := .venv
TVENV := .venv-test
# The CPU build of PyTorch, for the tests only. Where PyPI serves a CUDA build (several GB),
# make test TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH ?= torch==2.13.0
LABEXT := jupyter_gpumem/labextension/static/style.js
TS_SOURCES := $(shell find labextension/src labextension/style labextension/schema labextension/scripts -type f 2>/dev/null) \
              labextension/package.json labextension/package-lock.json \
              jupyter_gpumem/protocol/schema.json
PY_SOURCES := $(shell find jupyter_gpumem gpumem -name '*.py' -o -name '*.json' 2>/dev/null | grep -v '/labextension/') \
              pyproject.toml examples/demo.ipynb
BUILD_TOOLS := hatchling editables "hatch-jupyter-builder>=0.9" "jupyterlab>=4.4,<5"
ROOT_FLAG = $(if $(filter 0,$(shell id -u)),--allow-root)
# a GPU that this machine's driver lists (the main job then opens JupyterLab, not the demo)
HAS_GPU = $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU')
# more options for jupyter-gpumem demo, e.g. DEMO_ARGS='--port 8890 --no-browser'
DEMO_ARGS ?=

.PHONY: lab demo test install test-install labext wheel wheel-test lint pytest ts-test \
        ui-test ui-deps gpu-test plan-cases bench clean screenshots architecture bench-readme
# a prerequisite that is never up to date
FORCE:

# -- the main job ------------------------------------------------------------------------
# .venv keeps a note of the Python that made it (.venv/.python). A PY given to make
# (`make PY=python3.12 lab`, or PY in the environment) that is another Python makes .venv
# again with it, and says so; without PY, the .venv there is kept.
PY_GIVEN := $(filter command environment,$(firstword $(origin PY)))
PY_ID = import os, sys; print(os.path.realpath(sys.executable), sys.prefix)

$(VENV)/bin/python: $(if $(PY_GIVEN),FORCE)
	@want="$$($(PY) -c '$(PY_ID)')" || { echo "make: PY=$(PY) does not run" >&2; exit 1; }; \
	if [ -x $@ ]; then \
	  had="$$(cat $(VENV)/.python 2>/dev/null)"; \
	  if [ "$$had" = "$$want" ]; then exit 0; fi; \
	  echo "make: PY=$(PY) is $$want, but .venv was made by $${had:-another Python (it has no note of which)}: making .venv again with PY"; \
	  rm -rf $(VENV); \
	fi; \
	set -e; \
	echo "$(PY) -m venv --system-site-packages $(VENV)"; \
	$(PY) -m venv --system-site-packages $(VENV); \
	echo "$$want" > $(VENV)/.python; \
	$(VENV)/bin/python -m pip install -q --upgrade pip

$(VENV)/.tools: $(VENV)/bin/python
	$(VENV)/bin/python -m pip install -q $(BUILD_TOOLS)
	touch $@

# A regular (not editable) install, as `pip install .` makes it.
$(VENV)/.installed: BUILD_BIN = $(abspath $(VENV)/bin)
$(VENV)/.installed: $(VENV)/.tools $(LABEXT) $(PY_SOURCES)
	PATH="$(BUILD_BIN):$$PATH" $(VENV)/bin/python -m pip install -q --no-build-isolation ".[lab]"
	@$(VENV)/bin/python scripts/which_torch.py
	touch $@

install: $(VENV)/.installed

lab: install
	@if [ "$(HAS_GPU)" = "0" ] || [ -z "$(HAS_GPU)" ]; then \
	  echo "make lab: no NVIDIA GPU here (nvidia-smi lists none): opening the demo, which replays readings recorded on an H200"; \
	  $(VENV)/bin/jupyter-gpumem demo --dir examples/.demo $(DEMO_ARGS); \
	else \
	  if [ "$$(id -u)" = 0 ]; then echo "make lab: running as root, so JupyterLab starts with --allow-root"; fi; \
	  $(VENV)/bin/jupyter trust examples/*.ipynb; \
	  $(VENV)/bin/jupyter lab $(ROOT_FLAG) examples/; \
	fi

demo: install
	$(VENV)/bin/jupyter-gpumem demo --dir examples/.demo $(DEMO_ARGS)

# -- building ------------------------------------------------------------------------------
labextension/node_modules/.package-lock.json: labextension/package-lock.json
	cd labextension && npm ci --no-audit --no-fund
	touch $@

# `jupyter labextension build` comes from the JupyterLab of whichever environment asked
# (BUILD_BIN); the package's build hook runs it too.
$(LABEXT): labextension/node_modules/.package-lock.json $(TS_SOURCES)
	cd labextension && PATH="$(BUILD_BIN):$$PATH" npm run build:prod

labext: BUILD_BIN = $(abspath $(TVENV)/bin)
labext: $(TVENV)/.tools $(LABEXT)

# The wheel users install: Python package, prebuilt JupyterLab extension, server config.
# Built with .venv's tools (no torch there).
wheel: BUILD_BIN = $(abspath $(VENV)/bin)
wheel: $(VENV)/.tools $(LABEXT)
	rm -rf dist && mkdir -p dist
	PATH="$(BUILD_BIN):$$PATH" $(VENV)/bin/python -m pip wheel -q --no-deps --no-build-isolation -w dist .
	@ls dist/*.whl

# The built wheel in a clean virtual environment (no source tree on its path): a real
# kernel runs %load_ext gpumem and a %%gpumem cell; the extensions are listed as enabled.
wheel-test: wheel
	rm -rf build/wheel-env
	$(PY) -m venv build/wheel-env
	build/wheel-env/bin/python -m pip install -q --upgrade pip
	build/wheel-env/bin/python -m pip install -q "$$(ls dist/*.whl)[lab]" jupyter_client
	cd build && wheel-env/bin/python ../scripts/smoke_wheel.py

# -- the tests -------------------------------------------------------------------------------
$(TVENV)/bin/python:
	$(PY) -m venv $(TVENV)
	$(TVENV)/bin/python -m pip install -q --upgrade pip

$(TVENV)/.tools: $(TVENV)/bin/python
	$(TVENV)/bin/python -m pip install -q $(TORCH)
	$(TVENV)/bin/python -m pip install -q $(BUILD_TOOLS)
	touch $@

$(TVENV)/.installed: BUILD_BIN = $(abspath $(TVENV)/bin)
$(TVENV)/.installed: $(TVENV)/.tools $(LABEXT) pyproject.toml
	PATH="$(BUILD_BIN):$$PATH" $(TVENV)/bin/python -m pip install -q --no-build-isolation -e ".[test,dev,ray]"
	PATH="$(BUILD_BIN):$$PATH" $(TVENV)/bin/jupyter labextension develop --overwrite .
	@# an editable install skips shared-data: put the server config where a wheel puts it
	mkdir -p $(TVENV)/etc/jupyter/jupyter_server_config.d
	cp jupyter-config/server-config/jupyter_gpumem.json $(TVENV)/etc/jupyter/jupyter_server_config.d/
	touch $@

test-install: $(TVENV)/.installed

lint: test-install
	$(TVENV)/bin/ruff check jupyter_gpumem gpumem tests benchmarks scripts
	$(TVENV)/bin/ruff format --check jupyter_gpumem gpumem tests benchmarks scripts
	$(TVENV)/bin/mypy
	cd labextension && npm run lint

pytest: test-install
	$(TVENV)/bin/python -m pytest -q -ra tests

ts-test: labextension/node_modules/.package-lock.json
	cd labextension && npm test

# Debian's Chromium for the UI test (root on CI; elsewhere install it yourself).
ui-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	  else echo "UI test needs Debian's chromium: sudo apt-get install chromium" >&2; exit 1; fi; }

ui-test: test-install ui-deps
	JUPYTER=$(abspath $(TVENV)/bin/jupyter) ui-tests/run.sh

# The README's pictures of the panel: taken by the UI tests (ui-tests/screenshots), copied here.
README_SHOTS := tab-overview tab-overview-dark tab-history tab-history-dark tab-segments \
  tab-segments-dark panel-who-replay panel-who-replay-dark panel-who-replay-oom panel-gpu panel-gpu-dark \
  status-bar
screenshots: ui-test
	mkdir -p docs/panel
	for s in $(README_SHOTS); do cp ui-tests/screenshots/$$s.png docs/panel/$$s.png; done
	cp ui-tests/screenshots/demo-tour.png docs/panel.png

test: lint ts-test pytest ui-test wheel-test

# On a machine with a CUDA GPU and torch: the GPU tests and the benchmarks.
gpu-test:
	$(PY) -m pytest -q -ra -m gpu tests/gpu

# docs/planning.md's accuracy tables measured again: one JSON line per case (one GPU;
# fsdp_world_cases needs two)
plan-cases:
	$(PY) tests/gpu/dry_run_cases.py
	$(PY) tests/gpu/dry_scan_cases.py
	$(PY) tests/gpu/record_planning.py --scan-cases
	$(PY) tests/gpu/fsdp_world_cases.py --all

bench:
	$(PY) benchmarks/bench_cell_overhead.py
	$(PY) benchmarks/bench_panel.py

# benchmarks/README.md's tables, from benchmarks/results/
bench-readme:
	$(PY) benchmarks/tables.py --write

# docs/architecture.svg: the import graph, layer by layer (a test fails when it is stale)
architecture:
	$(PY) scripts/architecture.py --write

clean:
	rm -rf $(VENV) $(TVENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache \
	  jupyter_gpumem/labextension labextension/lib labextension/node_modules ui-tests/node_modules \
	  examples/.demo
