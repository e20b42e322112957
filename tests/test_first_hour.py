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


CI = [ROOT / "examples" / "ci" / "gpumem-budget.yml", ROOT / "examples" / "ci" / "gpumem-diff.yml"]


@pytest.mark.parametrize("path", [*USER_DOCS, *CI])
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
    lines = out.stdout.splitlines()
    exports = dict(
        x.removeprefix("export ").split("=", 1) for x in lines if x.startswith("export ")
    )
    assert exports == demo.kernel_env()
    recording = Path(exports["JUPYTER_GPUMEM_DEMO_RECORDING"])
    assert recording.is_file()
    assert json.loads(recording.read_text())["meta"]["device"] in demo.recorded_on()
    assert lines[-1].endswith("--ext=jupyter_gpumem.testing.player")


def test_the_demo_kernel_spec_loads_the_player_and_its_recording(tmp_path):
    spec = json.loads((demo.write_kernel_spec(tmp_path) / "kernel.json").read_text())
    assert spec["argv"][0] == sys.executable
    assert spec["argv"][-1] == "--ext=jupyter_gpumem.testing.player"
    assert spec["env"] == demo.kernel_env()
    assert "replay" in spec["display_name"]


def test_the_recording_is_of_the_shipped_notebook_as_it_is():
    """Each code cell of the demo has its recording, in order (else Run All would run a
    changed cell for real): re-record after changing the notebook."""
    from jupyter_gpumem.testing.player import DemoRecording, key

    nb = json.loads((ROOT / "examples" / "demo.ipynb").read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    cells = DemoRecording.load(str(demo.recording())).cells
    assert [key("".join(c["source"])) for c in code] == [key(c.source) for c in cells]
    assert [joined(c["outputs"]) for c in code] == [joined(list(c.outputs)) for c in cells]


def joined(value):
    """nbformat's multi-line strings (lists of lines) as one string each."""
    if isinstance(value, dict):
        return {k: joined(v) for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        return "".join(value)
    return [joined(v) for v in value] if isinstance(value, list) else value


def _trusted(path: Path) -> bool:
    import nbformat
    from nbformat.sign import NotebookNotary

    return bool(NotebookNotary().check_signature(nbformat.read(str(path), as_version=4)))


def test_demo_opens_the_recorded_copy_signed_and_moves_an_edited_one_aside(tmp_path):
    folder, said = demo.prepare(str(tmp_path / "d"))
    copy = folder / "demo.ipynb"
    recorded = (ROOT / "examples" / "demo.ipynb").read_bytes()
    assert copy.read_bytes() == recorded and said is None
    assert _trusted(copy)  # opens trusted: its pictures are drawn
    copy.write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    folder, said = demo.prepare(str(folder))
    assert copy.read_bytes() == recorded  # fresh from the recording again
    aside = folder / "demo-edited-1.ipynb"
    assert said is not None and str(aside) in said
    assert aside.read_text().startswith('{"cells": []')  # nothing of the user's is lost
    copy.write_text('{"cells": [], "metadata": {"mine": 1}, "nbformat": 4, "nbformat_minor": 5}')
    folder, said = demo.prepare(str(folder), keep=True)
    assert '"mine": 1' in copy.read_text() and said is not None and "--keep" in said
    assert _trusted(copy)
    assert not (folder / "demo-edited-2.ipynb").exists()


def test_demo_without_a_folder_leaves_no_temporary_folder(tmp_path):
    with demo.folder_for(None, keep=False) as (folder, _):
        assert (folder / "demo.ipynb").is_file()
        (folder / ".ipynb_checkpoints").mkdir()  # what a kernel and the server write
    assert not folder.exists()
    with demo.folder_for(str(tmp_path / "mine"), keep=False) as (folder, _):
        pass
    assert (folder / "demo.ipynb").is_file()  # a folder the user named stays


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
    assert "--LabApp.default_url=/lab/tree/demo.ipynb" in cmd  # opens the notebook
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


def test_the_demo_server_opens_the_trusted_notebook_by_its_url_and_cleans_up():
    """`jupyter-gpumem demo` as a user starts it: the URL it prints names the notebook, the
    server reads the copy as trusted (every code cell), and stopping it removes its
    temporary folder."""
    import re
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [sys.executable, "-m", "jupyter_gpumem", "demo", "--no-browser", f"--port={port}"]
    proc = subprocess.Popen(
        args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    url = None
    try:
        deadline = time.monotonic() + 90
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            found = re.search(r"(http://(?:localhost|127\.0\.0\.1):\d+/\S*\?token=\w+)", line)
            if found:
                url = found.group(1)
        assert url is not None, "".join(lines)
        assert "/lab/tree/demo.ipynb?token=" in url
        shown = next(x for x in lines if re.match(r"jupyter-gpumem: demo: /", x))
        folder = Path(shown.split()[2]).parent
        assert folder.is_dir()
        base, token = url.split("/lab/tree/", 1)[0], url.rsplit("token=", 1)[1]
        api = f"{base}/api/contents/demo.ipynb?token={token}"
        for attempt in range(20):  # the URL is printed as the server starts listening
            try:
                with urllib.request.urlopen(api, timeout=30) as r:
                    nb = json.loads(r.read())["content"]
                break
            except OSError:
                if attempt == 19 or proc.poll() is not None:
                    raise
                time.sleep(0.5)
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        assert code and all(c["metadata"].get("trusted") is True for c in code)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert not folder.exists()  # no temporary folder left behind


def test_make_lab_on_a_gpu_trusts_the_shipped_notebooks_before_opening_them():
    """On a GPU machine `make lab` opens examples/: its notebooks are signed first, so their
    recorded pictures are drawn (an untrusted notebook's are sanitised to text)."""
    out = subprocess.run(
        ["make", "-n", "lab", "HAS_GPU=1"], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    trust = out.index("/bin/jupyter trust examples/*.ipynb")
    assert trust < out.index("/bin/jupyter lab ")


def test_the_demo_names_the_player_as_the_player_names_itself():
    from jupyter_gpumem.testing import player

    assert demo.PLAYER == player.EXTENSION
    assert demo.kernel_env() == player.env(str(demo.recording()))


@pytest.mark.parametrize("path", CI)
def test_the_ci_examples_commands_are_ones_the_tool_takes(path):
    """Each `jupyter-gpumem` command of an example workflow parses, with its continuation
    lines; the ones that compare runs name files the others write."""
    import shlex

    from jupyter_gpumem.run.cli import build_parser

    text = path.read_text().replace("\\\n", " ")
    commands = [
        shlex.split(m.group(0).replace('"$NOTEBOOK"', "nb.ipynb").split(" | ")[0])
        for m in re.finditer(r"^\s*jupyter-gpumem (run|diff) [^\n]*", text, re.MULTILINE)
    ]
    assert commands
    for argv in commands:
        argv = argv[argv.index("jupyter-gpumem") :]
        build_parser().parse_args(argv[1:])  # exits 2 on an unknown option
    if path.name == "gpumem-diff.yml":
        parsed = [build_parser().parse_args(c[c.index("jupyter-gpumem") + 1 :]) for c in commands]
        saved = {a.save for a in parsed if a.save}
        baselines = {a.baseline for a in parsed} - {None}
        assert baselines and baselines <= saved
        assert "gpumem-baseline.json" in saved
