"""`jupyter-gpumem run` end to end: the real console script (and `python -m`), a real
kernel started by nbclient, real notebooks.

The kernel replays allocator readings recorded on an H200 (JUPYTER_GPUMEM_REPLAY, a
test-only switch inherited by the kernel nbclient starts): every measured cell then has
non-zero figures (~770 MiB allocated), so `peak<=1B` fails and `peak<=1TiB` holds. The
test without replay checks what a machine without a GPU gets.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from html import escape
from pathlib import Path

import pytest

from jupyter_gpumem.testing.replay import env as replay_env
from tests.fakes import FIXTURES

pytestmark = pytest.mark.kernel

SCRIPT = Path(sys.executable).with_name("jupyter-gpumem")
HOSTILE = "s = '</td></table><script>alert(1)</script><img src=x onerror=alert(2)>'"


def notebook(path: Path, *cells: tuple[str, list[str]] | str) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells.append(nbformat.v4.new_markdown_cell("# a notebook"))
    for c in cells:
        source, tags = (c, []) if isinstance(c, str) else c
        nb.cells.append(nbformat.v4.new_code_cell(source, metadata={"tags": tags}))
    nbformat.write(nb, str(path))
    return path


def run(
    *args: str | Path,
    replay: bool = True,
    module: bool = False,
    cwd: Path | None = None,
    jupyter_path: Path | None = None,
    backend: str | None = None,
):
    env = {k: v for k, v in os.environ.items() if k not in replay_env("")}
    if backend is not None:
        env["JUPYTER_GPUMEM_BACKEND"] = backend
    if jupyter_path is not None:
        env["JUPYTER_PATH"] = str(jupyter_path)
    if replay:
        env.update(replay_env(str(FIXTURES)))
    cmd = [sys.executable, "-m", "jupyter_gpumem"] if module else [str(SCRIPT)]
    p = subprocess.run(
        [*cmd, *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd, timeout=180
    )
    assert "Traceback" not in p.stderr, p.stderr  # the tool never prints one
    return p


def html_elements(text: str) -> tuple[set[str], set[str]]:
    """The element names and attribute names of an HTML document."""
    from html.parser import HTMLParser

    tags: set[str] = set()
    attributes: set[str] = set()

    class Collect(HTMLParser):
        def handle_starttag(self, tag, attrs):
            tags.add(tag)
            attributes.update(name for name, _ in attrs)

    Collect().feed(text)
    return tags, attributes


def validate(doc: dict) -> None:
    import jsonschema

    from jupyter_gpumem.run.report import schema

    jsonschema.Draft202012Validator.check_schema(schema())
    jsonschema.validate(doc, schema(), cls=jsonschema.Draft202012Validator)


# -- exit 0 -------------------------------------------------------------------------------
def test_budgets_hold_files_written(tmp_path):
    nb = notebook(
        tmp_path / "ok.ipynb",
        "import time\nx = 1",
        ("time.sleep(0.3)  # spans replay frames", ["gpumem: peak<=1TiB", "other-tag"]),
        HOSTILE,
        "print('done')",
    )
    html = tmp_path / "report.html"
    html.write_text("old")  # replaced: --force
    out, js = tmp_path / "executed.ipynb", tmp_path / "out.json"
    p = run(
        "run",
        nb,
        "--budget",
        "peak<=1TiB",
        "--budget",
        "kept < 1TiB",
        "--json",
        js,
        "--html",
        html,
        "--output",
        out,
        "--force",
    )
    assert p.returncode == 0, p.stderr
    # progress on stderr, one line per code cell; the table on stdout
    progress = [line for line in p.stderr.splitlines() if re.match(r"\[\d+/\d+\] ", line)]
    assert [line.split("]")[0] + "]" for line in progress] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"]
    assert progress[0].startswith("[1/4] cell 2 [1] `import time`: kept ")
    assert "peak " in progress[0] and progress[0].endswith(" ms")
    assert "cell  [n]  device" in p.stdout and "cuda:0" in p.stdout
    assert "OK (exit 0): 4 code cells ran, peak " in p.stderr
    # JSON: valid against the documented schema, with the numbers of every cell
    doc = json.loads(js.read_text())
    validate(doc)
    assert doc["summary"]["exit_code"] == 0 and doc["summary"]["result"] == "pass"
    assert doc["options"]["budgets"] == ["peak<=1TiB", "kept<1TiB"]
    assert doc["gpu"]["devices"][0]["name"] == "NVIDIA H200"
    # the figures are the recording's, and the document says where it was made
    meta = json.loads(FIXTURES.read_text())["meta"]
    replay = doc["replay"]
    assert (replay["gpu"], replay["torch_version"]) == (meta["device"], meta["torch"])
    assert replay["recorded"] == meta["recorded"]
    assert replay["description"].startswith(
        f"replay: readings recorded on an {meta['device']} with torch {meta['torch']}"
    )
    assert "nothing here is measured on this machine" in replay["description"]
    assert f"jupyter-gpumem: {replay['description']}" in p.stderr  # and the terminal says so
    cells = doc["cells"]
    assert [c["index"] for c in cells] == [1, 2, 3, 4]
    assert [c["execution_count"] for c in cells] == [1, 2, 3, 4]
    assert all(c["measured"] and c["status"] == "ok" for c in cells)
    for c in cells:
        d = c["devices"][0]
        assert d["peak"] > 0 and d["allocated"] > 0
        assert all(b["ok"] is True for b in c["budgets"])
    # the tagged cell: its own peak budget replaced the global one, kept still applies
    assert {(b["expression"], b["scope"]) for b in cells[1]["budgets"]} == {
        ("peak<=1TiB", "cell"),
        ("kept<1TiB", "global"),
    }
    assert doc["summary"]["budgets"] == {"held": 8, "failed": 0, "not_checked": 0}
    # the executed notebook: the kernel's auto-mode lines in each cell, figures in metadata
    executed = json.loads(out.read_text())
    code = [c for c in executed["cells"] if c["cell_type"] == "code"]
    assert len(code) == 4 and executed["cells"][0]["cell_type"] == "markdown"
    for i, c in enumerate(code, 1):
        texts = ["".join(o.get("data", {}).get("text/plain", "")) for o in c["outputs"]]
        assert any(t.startswith(f"gpumem [{i}] ") and t.endswith(" [replay]") for t in texts)
        assert c["metadata"]["jupyter_gpumem"]["measured"] is True
    assert "done\n" in "".join(code[3]["outputs"][0]["text"])
    assert not any("load_ext" in "".join(c["source"]) for c in executed["cells"])  # no setup cell
    run_meta = executed["metadata"]["jupyter_gpumem"]["run"]
    assert run_meta["setup"] == "%load_ext jupyter_gpumem; %gpumem auto on"
    assert run_meta["summary"]["result"] == "pass"
    assert run_meta["replay"] == replay
    # HTML: self-contained, hostile source escaped, the replay's banner above the verdict
    text = html.read_text()
    banner = f'<p class="replay">{escape(replay["description"])}</p>'
    assert banner in text and text.index(banner) < text.index('class="verdict')
    assert text.startswith("<!doctype html>") and "<svg" in text
    low = text.lower()
    assert "http://" not in low and "https://" not in low
    assert "url(" not in low and "@import" not in low
    tags, attributes = html_elements(text)
    assert tags.isdisjoint({"script", "img", "link", "iframe", "object", "embed", "image"})
    assert attributes.isdisjoint({"src", "href", "xlink:href", "onerror", "onload"})
    escaped = (
        "&lt;/table&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;"
    )
    assert escaped in text
    assert text.count("<table>") == 1 and text.count("</table>") == 1
    assert "prefers-color-scheme: dark" in text


def test_python_m_and_no_gpu_figures_without_budgets(tmp_path):
    """Without the replay this CPU machine has no GPU figures: exit 0 and a warning when
    no budget was given; `python -m jupyter_gpumem` is the same command."""
    nb = notebook(tmp_path / "cpu.ipynb", "x = 1", "y = x + 1")
    html = tmp_path / "cpu.html"
    p = run("run", nb, "--json", tmp_path / "cpu.json", "--html", html, replay=False, module=True)
    assert p.returncode == 0, p.stderr
    assert "warning: no GPU figures" in p.stderr
    assert "replay" not in p.stderr
    doc = json.loads((tmp_path / "cpu.json").read_text())
    validate(doc)
    assert doc["summary"]["gpu_figures"] is False
    assert doc["gpu"]["state"] in ("no_torch", "cpu_only", "not_initialized", "no_gpu")
    assert doc["replay"] is None  # measured here: no replay, no banner
    assert 'class="replay"' not in html.read_text()


def test_no_gpu_figures_with_budgets_is_exit_2(tmp_path):
    nb = notebook(tmp_path / "cpu.ipynb", "x = 1")
    p = run("run", nb, "--budget", "peak<=1TiB", "-q", replay=False)
    assert p.returncode == 2, p.stderr
    assert "no GPU figures: budgets can't be checked" in p.stderr
    assert p.stdout == ""  # -q: no table


# -- exit 1 -------------------------------------------------------------------------------
def test_global_budget_fails(tmp_path):
    nb = notebook(tmp_path / "g.ipynb", "x = 1", "y = 2")
    js = tmp_path / "g.json"
    p = run("run", nb, "--budget", "peak<=1B", "--json", js, "--html", tmp_path / "g.html")
    assert p.returncode == 1, p.stderr
    failed = [line for line in p.stderr.splitlines() if line.startswith("jupyter-gpumem: FAILED: ")]
    assert len(failed) == 2
    assert "FAILED: cell 2 [1] `x = 1`: peak " in failed[0]
    assert "> 1 B on cuda:0 (budget peak<=1B from --budget)" in failed[0]
    assert "BUDGET FAILED: peak<=1B" in p.stderr  # in the progress lines too
    assert "FAIL (exit 1): 2 budget checks failed" in p.stderr
    doc = json.loads(js.read_text())
    validate(doc)
    assert doc["summary"]["result"] == "fail" and doc["summary"]["budgets"]["failed"] == 2
    value = doc["cells"][0]["budgets"][0]["value"]
    assert f"({value} B)" in failed[0]  # the exact number, in bytes
    assert "FAIL (exit code 1)" in (tmp_path / "g.html").read_text()


def test_cell_tag_budget_fails(tmp_path):
    nb = notebook(
        tmp_path / "t.ipynb", "x = 1", ("y = 2", ["gpumem: kept<=1TiB; peak<=1B"]), "z = 3"
    )
    p = run("run", nb, "--budget", "peak<=1TiB")
    assert p.returncode == 1, p.stderr
    failed = [line for line in p.stderr.splitlines() if line.startswith("jupyter-gpumem: FAILED: ")]
    assert len(failed) == 1
    assert "cell 3 [2] `y = 2`: peak " in failed[0]
    assert "(budget peak<=1B from the cell's tag)" in failed[0]
    assert "FAIL peak<=1B" in p.stdout


def test_fits_out_of_memory_is_exit_1_with_the_post_mortems_fix(tmp_path):
    """A cell that raises OutOfMemoryError under --fits: the notebook does not fit. (The
    replay kernel answers `who` with a post-mortem recorded on a GPU.)"""
    nb = notebook(
        tmp_path / "oom.ipynb",
        "import torch",
        "raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')",
        "print('not reached')",
    )
    js = tmp_path / "oom.json"
    p = run("run", nb, "--fits", "2GiB", "--json", js)
    assert p.returncode == 1, p.stderr
    assert "cell 3 [2] `raise torch.OutOfMemoryError(" in p.stderr
    assert "ran out of GPU memory under --fits 2.00 GiB: the notebook does not fit" in p.stderr
    assert "the post-mortem's first fix: " in p.stderr
    doc = json.loads(js.read_text())
    validate(doc)
    assert doc["limit"]["bytes"] == pytest.approx(2 << 30, abs=1)
    assert doc["gpu"]["devices"][0]["limit"]["bytes"] == doc["limit"]["bytes"]
    assert doc["cells"][1]["out_of_memory"] and doc["cells"][1]["postmortem_fix"]
    assert doc["cells"][2]["status"] == "not_run"


def test_fits_that_holds(tmp_path):
    nb = notebook(tmp_path / "fit.ipynb", "x = 1")
    p = run("run", nb, "--fits", "24GiB", "-q")
    assert p.returncode == 0, p.stderr
    assert "fits in 24.00 GiB" in p.stderr


# -- exit 2 -------------------------------------------------------------------------------
def test_a_cell_that_raises_stops_the_run(tmp_path):
    nb = notebook(tmp_path / "r.ipynb", "x = 1", "1 / 0", "print('not reached')")
    out, js = tmp_path / "r.executed.ipynb", tmp_path / "r.json"
    p = run("run", nb, "--output", out, "--json", js)
    assert p.returncode == 2, p.stderr
    assert (
        "ERROR (exit 2): the notebook failed to run: cell 3 [2] `1 / 0` raised "
        "ZeroDivisionError: division by zero"
    ) in p.stderr
    doc = json.loads(js.read_text())  # written also when the run failed
    validate(doc)
    assert [c["status"] for c in doc["cells"]] == ["ok", "error", "not_run"]
    executed = json.loads(out.read_text())
    assert executed["cells"][3]["outputs"] == [] and executed["cells"][3]["execution_count"] is None
    assert any(o["output_type"] == "error" for o in executed["cells"][2]["outputs"])
    # --allow-errors: the run goes on, the error is a warning
    p = run("run", nb, "--allow-errors", "-q")
    assert p.returncode == 0, p.stderr
    assert "warning: cell 3 [2] `1 / 0` raised ZeroDivisionError" in p.stderr


def test_a_refused_scan_stops_the_run(tmp_path):
    """A scan that cannot run here (a CPU-only torch) checks nothing: the run fails and
    says which cell and why, as for any cell that raised."""
    torch = pytest.importorskip("torch")
    if torch.version.cuda or torch.version.hip:
        pytest.skip("this torch has a GPU allocator")
    nb = notebook(
        tmp_path / "s.ipynb", "import torch", "%%gpumem --scan batch=16,32\nran = batch", "z = 1"
    )
    js = tmp_path / "s.json"
    p = run("run", nb, "--json", js, replay=False)
    assert p.returncode == 2, p.stderr
    assert (
        "ERROR (exit 2): the notebook failed to run: cell 3 [2] `%%gpumem --scan batch=16,32` "
        f"raised UsageError: --scan needs torch and a CUDA GPU: "
        f"torch {torch.__version__} is a CPU-only "
        "build; the cell did not run"
    ) in p.stderr
    doc = json.loads(js.read_text())
    assert [c["status"] for c in doc["cells"]] == ["ok", "error", "not_run"]


def test_a_refused_dry_run_fails_the_run(tmp_path):
    """A dry run that cannot plan here (a CPU-only torch) plans nothing: the run fails and
    says which cell and why, as a refused scan does."""
    torch = pytest.importorskip("torch")
    if torch.version.cuda or torch.version.hip:
        pytest.skip("this torch has a GPU allocator")
    nb = notebook(tmp_path / "d.ipynb", "import torch", "%%gpumem --dry-run\nplanned = 1", "z = 1")
    p = run("run", nb, replay=False)
    assert p.returncode == 2, p.stderr
    assert (
        "cell 3 [2] `%%gpumem --dry-run` raised UsageError: --dry-run needs torch and a CUDA "
        f"GPU: torch {torch.__version__} is a CPU-only build; the cell did not run"
    ) in p.stderr


def test_raises_exception_and_skip_execution_tags(tmp_path):
    nb = notebook(
        tmp_path / "x.ipynb",
        ("1 / 0", ["raises-exception"]),
        ("1 / 0", ["skip-execution"]),
        "y = 1",
    )
    js = tmp_path / "x.json"
    p = run("run", nb, "--budget", "peak<=1TiB", "--json", js)
    assert p.returncode == 0, p.stderr
    assert "[2/3] cell 3 `1 / 0`: skipped (tagged skip-execution), -" in p.stderr
    doc = json.loads(js.read_text())
    validate(doc)
    assert [c["status"] for c in doc["cells"]] == ["error", "skipped", "ok"]
    assert doc["cells"][0]["expected_error"] is True
    assert doc["summary"]["cells"]["run"] == 2


def test_kernel_death_and_timeout(tmp_path):
    nb = notebook(tmp_path / "d.ipynb", "x = 1", "import os; os._exit(1)", "y = 2")
    p = run("run", nb, "-q")
    assert p.returncode == 2, p.stderr
    assert "the kernel died while running cell 3 `import os; os._exit(1)`" in p.stderr
    nb = notebook(tmp_path / "s.ipynb", "import time; time.sleep(30)", "y = 2")
    p = run("run", nb, "--timeout", "2", "--allow-errors", "-q")  # a timeout always stops
    assert p.returncode == 2, p.stderr
    assert "ran longer than --timeout 2 s (interrupted)" in p.stderr


def test_a_kernel_that_fails_to_start_is_exit_2_with_its_last_words(tmp_path):
    """The kernel's stderr goes to a log, not to the tool's output (ipykernel prints
    warnings and, when it shuts down with a message on its way, tracebacks); its last
    lines are shown when it fails to start."""
    spec = tmp_path / "kernels" / "broken"
    spec.mkdir(parents=True)
    argv = [
        sys.executable,
        "-c",
        "import sys; sys.stderr.write('boom: no such module xyz\\n'); sys.exit(3)",
    ]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "broken", "language": "python"})
    )
    nb = notebook(tmp_path / "nb.ipynb", "x = 1")
    p = run("run", nb, "--kernel", "broken", "-q", jupyter_path=tmp_path)
    assert p.returncode == 2, p.stderr
    assert "did not start" in p.stderr or "died" in p.stderr, p.stderr
    assert "boom: no such module xyz" in p.stderr


def test_usage_errors_write_nothing_and_start_no_kernel(tmp_path):
    nb = notebook(tmp_path / "u.ipynb", "x = 1")
    cases = [
        (["run", tmp_path / "missing.ipynb"], "no such notebook: "),
        (["run", tmp_path], "is a folder, not a notebook"),
        (["run", nb, "--budget", "peak=4GiB"], "--budget: not a budget: 'peak=4GiB'; expected "),
        (["run", nb, "--budget", "peek<=4GiB"], "unknown metric 'peek'"),
        (["run", nb, "--budget", "peak<=4XB"], "bad size in budget"),
        (["run", nb, "--fits", "lots"], "--fits: not a size: 'lots'"),
        (["run", nb, "--timeout", "0"], "must be at least 1 second"),
        (["run", nb, "--kernel", "no-such-kernel"], "no kernel named 'no-such-kernel'"),
        (["run", nb, "--json", tmp_path / "nodir" / "x.json"], "no folder"),
        (["run", nb, "--json", nb], "exists; choose a new file name or add --force"),
        (["run", nb, "--json", tmp_path / "a", "--html", tmp_path / "a"], "name the same file"),
        (["run"], "the following arguments are required"),
        ([], "usage: jupyter-gpumem"),
        (["frobnicate"], "invalid choice"),
    ]
    for args, message in cases:
        p = run(*args)
        assert p.returncode == 2, (args, p.stderr)
        assert message in p.stderr, (args, p.stderr)
    assert "peak<=20GiB" in run("run", nb, "--budget", "peak").stderr  # the accepted form
    (tmp_path / "bad.ipynb").write_text("{not json")
    p = run("run", tmp_path / "bad.ipynb")
    assert p.returncode == 2 and "cannot read" in p.stderr and "as a notebook" in p.stderr
    tagged = notebook(tmp_path / "tag.ipynb", "x = 1", ("y = 1", ["gpumem: peak<4 GiBs"]))
    p = run("run", tagged)
    assert p.returncode == 2
    assert "cell 3 `y = 1`: bad budget tag: bad size in budget 'peak<4 GiBs'" in p.stderr
    existing = tmp_path / "exists.html"
    existing.write_text("keep me")
    p = run("run", nb, "--html", existing)
    assert p.returncode == 2 and "--html" in p.stderr and "exists" in p.stderr
    assert existing.read_text() == "keep me"
    assert sorted(f.name for f in tmp_path.iterdir()) == [
        "bad.ipynb",
        "exists.html",
        "tag.ipynb",
        "u.ipynb",
    ]


def test_hostile_inputs_get_clear_errors_before_any_kernel_starts(tmp_path):
    """What a hostile-input probe found: each is refused up front, naming the option or
    cell and the accepted form, and nothing on disk changes."""
    import json as _json

    nb = notebook(tmp_path / "u.ipynb", "x = 1")
    huge = "9" * 320
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "missing" / "x.json")
    dangling_here = tmp_path / "here.json"
    dangling_here.symlink_to(tmp_path / "not-yet.json")
    doc = _json.loads(nb.read_text())
    doc["cells"][1]["metadata"]["tags"] = 5
    tags5 = tmp_path / "tags5.ipynb"
    tags5.write_text(_json.dumps(doc))
    cases = [
        (["run", "/dev/zero"], "/dev/zero is not a regular file (a device, FIFO or socket)"),
        (["run", fifo], "is not a regular file (a device, FIFO or socket)"),
        (["run", nb, "--budget", f"peak<={huge}GiB"], "--budget: bad size in budget"),
        (["run", nb, "--budget", f"peak<={huge}GiB"], "size too large"),
        (["run", nb, "--fits", f"{huge}GiB"], "--fits: size too large"),
        (["run", tags5], "cell 2 `x = 1`: bad budget tag: the cell's tags must be a list"),
        (["run", tags5], 'e.g. "tags": ["gpumem: peak<=4GiB"]'),
        (["run", nb, "--json", "/dev/full", "--force"], "--json /dev/full: not a regular file"),
        (["run", nb, "--json", dangling], "which does not exist; give a file name"),
        (["run", nb, "--html", dangling_here], "which does not exist; give a file name"),
    ]
    for args, message in cases:
        p = run(*args)
        assert p.returncode == 2, (args, p.stderr)
        assert message in p.stderr, (args, p.stderr)
        assert "Error:" not in p.stderr and len(p.stderr) < 2000, p.stderr  # no raw exception
    tagged = notebook(tmp_path / "tagged.ipynb", ("x = 1", [f"gpumem: peak<={huge}GiB"]))
    p = run("run", tagged)
    assert p.returncode == 2 and "cell 2 `x = 1`: bad budget tag: bad size" in p.stderr
    assert not (tmp_path / "not-yet.json").exists() and not (tmp_path / "missing").exists()


def test_a_notebook_past_the_size_cap_is_refused(tmp_path, monkeypatch):
    from jupyter_gpumem.errors import CliUsageError
    from jupyter_gpumem.run import cli

    nb = notebook(tmp_path / "u.ipynb", "x = 1")
    monkeypatch.setattr(cli, "MAX_NOTEBOOK_BYTES", 100)
    with pytest.raises(CliUsageError, match=r"notebooks up to 100 B are read"):
        cli._read_notebook(nb)


def test_version():
    from jupyter_gpumem import __version__

    p = run("--version", module=True)
    assert p.returncode == 0 and p.stdout.strip() == f"jupyter-gpumem {__version__}"


def test_budgets_apply_to_worker_processes(tmp_path):
    """A cell that forks two ranks: each rank's own peak is checked against the budget
    (rank r peaks at r+3 GiB: peak<=3.5GiB holds for rank 0 and fails for rank 1)."""
    from tests.test_workers import FORK_TWO_RANKS as fork

    nb = notebook(tmp_path / "w.ipynb", fork)
    js = tmp_path / "w.json"
    counting = "jupyter_gpumem.testing.counting:backend"
    p = run("run", nb, "--budget", "peak<=3.5GiB", "--json", js, replay=False, backend=counting)
    assert p.returncode == 1, p.stderr
    failed = [line for line in p.stderr.splitlines() if line.startswith("jupyter-gpumem: FAILED: ")]
    assert len(failed) == 1, p.stderr
    assert (
        "peak 4.00 GiB (4294967296 B) > 3.50 GiB (3758096384 B) on cuda:1 of rank 1 (pid "
        in failed[0]
    )
    doc = json.loads(js.read_text())
    validate(doc)
    devices = doc["cells"][0]["devices"]
    workers = [
        (d["worker"].split(" (")[0], d["index"], d["peak"], d["kept"])
        for d in devices
        if "worker" in d
    ]
    assert workers == [("rank 0", 0, 3 * 2**30, 2**30), ("rank 1", 1, 4 * 2**30, 2 * 2**30)]
    results = [(r.get("worker", "").split(" (")[0], r["ok"]) for r in doc["cells"][0]["budgets"]]
    assert ("rank 0", True) in results and ("rank 1", False) in results
