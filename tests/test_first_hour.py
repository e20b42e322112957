"""What a new user meets first: the README, the install commands, the demo.

The demo's server and panel are driven in Chromium by the UI tests, and the built wheel in
a clean environment by `make wheel-test` (scripts/smoke_wheel.py); here: the words, the
`jupyter-gpumem demo` command's behaviour, and a real kernel with the demo's environment.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_gpumem import demo

ROOT = Path(__file__).resolve().parent.parent
USER_DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "benchmarks" / "README.md",
    ROOT / "benchmarks" / "bench_panel_browser.md",
]
NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))


def markdown_of(nb: Path) -> str:
    cells = json.loads(nb.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def test_readme_is_short_enough_to_read():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 350, f"README.md has {len(lines)} lines"


DEVELOPMENT_HISTORY = re.compile(
    r"\b(this|that|earlier|previous|next|first|second|third|last) session\b"
    r"|session's start|this round|\bissue \d+|\(issue\)",
    re.IGNORECASE,
)


@pytest.mark.parametrize("path", USER_DOCS + NOTEBOOKS, ids=lambda p: p.name)
def test_user_docs_say_what_it_does_not_how_it_was_developed(path):
    text = markdown_of(path) if path.suffix == ".ipynb" else path.read_text()
    found = DEVELOPMENT_HISTORY.findall(text)
    assert not found, f"{path.name}: {found}"


def test_cost_tables_are_written_from_the_results():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "tables.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("path", [*USER_DOCS, ROOT / "examples" / "ci" / "gpumem-budget.yml"])
def test_no_install_command_names_an_unpublished_package(path):
    # the package is not on PyPI: `pip install jupyter-gpumem` ends in "No matching
    # distribution found"
    assert not re.search(r"pip install\s+[\"']?jupyter-gpumem\b", path.read_text())


def test_the_palette_command_is_named_as_the_panel_names_it():
    src = (ROOT / "labextension" / "src" / "index.ts").read_text()
    label = re.search(r"label: trans\.__\('([^']+)'\)", src)
    assert label is not None
    docs = "\n".join(p.read_text() for p in USER_DOCS)
    assert f"*{label.group(1)}*" in docs
    assert "Open panel" not in docs


def test_the_main_environment_never_gets_a_torch_installed():
    """`.venv` (make lab, make demo) uses the torch of the Python that made it; only the
    test environment installs the CPU build."""
    rules = (ROOT / "Makefile").read_text().split("\n\n")
    main = [r for r in rules if re.search(r"^\$\(VENV\)/", r, re.MULTILINE)]
    test = [r for r in rules if re.search(r"^\$\(TVENV\)/", r, re.MULTILINE)]
    assert main and test
    assert not any("TORCH" in r or "torch" in r.replace("which_torch", "") for r in main)
    assert any("$(TORCH)" in r for r in test)
    assert any("--system-site-packages" in r for r in main)


def test_each_example_says_what_it_needs():
    for nb in NOTEBOOKS:
        first = markdown_of(nb).split("\n\n")[0:3]
        text = " ".join(first)
        assert re.search(r"GPU", text), f"{nb.name} does not say what it needs"
    assert "transformers" in markdown_of(ROOT / "examples" / "before_you_run.ipynb")


# -- jupyter-gpumem demo --------------------------------------------------------------------
def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jupyter_gpumem", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )


def test_demo_print_env_names_the_shipped_recording():
    out = run_cli("demo", "--print-env")
    assert out.returncode == 0, out.stderr
    exports = dict(line.removeprefix("export ").split("=", 1) for line in out.stdout.splitlines())
    assert exports == demo.kernel_env()
    assert Path(exports["JUPYTER_GPUMEM_REPLAY"]).is_file()
    meta = json.loads(Path(exports["JUPYTER_GPUMEM_REPLAY"]).read_text())["meta"]
    assert meta["device"] in demo.recorded_on()


def test_demo_copies_its_notebook_once_and_keeps_the_users_copy(tmp_path):
    folder = demo.prepare(str(tmp_path / "d"))
    copy = folder / "demo.ipynb"
    assert copy.read_bytes() == (ROOT / "examples" / "demo.ipynb").read_bytes()
    copy.write_text("my edits")
    demo.prepare(str(folder))
    assert copy.read_text() == "my edits"


def test_demo_refuses_a_file_as_its_folder(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    out = run_cli("demo", "--dir", str(f), "--no-browser")
    assert out.returncode == 2
    assert "is a file, not a folder" in out.stderr
    assert f.read_text() == "mine"


def test_demo_starts_jupyterlab_with_allow_root_only_as_root(tmp_path, monkeypatch):
    import argparse

    args = argparse.Namespace(port=8899, ip=None, no_browser=True)
    monkeypatch.setattr(demo.os, "geteuid", lambda: 0)
    cmd = demo.lab_command(tmp_path, args)
    assert "--allow-root" in cmd and "--port=8899" in cmd and "--no-browser" in cmd
    assert cmd[1:3] == ["-m", "jupyterlab"]
    monkeypatch.setattr(demo.os, "geteuid", lambda: 1000)
    assert "--allow-root" not in demo.lab_command(tmp_path, args)


def test_demo_notebook_walks_through_each_feature():
    nb = json.loads((ROOT / "examples" / "demo.ipynb").read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    for feature in (
        "%load_ext gpumem",
        "%%gpumem\n",  # a cell report
        "%gpumem who",
        "%gpumem segments",
        "%gpumem history",
        "--scan ",
        "%gpumem limit",  # the out-of-memory post-mortem under a cap
    ):
        assert feature in code, feature
    raising = [c for c in nb["cells"] if "raises-exception" in c["metadata"].get("tags", [])]
    assert len(raising) == 1 and "big = torch.empty" in "".join(raising[0]["source"])
