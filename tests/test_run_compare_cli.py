"""`jupyter-gpumem run --save/--baseline` and `jupyter-gpumem diff` end to end: the real
console script, a real kernel started by nbclient, real notebooks.

The kernel counts GPU memory with the counting test backend (JUPYTER_GPUMEM_BACKEND): the
notebook's own cells allocate exact byte counts (`counting.allocate(N)`), so every figure
is known in advance, and a notebook edited to allocate more regresses by exactly that.
"""

from __future__ import annotations

import json

import pytest

from tests.test_run_cli import notebook, run, validate

pytestmark = pytest.mark.kernel

COUNTING = "jupyter_gpumem.testing.counting:backend"
G = 1 << 30
SETUP = "from jupyter_gpumem.testing import counting\nG = 1 << 30"
KEEP = "counting.allocate({} * G)"
SPIKE = "counting.allocate(2 * G); counting.free(2 * G)"


def counted(*args, **kw):
    return run(*args, replay=False, backend=COUNTING, **kw)


def base(tmp_path, name="base.json", keep=1):
    nb = notebook(tmp_path / "nb.ipynb", SETUP, KEEP.format(keep), SPIKE, "x = 1")
    saved = tmp_path / name
    p = counted("run", nb, "--save", saved, "-q")
    assert p.returncode == 0, p.stderr
    return nb, saved


def test_save_records_what_a_comparison_needs(tmp_path):
    _, saved = base(tmp_path)
    doc = json.loads(saved.read_text())
    validate(doc)
    assert doc["options"] == {
        "budgets": [],
        "fits": None,
        "details": True,
        "track": True,
        "repeat": 1,
        "breakdown_all": False,
    }
    cells = doc["cells"]
    assert [c["source"] for c in cells] == [SETUP, KEEP.format(1), SPIKE, "x = 1"]
    keep, spike, untouched = (c["devices"][0] for c in cells[1:])
    # the kernel's last_cell: the exact peak of reserved memory in each cell
    assert (keep["kept"], keep["peak"], keep["peak_reserved"]) == (G, G, G)
    assert (spike["peak"], spike["peak_reserved"], spike["reserved"]) == (3 * G, 3 * G, 3 * G)
    assert untouched["touched"] is False and untouched["peak_reserved"] == 3 * G
    # tracking was asked for, but this kernel has no torch to record with: no lines
    assert keep["kept_lines"] is None


def test_the_same_notebook_against_its_baseline_passes(tmp_path):
    nb, saved = base(tmp_path)
    js, md = tmp_path / "again.json", tmp_path / "diff.md"
    p = counted("run", nb, "--baseline", saved, "--json", js, "--markdown", md)
    assert p.returncode == 0, p.stderr
    assert "OK (exit 0): 4 code cells ran" in p.stderr
    assert "GPU memory: this run against base.json" in p.stdout
    doc = json.loads(js.read_text())
    validate(doc)
    assert doc["summary"]["baseline"] == {
        "file": str(saved),
        "tolerance": "1%",
        "exit_code": 0,
        "message": "no figure grew past what is allowed (3 cells compared); whole run: cuda:0 "
        "peak 3.00 GiB -> 3.00 GiB",
        "regressions": [],
    }
    assert md.read_text().startswith("### GPU memory: nb.ipynb · ✅ no regression")


def test_a_regression_fails_the_run_and_is_explained(tmp_path):
    _, saved = base(tmp_path)
    # GIVEN the notebook now keeps 1.5 GiB in its second cell, and has a new cell on top
    edited = notebook(
        tmp_path / "edited.ipynb", "y = 0", SETUP, "counting.allocate(3 * G // 2)", SPIKE, "x = 1"
    )
    js, md, html = tmp_path / "b.json", tmp_path / "b.md", tmp_path / "b.html"
    p = counted("run", edited, "--baseline", saved, "--json", js, "--markdown", md, "--html", html)
    # THEN exit 1, and the edited cell is the one that grew, by exactly 0.5 GiB
    assert p.returncode == 1, p.stderr
    failed = [line for line in p.stderr.splitlines() if "FAILED: regression: " in line]
    assert failed[0].startswith(
        "jupyter-gpumem: FAILED: regression: cell 4 [3] `counting.allocate(3 * G // 2)` cuda:0: "
        "peak 1.00 GiB -> 1.50 GiB (1073741824 B -> 1610612736 B), +512.00 MiB (+50.0%), "
        "allowed +10.24 MiB (exact)"
    )
    assert "2 cells higher only because earlier cells keep more" in failed[1]
    assert "FAIL (exit 1): against base.json: cell 4 [3]" in p.stderr
    assert "edited, " in p.stdout and "code: -counting.allocate(1 * G)" in p.stdout
    assert "code: +counting.allocate(3 * G // 2)" in p.stdout
    assert "cell 2 [1] `y = 0` (added)" in p.stdout
    doc = json.loads(js.read_text())
    validate(doc)
    assert doc["summary"]["exit_code"] == 1 and doc["summary"]["result"] == "fail"
    assert doc["summary"]["baseline"]["exit_code"] == 1
    text = md.read_text()
    row = "| cell 4 [3] <code>counting.allocate(3 * G // 2)</code> (edited) | cuda:0 | peak |"
    assert row in text
    assert "**+512.00 MiB (+50.0%)**" in text
    page = html.read_text()
    assert ">base.json</th>" in page and ">this run</th>" in page  # side by side
    assert page.count("<svg") == 2  # one chart per run
    # the two saved runs compared later give the same verdict
    again = tmp_path / "edited.json"
    assert counted("run", edited, "--save", again, "-q").returncode == 0
    p = counted("diff", saved, again, "--markdown", tmp_path / "d.md")
    assert p.returncode == 1, p.stderr
    assert "FAIL (exit 1): cell 4 [3] `counting.allocate(3 * G // 2)`" in p.stderr
    heading = (tmp_path / "d.md").read_text().splitlines()[0]
    assert heading == "### GPU memory: edited.ipynb · ❌ regression"
    # a tolerance that covers the 512 MiB growth lets it pass; one just short does not
    p = counted("diff", saved, again, "--tolerance", "1%,511MiB", "-q")
    assert p.returncode == 1, p.stderr
    p = counted("diff", saved, again, "--tolerance", "1%,512MiB", "-q")
    assert p.returncode == 0, p.stderr
    assert p.stdout == ""  # -q: only the verdict line, on stderr
    assert "OK (exit 0)" in p.stderr


def test_repeat_measures_the_spread_of_reserved(tmp_path):
    # GIVEN a cell whose reserved memory depends on the run (a random-sized spike)
    wobbly = "import random\ncounting.allocate(random.randrange(1, 65) << 20); counting.free(1)"
    nb = notebook(tmp_path / "w.ipynb", SETUP, "counting.allocate(G)", wobbly)
    saved = tmp_path / "w.json"
    p = counted("run", nb, "--save", saved, "--repeat", "3", "-q")
    assert p.returncode == 0, p.stderr
    doc = json.loads(saved.read_text())
    validate(doc)
    assert doc["options"]["repeat"] == 3
    steady = doc["cells"][1]["devices"][0]["spread"]
    assert steady == {"runs": 3, "reserved": [G, G], "peak_reserved": [G, G]}
    spread = doc["cells"][2]["devices"][0]["spread"]
    low, high = spread["reserved"]
    assert spread["runs"] == 3 and G < low <= doc["cells"][2]["devices"][0]["reserved"] <= high
    assert high <= G + (64 << 20)


def test_breakdown_all_puts_auto_mode_s_breakdown_on_in_the_setup_step(tmp_path):
    nb = notebook(tmp_path / "nb.ipynb", SETUP, KEEP.format(1))
    saved = tmp_path / "b.json"
    out = tmp_path / "executed.ipynb"
    p = counted("run", nb, "--save", saved, "--breakdown-all", "--output", out, "-q")
    assert p.returncode == 0, p.stderr
    doc = json.loads(saved.read_text())
    validate(doc)
    assert doc["options"]["breakdown_all"] is True
    setup = json.loads(out.read_text())["metadata"]["jupyter_gpumem"]["run"]["setup"]
    assert setup.endswith("%gpumem auto on --breakdown")
    # the counting device has no torch to break a peak down with: figures, no breakdown
    keep = doc["cells"][1]["devices"][0]
    assert keep["kept"] == G and "breakdown" not in keep


def test_usage_errors_are_exit_2_and_write_nothing(tmp_path):
    nb, saved = base(tmp_path)
    (tmp_path / "not-a-run.json").write_text(json.dumps({"cells": []}))
    (tmp_path / "v9.json").write_text(json.dumps({"version": 9, "cells": []}))
    (tmp_path / "broken.json").write_text("{")
    cases = [
        (["run", nb, "--tolerance", "1%"], "--tolerance goes with --baseline"),
        (["run", nb, "--markdown", tmp_path / "x.md"], "--markdown goes with --baseline"),
        (["run", nb, "--repeat", "3"], "--repeat goes with --save"),
        (["run", nb, "--repeat", "0", "--save", tmp_path / "x.json"], "must be at least 1 run"),
        (["run", nb, "--no-track"], "--no-track goes with --save or --baseline"),
        (["run", nb, "--breakdown-all"], "--breakdown-all goes with --save or --baseline"),
        (["run", nb, "--baseline", tmp_path / "nope.json"], "--baseline "),
        (["run", nb, "--baseline", saved, "--tolerance", "1"], "a bare number is ambiguous"),
        (["run", nb, "--baseline", tmp_path / "v9.json"], "version 9; this jupyter-gpumem"),
        (["run", nb, "--baseline", saved, "--json", saved], "exists; choose a new file name"),
        (["diff", saved], "the following arguments are required"),
        (["diff", saved, tmp_path / "not-a-run.json"], "is not a jupyter-gpumem run document"),
        (["diff", saved, tmp_path / "broken.json"], "is not JSON"),
        (["diff", saved, nb], "nb.ipynb is not a jupyter-gpumem run document"),
        (["diff", saved, tmp_path], "is a folder, not a run document"),
        (["diff", saved, saved, "--tolerance", "5"], "write 5%"),
        (["diff", saved, saved, "--markdown", saved], "exists; choose a new file name"),
    ]
    for args, message in cases:
        p = counted(*args)
        assert p.returncode == 2, (args, p.stderr)
        assert message in p.stderr, (args, p.stderr)
        assert "running" not in p.stderr, args  # refused before any kernel started
    assert sorted(f.name for f in tmp_path.iterdir()) == [
        "base.json",
        "broken.json",
        "nb.ipynb",
        "not-a-run.json",
        "v9.json",
    ]


def test_diff_is_reachable_from_the_console_script_and_python_m(tmp_path):
    _, saved = base(tmp_path)
    for module in (False, True):
        p = run("diff", saved, saved, module=module, replay=False)
        assert p.returncode == 0, p.stderr
        assert "OK (exit 0): no figure grew past what is allowed (3 cells compared)" in p.stderr
    p = run("diff", "--help", replay=False)
    assert p.returncode == 0 and "--tolerance TOL" in p.stdout and "Exit codes" in p.stdout
