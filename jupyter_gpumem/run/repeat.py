"""``run --save FILE --repeat N``: the notebook run N times, each in a fresh kernel, to
measure how far its reserved figures move between runs of the same code (what a later
``--baseline`` judges them against). The first run is the document's; the others only
give their figures."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..analysis.run_documents import device_key
from ..units import format_bytes
from .execute import CellRun, RunResult

SPREAD = ("reserved", "peak_reserved")  # (history keys)
EXACT = {"peak_allocated": "peak", "allocated_delta": "kept", "allocated": "allocated"}


def fresh(cells: Sequence[CellRun]) -> list[CellRun]:
    """The cells again, not run yet."""
    return [CellRun(c.index, c.first_line, c.budgets, source=c.source) for c in cells]


def repeat(
    n: int,
    read: Callable[[], Any],
    path: Path,
    cells: Sequence[CellRun],
    run: Callable[..., RunResult],
    say: Callable[[str], None],
    **kw: Any,
) -> tuple[list[RunResult], list[str]]:
    """Runs 2..n of the notebook (``read`` gives it afresh): the ones that completed, and
    a warning for each that did not."""
    done, warnings = [], []
    for k in range(2, n + 1):
        say(f"run {k}/{n} (--repeat {n})")
        result = run(read(), path, fresh(cells), **kw)
        if result.stopped is not None:
            warnings.append(f"--repeat: run {k}/{n} did not complete ({result.stopped}): left out")
            continue
        done.append(result)
    return done, warnings


def record_spreads(first: RunResult, others: Sequence[RunResult]) -> list[str]:
    """Set each device row's ``spread`` (the lowest and highest reserved figures over all
    the runs); warnings for exact figures that differed between the runs (they are not
    as deterministic as PyTorch's counters usually are)."""
    runs = [first, *others]
    warnings = []
    if len(runs) < 2:
        return ["--repeat: fewer than two runs completed: no spread was measured"]
    for i, cell in enumerate(first.cells):
        same = [r.cells[i] for r in runs if i < len(r.cells) and r.cells[i].index == cell.index]
        for d in cell.devices:
            if d.get("peak_allocated") is None:
                continue
            key = device_key(d)
            rows = [
                x
                for c in same
                for x in c.devices
                if device_key(x) == key and x.get("peak_allocated") is not None
            ]
            if len(rows) < 2:
                continue
            d["spread"] = {"runs": len(rows), **{name: _range(rows, name) for name in SPREAD}}
            for name, label in EXACT.items():
                values = {int(x[name]) for x in rows if x.get(name) is not None}
                if len(values) > 1:
                    low, high = min(values), max(values)
                    warnings.append(
                        f"{cell.label}: its {label} differed between the {len(rows)} runs "
                        f"({format_bytes(low)} to {format_bytes(high)}): give a --tolerance "
                        "that covers it when comparing"
                    )
    return warnings


def _range(rows: Sequence[dict[str, Any]], name: str) -> list[int] | None:
    values = [int(x[name]) for x in rows if x.get(name) is not None]
    if len(values) < len(rows):
        return None
    return [min(values), max(values)]
