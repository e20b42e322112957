"""A run against a saved one: the comparison folded into the run's verdict, and its
lines (``run --baseline``; docs/run.md). The comparison itself is
``analysis/run_diff.py``'s."""

from __future__ import annotations

from typing import Any

from ..model import FigureChange, RunDiff
from ..units import format_bytes, format_delta
from .verdict import FAIL, OK, Verdict


def regression_lines(diff: RunDiff) -> list[str]:
    """What grew past what is allowed, one line per cell and device (a verdict's
    problems); the cells that are higher only because earlier cells keep more, in one."""
    from ..reporters.run_diff import LABELS, change_text, judged_text, where

    def figures(fs: list[FigureChange]) -> str:
        return "; ".join(
            f"{LABELS[f.figure]} {format_bytes(f.before)} -> {format_bytes(f.after)} "
            f"({f.before} B -> {f.after} B), {change_text(f)}, allowed "
            f"{format_delta(f.allowed)} ({judged_text(f)})"
            for f in fs
        )

    out = []
    for c in diff.cells:
        if c.carried_only:
            continue
        for d in c.devices:
            own = [f for f in d.regressions if not f.inherited]
            if own:
                out.append(f"{c.ref.label} {where(d)}: {figures(own)}")
    carried = [c.ref.label for c in diff.cells if c.carried_only]
    if carried:
        out.append(
            f"{len(carried)} cell{'s' if len(carried) != 1 else ''} higher only because "
            f"earlier cells keep more: {', '.join(carried)}"
        )
    for d in diff.run:
        if d.regressions:
            out.append(f"the whole run {where(d)}: {figures(list(d.regressions))}")
    return out


def with_baseline(verdict: Verdict, diff: RunDiff) -> Verdict:
    """The run's verdict and the comparison's, one verdict: a run that failed to run
    stays exit 2; a regression fails a run that passed (exit 1)."""
    from ..reporters.run_diff import headline

    if diff.exit_code != FAIL or verdict.exit_code not in (OK, FAIL):
        return verdict
    problems = [*verdict.problems, *(f"regression: {p}" for p in regression_lines(diff))]
    said = f"against {diff.before}: {headline(diff)}"
    text = said if verdict.exit_code == OK else f"{verdict.headline}; {said}"
    return Verdict(FAIL, text, problems, list(verdict.warnings))


def baseline_summary(diff: RunDiff, file: str) -> dict[str, Any]:
    from ..reporters.run_diff import headline

    return {
        "file": file,
        "tolerance": diff.tolerance.text,
        "exit_code": diff.exit_code,
        "message": headline(diff),
        "regressions": regression_lines(diff),
    }
