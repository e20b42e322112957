"""From a run's figures to its exit code: check the budgets, name what failed.

Exit codes (``docs/run.md``):

- 0: the notebook ran and every budget held (or none was given);
- 1: a budget failed, or under ``--fits`` a cell ran out of GPU memory (it does not fit);
- 2: usage errors, a notebook that fails to run (a cell raised, the kernel died or timed
  out), and budgets or ``--fits`` given but the kernel had no GPU figures to check them on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..units import cuda_label, format_bytes
from .budgets import Budget, check
from .execute import CellRun, RunResult

OK, FAIL, ERROR = 0, 1, 2


@dataclass
class Verdict:
    exit_code: int
    headline: str
    problems: list[str] = field(default_factory=list)  # what failed, with cells and numbers
    warnings: list[str] = field(default_factory=list)

    @property
    def result(self) -> str:
        return {OK: "pass", FAIL: "fail"}.get(self.exit_code, "error")


def apply_budgets(cells: Sequence[CellRun]) -> None:
    """Fill each cell's ``results``. Global budgets are checked on every cell that has
    figures; a cell's own (tag) budgets are always reported, as not checked when the
    cell has no figures."""
    for c in cells:
        if c.status not in ("ok", "error"):
            c.results = []
            continue
        wanted = c.budgets if c.has_figures else [b for b in c.budgets if b.scope == "cell"]
        c.results = check(wanted, c.devices if c.has_figures else [])


def peak_cell(cells: Sequence[CellRun]) -> tuple[CellRun, dict[str, Any]] | None:
    best: tuple[CellRun, dict[str, Any]] | None = None
    for c in cells:
        for d in c.devices:
            p = d.get("peak_allocated")
            if p is not None and (best is None or p > best[1]["peak_allocated"]):
                best = (c, d)
    return best


def judge(result: RunResult, global_budgets: Sequence[Budget], fits: int | None) -> Verdict:
    apply_budgets(result.cells)
    problems: list[str] = []
    warnings = list(result.notes)
    broken = 0
    no_fit: CellRun | None = None
    for c in result.cells:
        for r in c.failed_budgets:
            broken += 1
            scope = "the cell's tag" if r.budget.scope == "cell" else "--budget"
            problems.append(f"{c.label}: {r.describe()} (budget {r.budget.text} from {scope})")
        if c.status == "error" and c.oom and not c.expected_error and fits is not None:
            no_fit = no_fit or c
            text = (
                f"{c.label} ran out of GPU memory under --fits {format_bytes(fits)}: "
                "the notebook does not fit"
            )
            if c.oom_fix:
                text += f"; the post-mortem's first fix: {c.oom_fix}"
            problems.append(text)
        elif c.status == "error" and not c.expected_error and result.stopped is None:
            ename, evalue = c.error or ("", "")
            warnings.append(f"{c.label} raised {ename}: {_clip(evalue)} (--allow-errors)")
        if c.status not in ("ok", "error"):
            continue
        own = [b.text for b in c.budgets if b.scope == "cell"]
        if own and not c.measured:
            warnings.append(f"{c.label} was not measured: {', '.join(own)} not checked")
        elif own and not c.has_figures and result.has_figures:
            warnings.append(f"{c.label} has no GPU figures: {', '.join(own)} not checked")
    wanted = bool(global_budgets) or fits is not None or any(c.budgets for c in result.cells)
    if result.stopped is not None:
        return Verdict(ERROR, f"the notebook failed to run: {result.stopped}", problems, warnings)
    if not result.has_figures:
        why = _why_no_figures(result)
        if wanted:
            return Verdict(
                ERROR, f"no GPU figures: budgets can't be checked ({why})", problems, warnings
            )
        warnings.append(f"no GPU figures: {why}")
    if problems:
        said = []
        if broken:
            said.append(f"{broken} budget check{'s' if broken != 1 else ''} failed")
        if no_fit is not None and fits is not None:
            said.append(f"the notebook does not fit in {format_bytes(fits)} ({no_fit.label})")
        return Verdict(FAIL, "; ".join(said), problems, warnings)
    n_run = sum(c.status in ("ok", "error") for c in result.cells)
    held = sum(r.ok is True for c in result.cells for r in c.results)
    top = peak_cell(result.cells)
    peak = (
        f", peak {format_bytes(top[1]['peak_allocated'])} on {cuda_label(top[1]['index'])}"
        + (f" of {top[1]['worker']}" if top[1].get("worker") else "")
        + " "
        f"in {top[0].label}"
        if top
        else ""
    )
    checks = f", {held} budget check{'s' if held != 1 else ''} held" if wanted else ""
    fit = f", fits in {format_bytes(fits)}" if fits is not None else ""
    return Verdict(OK, f"{n_run} code cells ran{peak}{checks}{fit}", problems, warnings)


def _why_no_figures(result: RunResult) -> str:
    s = result.sample
    if s is None:
        return "the kernel gave no reading"
    msg = s.get("message") or ""
    state = s.get("state")
    if state == "no_torch":
        return msg or "torch was never imported in the kernel"
    if state in ("cpu_only", "no_gpu"):
        return msg or "no CUDA GPU in the kernel"
    if state == "not_initialized":
        return msg or "no cell used the GPU (CUDA was never initialised)"
    return msg or "no measured cell had allocator figures"


def _clip(text: str, n: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"
