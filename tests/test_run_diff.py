"""Two runs compared (analysis/run_diff.py) on run documents, plain records: the judgment of
each figure against the tolerance or its spread, what grew only because earlier cells keep
more, why (breakdowns recorded on an H100, kept lines from a snapshot recorded on a GPU),
the exit code, and the views (text, Markdown, HTML)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from jupyter_gpumem.analysis.run_diff import DEFAULT_SPREAD, compare
from jupyter_gpumem.analysis.run_documents import (
    check_document,
    parse_tolerance,
    session_document,
)
from jupyter_gpumem.errors import DiffInputError
from jupyter_gpumem.model import DeviceRow, HistoryRow
from jupyter_gpumem.reporters.run_diff import diff_markdown, diff_text, headline
from jupyter_gpumem.reporters.run_diff_html import diff_html, diff_page

MiB, GiB = 1 << 20, 1 << 30
TOL = parse_tolerance("1%")


def dev(peak=GiB, kept=0, allocated=GiB, reserved=2 * GiB, reserved_delta=0, **kw):
    return {
        "index": 0,
        "kept": kept,
        "peak": peak,
        "peak_above_start": peak - (allocated - kept),
        "allocated": allocated,
        "reserved": reserved,
        "reserved_delta": reserved_delta,
        "peak_reserved": kw.pop("peak_reserved", reserved),
        "kept_at": None,
        "touched": True,
        **kw,
    }


def cell(index, source, *devices, status="ok", count=None):
    return {
        "index": index,
        "execution_count": count if count is not None else index,
        "first_line": source.splitlines()[0],
        "source": source,
        "status": status,
        "error": None,
        "measured": True,
        "devices": list(devices),
    }


def doc(*cells, gpu="NVIDIA H200", torch="2.11.0+cu130", result="pass"):
    return {
        "version": 1,
        "notebook": "train.ipynb",
        "gpu": {"state": "ok", "torch_version": torch, "devices": [{"index": 0, "name": gpu}]},
        "replay": None,
        "cells": list(cells),
        "summary": {"result": result, "message": "the notebook failed to run: boom"},
    }


def figure(diff, n, name, device=0):
    return diff.cells[n].devices[device].figure(name)


# -- inputs ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "relative", "absolute"),
    [
        ("1%", 0.01, 0),
        ("0.5%", 0.005, 0),
        ("64MiB", 0, 64 * MiB),
        ("1%,64MiB", 0.01, 64 * MiB),
        (" 2% , 1GB ", 0.02, 10**9),
        ("0", 0, 0),
        ("0%", 0, 0),
    ],
)
def test_tolerances(text, relative, absolute):
    t = parse_tolerance(text)
    assert (t.relative, t.absolute) == (pytest.approx(relative), absolute)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "1",
            "a bare number is ambiguous; write 1% (of the first run's figure) or a size",
        ),
        ("0.5", "write 0.5%"),
        ("abc%", "'abc%' is not a percentage"),
        ("-1%", "a share must be 0% or more"),
        ("nan%", "a share must be 0% or more"),
        ("", "expected a share such as 1% or a size"),
        ("1%,", "expected a share such as 1% or a size"),
        ("lots", "not a size"),
    ],
)
def test_bad_tolerances_say_what_is_expected(text, message):
    with pytest.raises(DiffInputError, match="--tolerance") as e:
        parse_tolerance(text)
    assert message in str(e.value)


def test_the_allowed_growth_is_the_larger_of_the_share_and_the_size():
    t = parse_tolerance("1%,64MiB")
    assert t.allowed(GiB) == 64 * MiB  # 1% of 1 GiB is 10.24 MiB
    assert t.allowed(100 * GiB) == GiB  # 1% of 100 GiB
    assert t.allowed(-GiB) == 64 * MiB  # kept can be negative: a share of its size


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1, 2], "x.json is not a jupyter-gpumem run document"),
        ({"cells": []}, "is not a jupyter-gpumem run document"),
        ({"version": 2, "cells": []}, "version 2; this jupyter-gpumem reads version 1: upgrade"),
        ({"version": "1", "cells": []}, "version '1'"),
        ({"version": 1, "cells": {}}, "its cells are not a list of cell records"),
        ({"version": 1, "cells": [{"devices": 3}]}, "its cells are not a list"),
    ],
)
def test_a_document_that_is_not_a_run_is_refused(value, message):
    with pytest.raises(DiffInputError) as e:
        check_document(value, "x.json")
    assert message in str(e.value)


# -- the figures -----------------------------------------------------------------------------
def test_the_same_run_has_no_change():
    a = doc(cell(1, "import torch"), cell(2, "x = f()", dev(kept=GiB, allocated=GiB)))
    d = compare(a, copy.deepcopy(a), TOL)
    assert d.exit_code == 0 and not d.regressions
    assert {f.outcome for c in d.cells for dd in c.devices for f in dd.figures} == {"same"}
    assert [c.match for c in d.cells] == ["same", "same"]
    assert headline(d).startswith("no figure grew past what is allowed (1 cell compared)")


def test_an_exact_figure_may_grow_by_the_tolerance_and_not_one_byte_more():
    # GIVEN a peak of 100 MiB: 1% allows exactly 1 MiB
    base = 100 * MiB
    a = doc(cell(1, "x = f()", dev(peak=base, allocated=0, reserved=base)))
    for extra, outcome in ((0, "same"), (MiB, "within"), (MiB + 1, "regression")):
        b = doc(cell(1, "x = f()", dev(peak=base + extra, allocated=0, reserved=base)))
        f = figure(compare(a, b, TOL), 0, "peak")
        # THEN
        assert (f.judged, f.allowed, f.change, f.outcome) == ("exact", MiB, extra, outcome)
        assert compare(a, b, TOL).exit_code == (1 if outcome == "regression" else 0)
    b = doc(cell(1, "x = f()", dev(peak=base - MiB - 1, allocated=0, reserved=base)))
    assert figure(compare(a, b, TOL), 0, "peak").outcome == "improvement"


def test_reserved_is_judged_against_the_default_spread_and_says_so():
    share, floor = DEFAULT_SPREAD
    a = doc(cell(1, "x = f()", dev(reserved=GiB, peak_reserved=GiB)))
    allowed = max(int(share * GiB), floor) + TOL.allowed(GiB)
    b = doc(cell(1, "x = f()", dev(reserved=GiB + allowed, peak_reserved=GiB)))
    f = figure(compare(a, b, TOL), 0, "reserved")
    assert (f.judged, f.allowed, f.outcome) == ("spread", allowed, "within")
    assert f.spread is not None and not f.spread.measured
    b["cells"][0]["devices"][0]["reserved"] += 1
    d = compare(a, b, TOL)
    assert figure(d, 0, "reserved").outcome == "regression" and d.exit_code == 1
    assert "default spread" in diff_text(d) and "not measured" in diff_text(d)


def test_reserved_is_judged_against_the_spread_measured_over_repeated_runs():
    a = doc(
        cell(
            1,
            "x = f()",
            dev(
                reserved=GiB,
                spread={
                    "runs": 3,
                    "reserved": [GiB - 40 * MiB, GiB + 300 * MiB],
                    "peak_reserved": None,
                },
            ),
        )
    )
    tol = TOL.allowed(GiB)
    ok = doc(cell(1, "x = f()", dev(reserved=GiB + 300 * MiB + tol, peak_reserved=GiB)))
    f = figure(compare(a, ok, TOL), 0, "reserved")
    assert f.spread is not None and f.spread.measured and f.spread.runs == 3
    assert (f.allowed, f.outcome) == (300 * MiB + tol, "within")
    bad = doc(cell(1, "x = f()", dev(reserved=GiB + 300 * MiB + tol + 1, peak_reserved=GiB)))
    assert figure(compare(a, bad, TOL), 0, "reserved").outcome == "regression"
    # the whole run's reserved (what the last cell left) is judged the same way
    (whole,) = compare(a, ok, TOL).run
    assert whole.figure("reserved").spread.measured
    assert whole.figure("reserved").outcome == "within" and not whole.regressions
    assert compare(a, bad, TOL).run[0].figure("reserved").outcome == "regression"
    # a figure without a measured spread (peak_reserved: None) falls back to the default
    assert not figure(compare(a, ok, TOL), 0, "peak_reserved").spread.measured
    # exact figures never use a spread
    assert figure(compare(a, ok, TOL), 0, "peak").spread is None
    assert "measured over repeated runs" in diff_text(compare(a, bad, TOL))


def test_what_a_cell_began_with_is_carried_not_its_own():
    # GIVEN cell 2 now keeps 1 GiB more, and cell 3 (unchanged) peaks 1 GiB higher
    a = doc(
        cell(
            1,
            "model = load()",
            dev(peak=GiB, kept=GiB, allocated=GiB, reserved=GiB, reserved_delta=GiB),
        ),
        cell(
            2,
            "y = model(x)",
            dev(peak=3 * GiB, kept=0, allocated=GiB, reserved=3 * GiB, reserved_delta=2 * GiB),
        ),
    )
    b = doc(
        cell(
            1,
            "model = load()",
            dev(
                peak=2 * GiB,
                kept=2 * GiB,
                allocated=2 * GiB,
                reserved=2 * GiB,
                reserved_delta=2 * GiB,
            ),
        ),
        cell(
            2,
            "y = model(x)",
            dev(peak=4 * GiB, kept=0, allocated=2 * GiB, reserved=4 * GiB, reserved_delta=2 * GiB),
        ),
    )
    d = compare(a, b, TOL, ("base.json", "this run"))
    first, second = d.cells
    assert not first.carried_only and figure(d, 0, "kept").outcome == "regression"
    assert second.carried_only
    peak = figure(d, 1, "peak")
    assert (peak.change, peak.carried, peak.own, peak.inherited) == (GiB, GiB, 0, True)
    (why,) = second.devices[0].why
    assert (why.kind, why.name, why.before, why.after) == ("carried", "allocated", GiB, 2 * GiB)
    said = "it began with +1.00 GiB allocated (1.00 GiB -&gt; 2.00 GiB): earlier cells keep more"
    assert said in diff_html(d)
    assert not second.devices[0].notes  # nothing else to explain
    assert d.exit_code == 1
    assert headline(d).startswith(
        "cell 2 [1] `model = load()` (peak +1.00 GiB, +100.0%) grew past what is allowed; 1 cell "
        "only because earlier cells keep more"
    )
    text = diff_text(d)
    assert "higher only because earlier cells keep more" in text
    assert text.count("REGRESSION cell") == 1  # the carried cell is not listed as its own


def test_moved_edited_added_and_removed_cells_are_compared_with_their_own_figures():
    a = doc(
        cell(1, "import torch", dev(peak=0, allocated=0, reserved=0)),
        cell(2, "x = torch.zeros(1 << 28)", dev(peak=GiB, kept=GiB)),
        cell(3, "plot(x)", dev(peak=GiB)),
        cell(4, "old = keep(x)", dev(peak=GiB)),
        cell(5, "z = f(x, batch=32)", dev(peak=3 * GiB)),
    )
    b = doc(
        cell(1, "import torch", dev(peak=0, allocated=0, reserved=0)),
        cell(2, "plot(x)", dev(peak=GiB)),  # moved up
        cell(4, "x = torch.zeros(1 << 28)", dev(peak=GiB, kept=GiB)),
        cell(5, "z = f(x, batch=64)", dev(peak=5 * GiB)),  # edited
        cell(6, "new_cell = 1", dev(peak=GiB)),  # added
    )
    d = compare(a, b, TOL)
    got = [
        (c.match, c.before and c.before.first_line, c.after and c.after.first_line) for c in d.cells
    ]
    assert got == [
        ("same", "import torch", "import torch"),
        ("moved", "plot(x)", "plot(x)"),
        ("same", "x = torch.zeros(1 << 28)", "x = torch.zeros(1 << 28)"),
        ("removed", "old = keep(x)", None),
        ("edited", "z = f(x, batch=32)", "z = f(x, batch=64)"),
        ("added", None, "new_cell = 1"),
    ]
    # the moved cell is compared with itself, not with what stands at its old place
    assert figure(d, 1, "peak").outcome == "same"
    edited = d.cells[4]
    assert edited.code == ("-z = f(x, batch=32)", "+z = f(x, batch=64)")
    assert figure(d, 4, "peak").change == 2 * GiB
    assert [c.ref.first_line for c, _, _ in d.regressions] == ["z = f(x, batch=64)"]
    # added and removed cells carry their one side's figures, not judged
    assert figure(d, 5, "peak").after == GiB and figure(d, 5, "peak").outcome == "no_figure"
    assert figure(d, 3, "peak").before == GiB
    assert "1 moved, 1 edited, 1 added, 1 removed" in diff_text(d)


def test_documents_without_the_cells_code_match_by_first_line_and_say_so():
    a = doc(cell(1, "x = f()\nmore()", dev()))
    b = doc(cell(1, "x = f()\nother()", dev(peak=2 * GiB)))
    for c in a["cells"]:
        del c["source"]
    d = compare(a, b, TOL, ("old.json", "new.json"))
    assert d.matched_by == "first line" and d.cells[0].match == "same"
    assert any("matched by their first line: old.json does not record" in w for w in d.warnings)


def test_a_workers_device_is_matched_across_runs_without_its_pid():
    a = doc(cell(1, "spawn()", dev(), dev(peak=GiB, worker="rank 1 (pid 4242)")))
    b = doc(cell(1, "spawn()", dev(), dev(peak=3 * GiB, worker="rank 1 (pid 5151)")))
    d = compare(a, b, TOL)
    ((_, device, f),) = [(c, dd, ff) for c, dd, ff in d.regressions if ff.figure == "peak"]
    assert (device.worker, f.before, f.after) == ("rank 1", GiB, 3 * GiB)


def test_a_device_a_cell_now_uses_counts_from_zero():
    a = doc(cell(1, "x = f()", dev()))
    second = dict(dev(peak=GiB, kept=GiB), index=1)
    b = doc(cell(1, "x = f()", dev(), second))
    d = compare(a, b, TOL)
    f = d.cells[0].devices[1].figure("peak")
    assert (f.before, f.after, f.outcome) == (0, GiB, "regression")


def test_a_second_run_that_failed_is_exit_2_and_other_hardware_is_warned_about():
    a = doc(cell(1, "x = f()", dev()))
    b = doc(cell(1, "x = f()", dev()), gpu="NVIDIA A100", torch="2.12.0", result="error")
    d = compare(a, b, TOL, ("main.json", "branch.json"))
    assert d.exit_code == 2 and d.error == "the notebook failed to run: boom"
    assert any(
        "different GPUs (main.json: NVIDIA H200; branch.json: NVIDIA A100)" in w for w in d.warnings
    )
    assert any("different torch versions" in w for w in d.warnings)
    assert headline(d).startswith("branch.json did not complete")


def test_a_cell_that_now_raises_says_so():
    a = doc(cell(1, "x = f()", dev()))
    b = doc(cell(1, "x = f()", status="error"))
    b["cells"][0]["error"] = {"ename": "OutOfMemoryError", "evalue": "CUDA out of memory"}
    b["cells"][0]["measured"] = False
    d = compare(a, b, TOL, ("a", "b"))
    assert d.cells[0].devices == ()
    assert d.cells[0].notes == ("raised OutOfMemoryError in b",)


# -- why: recorded on a GPU --------------------------------------------------------------------
RECORDED = json.loads((Path(__file__).parent / "fixtures" / "breakdown.json").read_text())


def recorded_breakdown(name):
    """A breakdown replayed from a trace recorded on an H100, as a run document keeps it."""
    from jupyter_gpumem.protocol.convert import to_protocol
    from jupyter_gpumem.run.report import _breakdown
    from tests.test_breakdown import replay

    b = replay(RECORDED["cases"][name])
    return b, _breakdown(to_protocol(b))


def test_why_names_the_categories_and_modules_whose_bytes_changed():
    # GIVEN a cell that ran a forward pass in the first run and a training step in the
    # second (the same code, what an earlier cell set up changed), both recorded on an H100
    fwd, fwd_doc = recorded_breakdown("forward")
    step, step_doc = recorded_breakdown("first_adamw_step")
    first, second = sorted([(fwd, fwd_doc), (step, step_doc)], key=lambda b: b[0].peak)
    lo, hi = first[0], second[0]
    assert lo.peak < hi.peak
    a = doc(cell(1, "run(model, xb)", dev(peak=lo.peak, allocated=0, breakdown=first[1])))
    b = doc(cell(1, "run(model, xb)", dev(peak=hi.peak, allocated=0, breakdown=second[1])))
    # WHEN
    d = compare(a, b, parse_tolerance("0"))
    # THEN the peak regressed, and the reasons are the categories whose bytes changed,
    # with the recorded bytes on each side, largest growth first
    assert figure(d, 0, "peak").outcome == "regression"
    why = d.cells[0].devices[0].why
    categories = [w for w in why if w.kind == "category"]
    changed = {
        x.category
        for x in (*lo.categories, *hi.categories)
        if lo.bytes_of(x.category) != hi.bytes_of(x.category)
    }
    assert categories and {w.name for w in categories} <= changed
    assert len(categories) == min(len(changed), 6)
    for w in categories:
        assert (w.before or 0, w.after or 0) == (lo.bytes_of(w.name), hi.bytes_of(w.name))
    # the categories of tensors by growth, then the allocator's rounding and what was
    # there before the cell, which are not what the code made
    later = ("block slack", "kept from before")
    order = [(w.name in later, -w.change) for w in categories]
    assert order == sorted(order)
    lo_m = {m.module: m.bytes for m in lo.modules}
    hi_m = {m.module: m.bytes for m in hi.modules}
    modules = [w for w in why if w.kind == "module"]
    assert len(modules) == min(6, sum(lo_m.get(k, 0) != hi_m.get(k, 0) for k in {**lo_m, **hi_m}))
    for w in modules:
        assert (w.before or 0, w.after or 0) == (lo_m.get(w.name, 0), hi_m.get(w.name, 0))
    text = diff_text(d)
    assert f"category {categories[0].name} at the peak: " in text


def test_block_slack_that_grew_more_comes_after_the_tensors_that_grew():
    """Recorded on an H200 (benchmarks/results/h200-regression-corpus.jsonl, GPT-2 with
    sequences of 260 tokens instead of 256): the allocator's rounding grew by more than
    the activations did, but the activations are what the code changed."""

    def breakdown(activations, temporaries, slack, peak):
        cats = {
            "parameters": 34134016,
            "optimizer state": 68268032,
            "activations": activations,
            "temporaries": temporaries,
            "block slack": slack,
        }
        return {
            "peak": peak,
            "phase": "backward",
            "categories": [{"category": k, "bytes": v, "blocks": 1} for k, v in cats.items()],
            "modules": [],
        }

    a = doc(
        cell(
            1,
            "step()",
            dev(peak=794964992, breakdown=breakdown(452405248, 235963392, 4194304, 794964992)),
        )
    )
    b = doc(
        cell(
            1,
            "step()",
            dev(peak=814641152, breakdown=breakdown(459481088, 240683008, 12075008, 814641152)),
        )
    )
    why = compare(a, b, TOL).cells[0].devices[0].why
    assert [(w.name, w.change) for w in why if w.kind == "category"] == [
        ("activations", 459481088 - 452405248),
        ("temporaries", 240683008 - 235963392),
        ("block slack", 12075008 - 4194304),
    ]


def test_why_names_the_lines_that_keep_more_from_a_recorded_snapshot():
    """The kept lines of a cell recorded on a GPU (tests/gpu/record_attribution.py), through
    the same conversion as `run --save`: against a first run where the cell kept nothing,
    each line is new, with its recorded bytes."""
    from jupyter_gpumem.analysis.cell_sites import cell_attribution
    from jupyter_gpumem.protocol.convert import to_protocol
    from tests.test_attribution_recorded import DATA, held

    rec = DATA["cells"]
    _, cells, snap, resolver = held(rec)
    last = rec["truth"]["last_cell"]
    known = {address: size for _, address, size in rec["known_before_last_cell"]}
    att = cell_attribution(snap, 0, cells.files_of(last["execution_count"]), known, resolver)
    lines = [to_protocol(s) for s in att.lines]
    kept = sum(x["bytes"] for x in lines)
    source = "total = 0\nloss = net(xb).square().mean()\ntotal = total + loss"
    a = doc(cell(1, source, dev(peak=GiB, kept=0, allocated=GiB, kept_lines=[])))
    b = doc(
        cell(1, source, dev(peak=GiB + kept, kept=kept, allocated=GiB + kept, kept_lines=lines))
    )
    d = compare(a, b, TOL)
    why = d.cells[0].devices[0].why
    # THEN each recorded line is new in the second run, with its recorded bytes
    assert [(w.kind, w.before, w.after) for w in why] == [
        ("new_line", None, n) for _, n in last["lines"]
    ]
    assert why[0].name == f"line {last['lines'][0][0]} `loss = net(xb).square().mean()`"
    assert "now keeps 8.00 MiB (nothing from this line in before)" in diff_text(d)


def test_lines_are_matched_by_their_text_when_an_edit_moves_them():
    a = doc(
        cell(
            1,
            "x = f()",
            dev(
                kept=GiB,
                allocated=GiB,
                kept_lines=[{"line": 2, "text": "h = block(x)", "bytes": GiB, "blocks": 1}],
            ),
        )
    )
    lines = [
        {"line": 3, "text": "h = block(x)", "bytes": 3 * GiB, "blocks": 1},
        {"line": 4, "text": "cache.append(h)", "bytes": GiB, "blocks": 2},
    ]
    b = doc(cell(1, "x = f()", dev(kept=4 * GiB, allocated=4 * GiB, kept_lines=lines)))
    why = compare(a, b, TOL).cells[0].devices[0].why
    assert [(w.kind, w.name, w.before, w.after) for w in why] == [
        ("line", "line 3 `h = block(x)`", GiB, 3 * GiB),
        ("new_line", "line 4 `cache.append(h)`", None, GiB),
    ]


def test_with_nothing_recorded_the_note_says_how_to_record_it():
    a = doc(cell(1, "x = f()", dev()))
    b = doc(cell(1, "x = f()", dev(kept=GiB, allocated=2 * GiB, peak=2 * GiB)))
    (note,) = compare(a, b, TOL).cells[0].devices[0].notes
    assert "`%gpumem track on`" in note and "`%%gpumem --breakdown`" in note


# -- views -----------------------------------------------------------------------------------
HOSTILE = "s = '| </td><script>alert(1)</script> `tick`'"


def hostile_diff():
    a = doc(cell(1, HOSTILE, dev()))
    b = doc(cell(1, HOSTILE, dev(peak=3 * GiB, kept=GiB, allocated=2 * GiB)))
    return compare(a, b, TOL, ("main <b>.json", "this run"))


def test_markdown_for_a_pull_request():
    md = diff_markdown(hostile_diff(), "GPU memory: train.ipynb")
    assert md.startswith("### GPU memory: train.ipynb · ❌ regression\n")
    assert "<script>" not in md and "<b>" not in md
    table = [line for line in md.splitlines() if "(same code) |" in line]
    assert len(table) == 3  # peak, kept, allocated grew; one row each
    for row in table:  # a pipe in the code does not split the table's row
        assert row.count(" | ") == 7
    assert "**+2.00 GiB (+200.0%)**" in md
    assert "<details><summary>Every cell (1 same code)</summary>" in md
    ok = compare(doc(cell(1, "x", dev())), doc(cell(1, "x", dev())), TOL)
    assert diff_markdown(ok).startswith("### GPU memory · ✅ no regression\n")


def test_html_side_by_side_is_escaped_and_self_contained():
    d = hostile_diff()
    page = diff_page(d, [], [])
    assert page.startswith("<!doctype html>") and "</html>" in page
    assert "<script>" not in page and "main <b>.json" not in page
    assert "main &lt;b&gt;.json" in page and ">this run</th>" in page
    low = page.lower()
    assert "http://" not in low and "https://" not in low and "url(" not in low
    assert "REGRESSION" in diff_html(d) and "+2.00 GiB (+200.0%)" in diff_html(d)


# -- the kernel's history as a run ----------------------------------------------------------
def test_a_session_is_each_codes_latest_run():
    def row(n, first, kept):
        return HistoryRow(
            n,
            0.0,
            first,
            0.1,
            False,
            None,
            (DeviceRow(0, kept, kept, kept, 0, kept, kept, None, None),),
        )

    rows = [
        row(1, "x = f()", GiB),
        row(2, "y = g()", 2 * GiB),
        row(3, "x = f()", 3 * GiB),
        row(4, "z", 0),
    ]
    sources = {1: "x = f()", 2: "y = g()", 3: "x = f()  "}  # [4] has no source: left out
    mine = session_document(rows, sources)
    check_document(mine, "this kernel")
    assert [(c["execution_count"], c["devices"][0]["kept"]) for c in mine["cells"]] == [
        (2, 2 * GiB),
        (3, 3 * GiB),
    ]
    saved = doc(
        cell(1, "x = f()", dev(kept=GiB, allocated=GiB, peak=GiB)),
        cell(2, "y = g()", dev(kept=2 * GiB, allocated=2 * GiB, peak=2 * GiB)),
    )
    d = compare(saved, mine, TOL, ("base.json", "this kernel"), order_matters=False)
    assert {c.match for c in d.cells} == {"same"}
    own = [(c.ref.first_line, f.figure) for c, _, f in d.regressions if not f.inherited]
    assert own == [("x = f()", "peak"), ("x = f()", "kept"), ("x = f()", "allocated")]


def test_the_verdict_names_an_exact_figure_before_a_larger_reserved_one():
    # reserved grew by 26 MiB, the peak by 17 MiB: the verdict leads with the peak, which
    # is certain (reserved depends on the allocator's history)
    from jupyter_gpumem.reporters.run_diff import headline

    mib = 1 << 20
    a = doc(cell(1, "build()", dev(peak=33 * mib, allocated=33 * mib, reserved=44 * mib)))
    b = doc(
        cell(
            1,
            "build()",
            dev(peak=50 * mib, allocated=33 * mib, reserved=70 * mib, reserved_delta=26 * mib),
        )
    )
    d = compare(a, b, TOL)
    assert figure(d, 0, "reserved").outcome == "regression"
    assert "(peak +17.00 MiB" in headline(d), headline(d)
