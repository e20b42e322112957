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
