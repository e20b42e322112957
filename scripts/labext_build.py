"""The build function of the package's build hook (pyproject.toml,
``[tool.hatch.build.hooks.jupyter-builder]``): hatch-jupyter-builder's ``npm_builder``,
after a check that Node.js 20 or newer and npm are on PATH. Without them a build (``pip
install .`` from a clone) stops with one line that says what to install, or to use the
prebuilt wheel, instead of a traceback from inside the build backend.

The hook calls it only when the extension is not built yet (``skip-if-exists``): a wheel
already carries it and needs no Node.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

MIN_NODE = 20


def node_major(node: str) -> int | None:
    """The major version ``node --version`` reports (``v20.11.1`` -> 20), or None."""
    try:
        out = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.match(r"\s*v?(\d+)\.", out)
    return int(m.group(1)) if m else None


def wheel_name(root: Path) -> str:
    """The file name of the wheel this source builds."""
    text = (root / "jupyter_gpumem" / "_version.py").read_text(encoding="utf-8")
    m = re.search(r"__version__\s*=\s*[\"']([^\"']+)[\"']", text)
    return f"jupyter_gpumem-{m.group(1) if m else 'VERSION'}-py3-none-any.whl"


def missing_node(
    which: Callable[[str], str | None] = shutil.which,
    major: Callable[[str], int | None] = node_major,
    root: Path | None = None,
) -> str | None:
    """One line saying what the build lacks (Node.js 20+ and npm), or None when both are
    there."""
    node, npm = which("node"), which("npm")
    if node is None:
        found = "there is no node on PATH"
    else:
        v = major(node)
        if v is None:
            found = f"{node} did not say its version"
        elif v < MIN_NODE:
            found = f"node on PATH is version {v}"
        elif npm is None:
            found = "there is no npm on PATH"
        else:
            return None
    wheel = wheel_name(root or Path.cwd())
    return (
        f"jupyter-gpumem: building its JupyterLab extension needs Node.js {MIN_NODE} or newer "
        f"and npm, and {found}: install them (https://nodejs.org), or install the prebuilt "
        "wheel, which needs neither (`make wheel` on a machine with Node, then "
        f'pip install "{wheel}[lab]")'
    )


def build(target_name: str, version: str, **kwargs: Any) -> None:
    """hatch-jupyter-builder's ``npm_builder``, once Node and npm are known to be there."""
    from hatch_jupyter_builder import npm_builder

    skipped = "--skip-npm" in sys.argv or os.environ.get("HATCH_JUPYTER_BUILDER_SKIP_NPM") == "1"
    if not skipped:
        why = missing_node()
        if why is not None:
            # SystemExit: the build backend ends with this line and no traceback
            raise SystemExit(why)
    npm_builder(target_name, version, **kwargs)
