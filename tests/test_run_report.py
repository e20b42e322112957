"""`jupyter-gpumem run`'s verdict and views from plain records (no kernel): exit codes,
the table, the JSON document against its schema, the HTML report with hostile text."""

from __future__ import annotations

import json

import jsonschema
import nbformat
import pytest

from jupyter_gpumem.run.budgets import effective, parse_budget, tag_budgets
from jupyter_gpumem.run.execute import CellRun, RunResult
from jupyter_gpumem.run.report import (
    annotate_notebook,
    html_report,
    json_document,
    progress_line,
    schema,
    table_text,
)
from jupyter_gpumem.run.verdict import judge

GiB = 1 << 30
HOSTILE = "x = '</code></td><script>alert(1)</script>\" onmouseover=\"alert(2)'"


def dev(index=0, peak=2 * GiB, kept=GiB, allocated=GiB, reserved=3 * GiB, touched=True):
    return {
        "index": index,
        "allocated": allocated,
        "allocated_delta": kept,
        "reserved": reserved,
        "reserved_delta": 0,
        "peak_allocated": peak,
        "peak_above_start": peak - allocated + kept,
        "kept_at": None,
        "touched": touched,
    }


def cell(index, first_line, devices=(), budgets=(), tags=(), status="ok", count=None, **kw):
    c = CellRun(index, first_line, effective(list(budgets), tag_budgets(tags)), **kw)
    c.status = status
    c.execution_count = count if count is not None else (index if status != "not_run" else None)
    c.measured = (status != "not_run" and bool(devices)) or kw.get("measured", False)
    c.devices = list(devices)
    c.wall_time = None if status == "not_run" else 0.25
    return c


def result(*cells, sample=True, **kw):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"# {i}") for i in range(max(c.index for c in cells) + 1)]
    s = {
        "state": "ok",
        "message": "",
        "torch_version": "2.11.0+cu130",
        "devices": [
            {
                "index": 0,
                "name": "NVIDIA H200 <b>",
                "backend": "cuda",
                "total": 140 * GiB,
                "limit": None,
            }
        ],
    }
    return RunResult(nb, "python3", list(cells), 1.7e9, 3.0, "0.1.0", s if sample else None, **kw)


def validate(doc):
    jsonschema.validate(doc, schema(), cls=jsonschema.Draft202012Validator)


def test_pass_with_two_devices_and_an_untouched_cell():
    peak = [parse_budget("peak<=4GiB")]
    r = result(
        cell(0, "model = Net()", [dev(0), dev(1, peak=3 * GiB, kept=0)], peak),
        cell(2, "y = 1", [dev(0, kept=0, peak=GiB, touched=False)], peak),
    )
    v = judge(r, peak, None)
    assert (v.exit_code, v.result) == (0, "pass")
    assert v.headline == (
        "2 code cells ran, peak 3.00 GiB on cuda:1 in cell 1 [0] `model = Net()`, "
        "3 budget checks held"
    )
    table = table_text(r.cells).splitlines()
    assert table[0].split() == [
        "cell",
        "[n]",
        "device",
        "kept",
        "peak",
        "time",
        "budgets",
        "status",
        "code",
    ]
    assert table[2].split() == [
        "1",
        "[0]",
        "cuda:0",
        "+1.00",
        "GiB",
        "2.00",
        "GiB",
        "250.0",
        "ms",
        "ok",
        "model",
        "=",
        "Net()",
    ]
    assert table[3].split() == ["cuda:1", "0", "B", "3.00", "GiB"]  # second device, same cell
    assert progress_line(r.cells[0], 1, 2) == (
        "[1/2] cell 1 [0] `model = Net()`: cuda:0 kept +1.00 GiB, peak 2.00 GiB; "
        "cuda:1 kept 0 B, peak 3.00 GiB, 250.0 ms"
    )
    doc = json_document(r, v, "nb.ipynb", peak, None)
    validate(doc)
    assert doc["summary"]["peak"] == {
        "bytes": 3 * GiB,
        "device": 1,
        "cell_index": 0,
        "execution_count": 0,
    }
    assert doc["cells"][1]["devices"][0]["touched"] is False


def test_exit_codes():
    b = [parse_budget("peak<=1GiB")]
    # a failed budget: 1, named with the cell and the numbers
    v = judge(result(cell(1, "a = f()", [dev()], b)), b, None)
    assert v.exit_code == 1 and v.headline == "1 budget check failed"
    assert v.problems == [
        (
            "cell 2 [1] `a = f()`: peak 2.00 GiB (2147483648 B) > 1.00 GiB (1073741824 B) on "
            "cuda:0 (budget peak<=1GiB from --budget)"
        )
    ]
    # the notebook failed to run: 2, also when a budget failed before
    r = result(
        cell(1, "a = f()", [dev()], b),
        cell(2, "1/0", status="error"),
        cell(3, "z", status="not_run"),
        stopped="cell 3 [2] `1/0` raised ...",
    )
    v = judge(r, b, None)
    assert v.exit_code == 2 and v.headline.startswith("the notebook failed to run: cell 3")
    assert len(v.problems) == 1
    # budgets but no GPU figures anywhere: 2; without budgets: 0 and a warning
    r = result(cell(1, "x = 1", [], measured=True), sample=False)
    assert judge(r, b, None).exit_code == 2
    assert "no GPU figures: budgets can't be checked" in judge(r, b, None).headline
    v = judge(r, [], None)
    assert v.exit_code == 0 and v.warnings == ["no GPU figures: the kernel gave no reading"]
    # a tag budget alone counts as a budget
    r = result(cell(1, "x = 1", [], tags=["gpumem: kept<=0"], measured=True))
    assert judge(r, [], None).exit_code == 2
    # out of memory under --fits: 1 with the fix; a raises-exception cell's error is expected
    oom = cell(
        1,
        "big()",
        [dev()],
        status="error",
        error=("OutOfMemoryError", "CUDA out"),
        oom=True,
        oom_fix="`del blocks` frees 512.00 MiB: enough",
    )
    v = judge(result(oom), [], 2 * GiB)
    assert v.exit_code == 1
    assert v.headline == "the notebook does not fit in 2.00 GiB (cell 2 [1] `big()`)"
    fix = "the post-mortem's first fix: `del blocks` frees 512.00 MiB: enough"
    assert v.problems[0].endswith(fix)
    oom.expected_error = True
    assert judge(result(oom), [], 2 * GiB).exit_code == 0


def test_json_and_notebook_metadata_validate():
    b = [parse_budget("kept<=0")]
    r = result(
        cell(0, "a = 1", [dev()], b, tags=["gpumem: peak<=1TiB"]),
        cell(1, "1/0", [dev(kept=0)], b, status="error", error=("ZeroDivisionError", "x")),
        cell(2, "b = 2", status="not_run"),
        stopped="cell 2 [1] `1/0` raised ZeroDivisionError: x",
        limit={"device": 0, "fraction": 0.1, "bytes": 14 * GiB},
    )
    v = judge(r, b, 14 * GiB)
    doc = json_document(r, v, "nb.ipynb", b, 14 * GiB)
    validate(doc)
    json.dumps(doc)  # plain JSON
    assert doc["summary"]["cells"] == {"code": 3, "run": 2, "measured": 2, "raised": 1}
    assert doc["summary"]["budgets"] == {"held": 2, "failed": 1, "not_checked": 0}
    assert doc["cells"][2]["budgets"] == []
    nb = annotate_notebook(r, doc, "%load_ext jupyter_gpumem; %gpumem auto on")
    nbformat.validate(nb)
    assert nb.cells[0].metadata["jupyter_gpumem"]["budgets"][0]["expression"] == "peak<=1TiB"
    assert nb.metadata["jupyter_gpumem"]["run"]["summary"]["exit_code"] == 2


@pytest.mark.parametrize("bad", [{"version": 2}, {"cells": [{"index": -1}]}])
def test_schema_rejects_drift(bad):
    r = result(cell(0, "a", [dev()]))
    doc = json_document(r, judge(r, [], None), "nb.ipynb", [], None)
    doc.update(bad)
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


def test_html_escapes_everything_and_fetches_nothing():
    b = [parse_budget("peak<=1GiB")]
    r = result(
        cell(0, HOSTILE, [dev()], b),
        cell(1, "<b>y</b>", status="error", error=("E<i>", "<script>")),
    )
    v = judge(r, b, None)
    page = html_report(r, v, json_document(r, v, "<evil>.ipynb", b, None))
    assert "<script>" not in page and 'onmouseover="alert' not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;evil&gt;.ipynb" in page and "NVIDIA H200 &lt;b&gt;" in page
    assert "<b>" not in page and "<i>" not in page
    assert "http://" not in page and "https://" not in page
    assert 'class="verdict error"' in page or 'class="verdict fail"' in page
    assert "<svg" in page and "prefers-color-scheme: dark" in page


REPLAY = {
    "gpu": "NVIDIA H200 <b>",
    "torch_version": "2.11.0+cu130",
    "recorded": "2026-11-21",
    "description": "replay: readings recorded on an NVIDIA H200 <b> are replayed; <script>",
}


def test_a_replay_is_said_in_the_json_the_notebook_and_a_banner():
    r = result(cell(0, "a", [dev()]), replay=REPLAY)
    doc = json_document(r, judge(r, [], None), "nb.ipynb", [], None)
    validate(doc)
    assert doc["replay"] == REPLAY
    nb = annotate_notebook(r, doc, "%load_ext jupyter_gpumem; %gpumem auto on")
    assert nb.metadata["jupyter_gpumem"]["run"]["replay"] == REPLAY
    page = html_report(r, judge(r, [], None), doc)
    banner = (
        '<p class="replay">replay: readings recorded on an NVIDIA H200 &lt;b&gt; are replayed; '
        "&lt;script&gt;</p>"
    )
    assert page.count(banner) == 1 and page.index(banner) < page.index('class="verdict')
    assert "<script>" not in page


def test_live_figures_have_no_replay_and_no_banner():
    r = result(cell(0, "a", [dev()]))
    doc = json_document(r, judge(r, [], None), "nb.ipynb", [], None)
    validate(doc)
    assert doc["replay"] is None
    assert 'class="replay"' not in html_report(r, judge(r, [], None), doc)
    doc["replay"] = {"gpu": "x"}  # a replay says how it was recorded and what it means
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


# -- the JSON document's cells derived from CellRun's fields ----------------------------------
def test_every_field_of_a_cell_run_is_in_the_schema_or_left_out_by_name():
    """A field added to CellRun and forgotten in run/schema.json (or the reverse) fails here,
    naming it."""
    from dataclasses import fields

    from jupyter_gpumem.run import report

    props = set(schema()["$defs"]["cell"]["properties"])
    sent = {
        report._CELL_NAMES.get(f.name, f.name)
        for f in fields(CellRun)
        if f.name not in report._CELL_OMIT
    }
    assert sent - props == set(), "in CellRun, not in the schema (nor in _CELL_OMIT)"
    assert props - sent == set(), "in the schema, no CellRun field gives it"
    names = {f.name for f in fields(CellRun)}
    assert set(report._CELL_NAMES) | set(report._CELL_VALUES) | report._CELL_OMIT <= names


def _old_cell_record(c: CellRun) -> dict:
    """The document's cell as it was written field by field (the reference)."""
    return {
        "index": c.index,
        "execution_count": c.execution_count,
        "first_line": c.first_line,
        "source": c.source,
        "status": c.status,
        "error": None if c.error is None else {"ename": c.error[0], "evalue": c.error[1]},
        "expected_error": c.expected_error,
        "out_of_memory": c.oom,
        "postmortem_fix": c.oom_fix,
        "measured": c.measured,
        "wall_time": c.wall_time,
        "devices": [
            {
                "index": d["index"],
                "kept": d.get("allocated_delta"),
                "peak": d.get("peak_allocated"),
                "peak_above_start": d.get("peak_above_start"),
                "allocated": d.get("allocated"),
                "reserved": d.get("reserved"),
                "reserved_delta": d.get("reserved_delta"),
                "peak_reserved": d.get("peak_reserved"),
                "kept_at": d.get("kept_at"),
                **({"kept_lines": d["kept_lines"]} if "kept_lines" in d else {}),
                **({"breakdown": d["breakdown"]} if d.get("breakdown") else {}),
                **({"spread": d["spread"]} if d.get("spread") else {}),
                "ooms": d.get("ooms"),
                "touched": bool(d.get("touched", True)),
                **({"worker": d["worker"]} if d.get("worker") else {}),
                **({"oom": d["oom"]} if d.get("oom") else {}),
            }
            for d in c.devices
        ],
        "budgets": [r.to_dict() for r in c.results],
    }


def test_a_cells_json_is_what_it_was_byte_for_byte():
    from jupyter_gpumem.run.budgets import check
    from jupyter_gpumem.run.report import cell_record

    devices = [
        {
            "index": 0,
            "allocated_delta": 5,
            "peak_allocated": 9,
            "peak_above_start": 4,
            "allocated": 7,
            "reserved": 11,
            "reserved_delta": 2,
            "peak_reserved": 12,
            "kept_at": "line 2",
            "kept_lines": None,
            "ooms": 1,
            "touched": False,
        },
        {
            "index": 1,
            "allocated_delta": None,
            "peak_allocated": 3,
            "worker": "rank 1 (pid 7)",
            "oom": "asked 2 GiB; largest free 1 GiB",
        },
    ]
    budgets = [parse_budget("peak<=8B")]
    c = CellRun(
        index=3,
        first_line="x = f()",
        source="# a comment\nx = f()",
        budgets=budgets,
        status="error",
        execution_count=4,
        error=("OutOfMemoryError", "CUDA out of memory"),
        expected_error=True,
        wall_time=1.5,
        measured=True,
        devices=devices,
        oom=True,
        oom_fix="halve the batch",
        results=check(budgets, devices),
    )
    assert json.dumps(cell_record(c)) == json.dumps(_old_cell_record(c))
    assert json.dumps(cell_record(CellRun(0, "", []))) == json.dumps(
        _old_cell_record(CellRun(0, "", []))
    )


def test_asked_details_are_written_trimmed_and_validate():
    """--save's details: the kept lines and the breakdown's modules, the 20 largest; the
    breakdown without the protocol's device and event counts; a spread of --repeat."""
    from jupyter_gpumem.run.report import LINES_KEPT, device_record

    lines = [{"line": i, "text": f"x{i} = f()", "bytes": 100 - i, "blocks": 1} for i in range(30)]
    modules = [{"module": f"m.{i}", "activations": 10, "temporaries": i} for i in range(25)]
    breakdown = {
        "device": 0,
        "peak": 9,
        "base": 1,
        "categories": [{"category": "activations", "bytes": 8, "blocks": 2}],
        "phase": "backward",
        "modules": modules,
        "reserved_at_peak": 20,
        "outside_torch": None,
        "exact": True,
        "events": 40,
        "peak_event": 12,
        "counter_peak": 9,
        "note": "",
    }
    row = dev()
    row.update(
        peak_reserved=4 * GiB,
        kept_lines=lines,
        breakdown=breakdown,
        spread={"runs": 3, "reserved": [GiB, 2 * GiB], "peak_reserved": None},
    )
    rec = device_record(row)
    assert [x["line"] for x in rec["kept_lines"]] == list(range(LINES_KEPT))
    assert rec["breakdown"]["modules"] == modules[:LINES_KEPT]
    assert "device" not in rec["breakdown"] and "events" not in rec["breakdown"]
    assert rec["breakdown"]["phase"] == "backward" and rec["peak_reserved"] == 4 * GiB
    assert rec["spread"] == {"runs": 3, "reserved": [GiB, 2 * GiB], "peak_reserved": None}
    r = result(cell(0, "a", [row]))
    r.cells[0].devices = [row]
    doc = json_document(r, judge(r, [], None), "nb.ipynb", [], None, details=True, track=True)
    validate(doc)
    assert doc["cells"][0]["devices"][0]["kept_lines"][0]["text"] == "x0 = f()"
    assert doc["options"]["details"] is True and doc["options"]["track"] is True
    plain = device_record(dev())  # not asked: none of the keys
    assert not {"kept_lines", "breakdown", "spread"} & set(plain)
    assert plain["peak_reserved"] is None
