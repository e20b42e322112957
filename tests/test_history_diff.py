"""`%gpumem history --diff FILE` through a real IPython shell: the cells the kernel
measured against a saved run, matched by their code. The shell counts GPU memory with the
counting test backend, so each cell's figures are the bytes it allocates."""

from __future__ import annotations

import json

import pytest

from jupyter_gpumem._ipython import current
from jupyter_gpumem.model import RunDiff
from jupyter_gpumem.testing import counting
from tests.conftest import run

G = 1 << 30
SETUP = "from jupyter_gpumem.testing import counting\nG = 1 << 30"


def saved_run(path, keeps):
    """A run document as `jupyter-gpumem run --save` writes it (the fields the comparison
    reads): a setup cell, then one cell per entry of ``keeps`` keeping that many GiB."""
    setup = {
        "index": 1,
        "execution_count": 1,
        "first_line": SETUP.splitlines()[0],
        "source": SETUP,
        "status": "ok",
        "measured": True,
        "devices": [],
    }
    cells, allocated = [setup], 0
    for i, n in enumerate(keeps, 2):
        allocated += n * G
        source = f"counting.allocate({n} * G)"
        dev = {
            "index": 0,
            "kept": n * G,
            "peak": allocated,
            "peak_above_start": n * G,
            "allocated": allocated,
            "reserved": allocated,
            "reserved_delta": n * G,
            "peak_reserved": allocated,
            "kept_at": None,
            "touched": True,
        }
        cells.append(
            {
                "index": i,
                "execution_count": i,
                "first_line": source,
                "source": source,
                "status": "ok",
                "measured": True,
                "devices": [dev],
            }
        )
    doc = {"version": 1, "notebook": "nb.ipynb", "gpu": None, "replay": None, "cells": cells}
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def counted(ip, monkeypatch):
    monkeypatch.setattr(counting, "_state", counting._State())  # this test's own allocator
    current().collector.backend = counting.backend()
    ip.run_cell("%gpumem auto on", store_history=True)
    ip.run_cell(SETUP, store_history=True)
    yield ip
    ip.run_cell("%gpumem auto off", store_history=True)


def cell(ip, code):
    from IPython.utils.capture import capture_output

    with capture_output() as cap:
        result = ip.run_cell(code, store_history=True)
    return result, cap


def test_this_session_against_a_saved_run(counted, tmp_path):
    saved = saved_run(tmp_path / "base.json", [1, 2])
    # GIVEN the first cell typed again as it was saved, the second edited to keep 3 GiB
    cell(counted, "counting.allocate(1 * G)")
    cell(counted, "counting.allocate(3 * G)")
    # WHEN
    result, cap = cell(counted, f"%gpumem history --diff {saved}")
    # THEN the edited cell regressed by exactly 1 GiB, and it says so
    assert result.success, result.error_in_exec
    (shown,) = cap.outputs
    text = shown.data["text/plain"]
    assert text.startswith("GPU memory: this kernel against base.json")
    n = counted.execution_count - 2  # the edited cell's
    assert f"REGRESSION cell [{n}] `counting.allocate(3 * G)` (edited" in text
    assert "code: -counting.allocate(2 * G)\n  code: +counting.allocate(3 * G)" in text
    assert f"REGRESSION: cell [{n}] `counting.allocate(3 * G)` (peak +1.00 GiB, +33.3%)" in text
    assert "cells: 2 same code, 1 edited" in text  # the setup cell is the same cell
    assert "(exit" not in text  # a notebook has no exit code
    assert "REGRESSION" in shown.data["text/html"]
    # the result is a record: -o style use through the API is the same comparison
    from jupyter_gpumem._ipython.cells import cell_sources
    from jupyter_gpumem.analysis.run_diff import compare
    from jupyter_gpumem.analysis.run_documents import parse_tolerance, session_document

    mine = session_document(current().history.last(), cell_sources(counted))
    d = compare(json.loads(saved.read_text()), mine, parse_tolerance("1%"), order_matters=False)
    assert isinstance(d, RunDiff) and d.exit_code == 1
    (c, _, f) = next((c, dd, f) for c, dd, f in d.regressions if f.figure == "kept")
    assert (c.match, f.before, f.after) == ("edited", 2 * G, 3 * G)


def test_the_latest_run_of_a_cell_is_the_one_compared(counted, tmp_path):
    saved = saved_run(tmp_path / "base.json", [1])
    doc = json.loads(saved.read_text())
    doc["cells"][1]["source"] = "counting.allocate(n * G)"
    saved.write_text(json.dumps(doc))
    # GIVEN the cell run first keeping 3 GiB, then again, the same code, keeping 1 GiB
    cell(counted, "n = 3")
    cell(counted, "counting.allocate(n * G)")
    counting.free(3 * G)
    counting.backend().empty_cache()  # (the cache would be carried into the next run)
    cell(counted, "n = 1")
    cell(counted, "counting.allocate(n * G)")
    # THEN the latest run is compared: nothing grew
    _, cap = cell(counted, f"%gpumem history --diff {saved} --tolerance 0")
    text = cap.outputs[0].data["text/plain"]
    assert "REGRESSION" not in text
    assert "cells: 2 same code, 2 added" in text  # n = 3 and n = 1
    assert text.splitlines()[-1].startswith("OK: no figure grew past what is allowed (1 cell")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("%gpumem history --diff {missing}", "no such file"),
        ("%gpumem history --diff {notebook}", "is not a jupyter-gpumem run document"),
        ("%gpumem history --diff {saved} --tolerance 2", "write 2%"),
        ("%gpumem history --tolerance 1%", "--tolerance goes with --diff FILE"),
    ],
)
def test_bad_inputs_are_usage_errors(counted, tmp_path, line, message):
    saved = saved_run(tmp_path / "base.json", [1])
    notebook = tmp_path / "nb.ipynb"
    notebook.write_text(json.dumps({"cells": [], "nbformat": 4}))
    code = line.format(missing=tmp_path / "missing.json", notebook=notebook, saved=saved)
    result, _ = cell(counted, code)
    assert not result.success
    assert message in str(result.error_in_exec)


def test_nothing_measured_yet(ip, tmp_path):
    saved = saved_run(tmp_path / "base.json", [1])
    _, _, cap = run(ip, f"%gpumem history --diff {saved}")
    assert "no measured cells yet to compare" in cap.stdout
