#!/usr/bin/env bash
# Start a throwaway JupyterLab server, run the Playwright tests of the GPU memory
# panel in Debian's Chromium against the real kernel side (the jupyter_gpumem package
# the kernel imports), stop the server. From a clean clone: `make install` first.
#
# Environment (all optional):
#   JUPYTER                 jupyter executable (default: ../.venv-test/bin/jupyter, else PATH)
#   CHROMIUM                browser (default: /usr/bin/chromium)
#   PORT                    server port (default: a free one)
#   JUPYTER_GPUMEM_REPLAY   replay fixture for the kernel (default on a machine without
#                           a GPU: ../jupyter_gpumem/testing/recorded/gpu_readings.json when it exists)
#   GPUMEM_UI_MODE          gpu | replay | none (default: from the above)
#   GPUMEM_UI_SCREENSHOTS   where screenshots go (default: ui-tests/screenshots)
#   GPUMEM_UI_LABEXT_DIR    serve this build of the extension (a folder with its
#                           package.json) even when another one is installed: a git
#                           worktree's jupyter_gpumem/labextension, say
# Extra arguments go to `playwright test` (e.g. -g "not loaded").
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)

if [ -z "${JUPYTER:-}" ]; then
  if [ -x "$ROOT/.venv-test/bin/jupyter" ]; then
    JUPYTER="$ROOT/.venv-test/bin/jupyter"
  else
    JUPYTER=$(command -v jupyter || true)
  fi
fi
if [ -z "$JUPYTER" ] || [ ! -x "$JUPYTER" ]; then
  echo "run.sh: no jupyter executable (set JUPYTER)" >&2
  exit 2
fi
PYTHON="$(dirname "$JUPYTER")/python"
[ -x "$PYTHON" ] || PYTHON=$(command -v python3)

export CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$CHROMIUM" ]; then
  echo "run.sh: no Chromium at $CHROMIUM (apt-get install -y chromium)" >&2
  exit 2
fi

if [ ! -d "$HERE/node_modules/@playwright/test" ]; then
  (cd "$HERE" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund)
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpumem-ui.XXXXXX")
SERVER_PID=""
cleanup() {
  local rc=$?
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "$SERVER_PID" 2>/dev/null || break
      sleep 0.2
    done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
  fi
  if [ $rc -ne 0 ] && [ -f "$WORK/server.log" ]; then
    echo "---- last lines of the server log ($WORK/server.log) ----" >&2
    tail -n 40 "$WORK/server.log" >&2 || true
  else
    rm -rf "$WORK"
  fi
  exit $rc
}
trap cleanup EXIT INT TERM

mkdir -p "$WORK/notebooks" "$WORK/config" "$WORK/runtime" "$WORK/data/labextensions" \
  "$WORK/settings/@jupyterlab/apputils-extension" "$WORK/workspaces"

# A private JUPYTER_PATH entry, searched first: a build of the extension and the kernel spec.
export JUPYTER_PATH="$WORK/data${JUPYTER_PATH:+:$JUPYTER_PATH}"

# The extension as pip installs it (share/jupyter/labextensions/jupyter-gpumem); when it is
# not installed, the freshly built one (npm run build:prod). JupyterLab serves the first
# jupyter-gpumem it finds on its path, so a linked build wins over the installed one.
if [ -n "${GPUMEM_UI_LABEXT_DIR:-}" ]; then
  if [ ! -f "$GPUMEM_UI_LABEXT_DIR/package.json" ]; then
    echo "run.sh: no built extension in GPUMEM_UI_LABEXT_DIR=$GPUMEM_UI_LABEXT_DIR" >&2
    exit 2
  fi
  echo "run.sh: using the build in $GPUMEM_UI_LABEXT_DIR (GPUMEM_UI_LABEXT_DIR)"
  ln -s "$(cd "$GPUMEM_UI_LABEXT_DIR" && pwd)" "$WORK/data/labextensions/jupyter-gpumem"
elif "$JUPYTER" labextension list 2>&1 | grep -q "jupyter-gpumem .*enabled"; then
  echo "run.sh: using the installed jupyter-gpumem extension"
elif [ -f "$ROOT/jupyter_gpumem/labextension/package.json" ]; then
  echo "run.sh: jupyter-gpumem not installed; using the build in jupyter_gpumem/labextension"
  ln -s "$ROOT/jupyter_gpumem/labextension" "$WORK/data/labextensions/jupyter-gpumem"
else
  echo "run.sh: the extension is neither installed nor built (cd labextension && npm ci && npm run build:prod)" >&2
  exit 2
fi

# A clean user profile: no news prompt, no restored workspace.
export JUPYTER_CONFIG_DIR="$WORK/config"
export JUPYTER_RUNTIME_DIR="$WORK/runtime"
export JUPYTERLAB_SETTINGS_DIR="$WORK/settings"
export JUPYTERLAB_WORKSPACES_DIR="$WORK/workspaces"
echo '{"fetchNews": "false", "checkForUpdates": false}' \
  >"$WORK/settings/@jupyterlab/apputils-extension/notification.jupyterlab-settings"

# Where the kernel's figures come from (kernels inherit the server's environment).
HAS_GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  HAS_GPU=1
fi
if [ -z "${JUPYTER_GPUMEM_REPLAY:-}" ] && [ $HAS_GPU -eq 0 ] \
  && [ -f "$ROOT/jupyter_gpumem/testing/recorded/gpu_readings.json" ]; then
  export JUPYTER_GPUMEM_REPLAY="$ROOT/jupyter_gpumem/testing/recorded/gpu_readings.json"
fi
if [ -n "${JUPYTER_GPUMEM_REPLAY:-}" ]; then
  # the replay backend and the attribution recorded beside its fixture, plugged in by
  # import path (jupyter_gpumem/testing/replay.py)
  export JUPYTER_GPUMEM_BACKEND="jupyter_gpumem.testing.replay:from_env"
  export JUPYTER_GPUMEM_ATTRIBUTION="jupyter_gpumem.testing.replay:attribution_from_env"
fi
# The kernel (python3, the server's Python) must import the kernel side.
if ! (cd "$WORK" && "$PYTHON" -c "
import importlib.resources as r
import jupyter_gpumem as m
assert hasattr(m, 'load_ipython_extension')
assert r.files('jupyter_gpumem').joinpath('protocol', 'schema.json').is_file()
") >/dev/null 2>&1; then
  echo "run.sh: $PYTHON cannot import the jupyter_gpumem kernel side (make install)" >&2
  exit 2
fi
if [ -z "${GPUMEM_UI_MODE:-}" ]; then
  if [ -n "${JUPYTER_GPUMEM_REPLAY:-}" ]; then
    GPUMEM_UI_MODE=replay
  elif [ $HAS_GPU -eq 1 ]; then
    GPUMEM_UI_MODE=gpu
  else
    GPUMEM_UI_MODE=none
  fi
fi
export GPUMEM_UI_MODE
echo "run.sh: figures: $GPUMEM_UI_MODE${JUPYTER_GPUMEM_REPLAY:+ ($JUPYTER_GPUMEM_REPLAY)}"

# The server's GPU table (api/gpumem/devices, the "On this GPU" tab) reads a fake NVML
# the tests rewrite: one H200, no process until a test names its kernels' PIDs. Set for
# the server only. Kernels inherit the server's environment, and the kernel side reads
# the same variables (collectors/nvml.py, for the real-torch backend and the OOM
# post-mortem's other processes): a python3 kernel spec on the private JUPYTER_PATH,
# ipykernel's own plus an env entry, blanks it for them, so the panel tests still see
# what they saw before (the GPU, the replay fixture, or neither).
FAKE_NVML="$WORK/fake_nvml.json"
cat >"$FAKE_NVML" <<'JSON'
{"driver": "fake", "devices": [{"name": "NVIDIA H200", "uuid": "GPU-00000000-0000-4000-8000-000000000200", "total": 150109880320, "used": 0, "processes": []}]}
JSON
if ! "$PYTHON" - "$WORK/data/kernels/python3" <<'PY'
import json
import os
import sys

from ipykernel.kernelspec import get_kernel_dict

spec = get_kernel_dict()
spec["env"] = {"JUPYTER_GPUMEM_FAKE_NVML": "", "JUPYTER_GPUMEM_NVML": ""}
os.makedirs(sys.argv[1], exist_ok=True)
with open(os.path.join(sys.argv[1], "kernel.json"), "w") as f:
    json.dump(spec, f, indent=1)
PY
then
  echo "run.sh: cannot write the python3 kernel spec (is ipykernel installed?)" >&2
  exit 2
fi
export GPUMEM_FAKE_NVML="$FAKE_NVML"

if [ -z "${PORT:-}" ]; then
  PORT=$("$PYTHON" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
fi
ALLOW_ROOT=""
if [ "$(id -u)" = "0" ]; then
  ALLOW_ROOT="--allow-root"
fi
TOKEN=$("$PYTHON" -c "import secrets; print(secrets.token_hex(16))")

JUPYTER_GPUMEM_FAKE_NVML="$FAKE_NVML" \
  JUPYTER_GPUMEM_NVML="jupyter_gpumem.testing.fake_nvml:from_env" "$JUPYTER" lab \
  --no-browser \
  --ServerApp.ip=127.0.0.1 \
  --ServerApp.port="$PORT" \
  --ServerApp.port_retries=0 \
  --IdentityProvider.token="$TOKEN" \
  --ServerApp.root_dir="$WORK/notebooks" \
  --LabApp.expose_app_in_browser=True \
  --JupyterNotebookApp.expose_app_in_browser=True \
  ${ALLOW_ROOT:+"$ALLOW_ROOT"} \
  >"$WORK/server.log" 2>&1 &
SERVER_PID=$!

BASE="http://127.0.0.1:$PORT/"
for _ in $(seq 1 120); do
  if curl -fsS -o /dev/null "${BASE}api/status?token=$TOKEN" 2>/dev/null; then
    break
  fi
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "run.sh: the server exited" >&2
    exit 1
  fi
  sleep 0.5
done
curl -fsS -o /dev/null "${BASE}api/status?token=$TOKEN"
echo "run.sh: JupyterLab at $BASE (root $WORK/notebooks)"

export JUPYTER_BASE_URL="$BASE" JUPYTER_TOKEN="$TOKEN" JUPYTER_ROOT_DIR="$WORK/notebooks"
export GPUMEM_UI_PYTHON="$PYTHON"  # the Python whose jupyter-gpumem the demo test starts
export GPUMEM_UI_SCREENSHOTS="${GPUMEM_UI_SCREENSHOTS:-$HERE/screenshots}"
cd "$HERE"
npx --no-install playwright test "$@"
