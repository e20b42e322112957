"""`pip install .` from a clone on a machine without Node: the build of the JupyterLab
extension stops with one line saying what to install (Node.js 20+ and npm) or to use the
wheel, not with a traceback (scripts/labext_build.py, the build hook's function)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_gpumem import __version__

ROOT = Path(__file__).resolve().parent.parent
WHEEL = f"jupyter_gpumem-{__version__}-py3-none-any.whl"


def _load():
    spec = importlib.util.spec_from_file_location("labext_build", ROOT / "scripts/labext_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


labext_build = _load()


def said(found: str) -> str:
    return (
        "jupyter-gpumem: building its JupyterLab extension needs Node.js 20 or newer and npm, "
        f"and {found}: install them (https://nodejs.org), or install the prebuilt wheel, "
        "which needs neither (`make wheel` on a machine with Node, then "
        f'pip install "{WHEEL}[lab]")'
    )


@pytest.mark.parametrize(
    ("on_path", "major", "expected"),
    [
        ({}, None, said("there is no node on PATH")),
        ({"node": "/x/node"}, 20, said("there is no npm on PATH")),
        ({"node": "/x/node", "npm": "/x/npm"}, 18, said("node on PATH is version 18")),
        ({"node": "/x/node", "npm": "/x/npm"}, None, said("/x/node did not say its version")),
        ({"node": "/x/node", "npm": "/x/npm"}, 20, None),
        ({"node": "/x/node", "npm": "/x/npm"}, 24, None),
    ],
)
def test_what_the_build_lacks(on_path, major, expected):
    got = labext_build.missing_node(on_path.get, lambda node: major, ROOT)
    assert got == expected


def test_node_major_reads_node_version(tmp_path):
    node = tmp_path / "node"
    node.write_text("#!/bin/sh\necho v22.3.0\n")
    node.chmod(0o755)
    assert labext_build.node_major(str(node)) == 22
    assert labext_build.node_major(str(tmp_path / "absent")) is None


def test_the_build_hook_uses_it():
    text = (ROOT / "pyproject.toml").read_text()
    hook = text.split("[tool.hatch.build.hooks.jupyter-builder]\n", 1)[1].split("\n[", 1)[0]
    assert 'build-function = "scripts.labext_build.build"' in hook.splitlines()


def test_with_node_it_builds_as_hatch_jupyter_builder_does(monkeypatch):
    import hatch_jupyter_builder

    calls = []
    monkeypatch.setattr(labext_build, "missing_node", lambda: None)
    monkeypatch.setattr(hatch_jupyter_builder, "npm_builder", lambda *a, **k: calls.append((a, k)))
    labext_build.build("wheel", "standard", path="labextension", build_cmd="build:prod")
    assert calls == [(("wheel", "standard"), {"path": "labextension", "build_cmd": "build:prod"})]


def test_without_node_the_build_exits_with_the_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("HATCH_JUPYTER_BUILDER_SKIP_NPM", raising=False)
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as e:
        labext_build.build("wheel", "standard", path="labextension")
    assert e.value.code == said("there is no node on PATH")


def _source_tree(dest: Path) -> Path:
    """The files a clone has (git's), without the built extension."""
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / os.fsdecode(name)
        if src.is_file():
            (dest / src.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / src.relative_to(ROOT))
    return dest


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to list a clone's files")
def test_pip_install_without_node_says_what_to_install_in_one_line(tmp_path):
    pytest.importorskip("hatchling")
    pytest.importorskip("hatch_jupyter_builder")
    tree = _source_tree(tmp_path / "src")
    assert not (tree / "jupyter_gpumem/labextension/static/style.js").exists()
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty)}  # no node, no npm
    p = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"),
            *("-w", str(tmp_path / "dist"), str(tree)),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    out = p.stdout + p.stderr
    assert p.returncode != 0
    # the line, whole, among pip's framing of the backend's output
    assert said("there is no node on PATH") in [line.strip() for line in out.splitlines()], out
    assert "Traceback" not in out, out
