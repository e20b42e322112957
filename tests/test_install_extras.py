"""The `[lab]` extra installs both frontends the panel runs in, JupyterLab 4 and Notebook 7,
and the README's install section says so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def lab_extra() -> dict[str, str]:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["optional-dependencies"]["lab"]
    return {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower(): r for r in reqs}


def test_the_lab_extra_installs_jupyterlab_4_and_notebook_7():
    extra = lab_extra()
    assert extra == {"jupyterlab": "jupyterlab>=4.4,<5", "notebook": "notebook>=7.4,<8"}


def test_the_readme_says_what_the_lab_extra_adds():
    readme = (ROOT / "README.md").read_text()
    install = readme.split("## Install\n", 1)[1].split("\n## ", 1)[0]
    assert (
        'pip install ".[lab]"          # into the environment that has your torch; '
        "[lab] adds JupyterLab and Notebook 7\n"
    ) in install
