"""One place decides which path a %%gpumem cell takes: CellOptions.mode."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

from jupyter_gpumem._ipython import magics
from jupyter_gpumem._ipython.parsers import CellMode, CellOptions

PACKAGE = Path(magics.__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("opts", "mode"),
    [
        (CellOptions(), "measured"),
        (CellOptions(trace=True, breakdown=True), "measured"),
        (CellOptions(scan=("b", (1.0, 2.0), True)), "scan"),
        (CellOptions(dry_run=True), "dry_run"),
        (CellOptions(dry_run=True, scan=("b", (1.0, 2.0), True)), "dry_scan"),
    ],
)
def test_each_cell_has_one_mode(opts, mode):
    assert opts.mode == mode


def test_the_magic_runs_every_mode_but_the_measured_one_by_the_mode():
    assert set(magics._RUNNERS) | {"measured"} == set(get_args(CellMode))


def test_no_other_place_reads_the_options_that_decide_the_path():
    """The session, the magic and the front ends choose by ``.mode``; reading ``.scan`` or
    ``.dry_run`` to choose a path again elsewhere would be a second place."""
    deciding = re.compile(r"opts\.(scan is|dry_run\b)|\.scan is not None and .*dry_run")
    found = [
        f"{p.relative_to(PACKAGE)}:{i}"
        for p in PACKAGE.rglob("*.py")
        if p.name != "parsers.py" and p.parent.name != "testing"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if deciding.search(line) and "assert" not in line
    ]
    assert found == []


def test_what_did_not_start_is_a_failed_record_with_its_reason(monkeypatch):
    """A trace or a breakdown that cannot start is a Failed(note), not a bare string: its
    note is what the report says."""
    from jupyter_gpumem.collectors import torch_build
    from jupyter_gpumem.core.breakdown import Breakdowns
    from jupyter_gpumem.core.trace import Traces
    from jupyter_gpumem.model import Failed

    monkeypatch.setattr(torch_build, "imported_torch", lambda: None)
    import jupyter_gpumem.core.breakdown as b
    import jupyter_gpumem.core.trace as t

    monkeypatch.setattr(t, "imported_torch", lambda: None)
    monkeypatch.setattr(b, "imported_torch", lambda: None)
    trace = Traces(who=None).start(100)  # type: ignore[arg-type]
    step = Breakdowns(workspace=None).start()  # type: ignore[arg-type]
    assert isinstance(trace, Failed) and "torch was not imported" in trace.note
    assert isinstance(step, Failed) and step.note.startswith("--breakdown needs torch")
    assert Traces(who=None).stop(trace) == (None, 0.0, trace.note)  # type: ignore[arg-type]
