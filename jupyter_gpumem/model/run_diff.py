"""Two runs of a notebook compared cell by cell (``jupyter-gpumem diff``, ``run
--baseline``, ``%gpumem history --diff``): which cells match, how each figure changed, what
is judged a regression, and why (``analysis/run_diff.py`` makes it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from .render import ShowsItself

# same: the same code at the same place; moved: the same code elsewhere among the cells
# that kept their code; edited: similar code (``similarity``); added: only in the second
# run; removed: only in the first
MatchKind = Literal["same", "moved", "edited", "added", "removed"]
MATCH_KINDS: tuple[MatchKind, ...] = ("same", "moved", "edited", "added", "removed")
# exact: PyTorch's own counters (allocated, peaks, kept), judged against the tolerance;
# spread: reserved, which depends on the allocator's history, judged against its spread
Judged = Literal["exact", "spread"]
# regression: grew past what is allowed; improvement: fell by more than that; within: a
# change inside it; same: no change; no_figure: one side has none
Outcome = Literal["regression", "improvement", "within", "same", "no_figure"]
# category, module: the --breakdown's; line: a line that allocated what the cell kept;
# new_line: such a line the first run did not have; kept_at: the line that kept most (the
# history's one line, when no lines were recorded); carried: what the cell began with
WhyKind = Literal["category", "module", "line", "new_line", "kept_at", "carried"]


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How much an exact figure may grow: the larger of ``relative`` of the first run's
    figure and ``absolute`` bytes."""

    relative: float  # 0.01 for 1%
    absolute: int  # bytes
    text: str  # as given: "1%", "1%,64MiB"

    def allowed(self, before: int) -> int:
        return max(int(self.relative * abs(before)), self.absolute)


@dataclass(frozen=True, slots=True)
class Spread:
    """How far a reserved figure may move between runs of the same code: measured
    (``--repeat``: the lowest and highest of several runs) or the default."""

    low: int
    high: int
    measured: bool
    runs: int  # runs it was measured over (0: the default)


@dataclass(frozen=True, slots=True)
class FigureChange:
    figure: str  # peak, kept, allocated, reserved, peak_reserved
    before: int | None
    after: int | None
    judged: Judged
    allowed: int  # how much it may grow before it is a regression
    outcome: Outcome
    # the change of what the cell began with (allocated, or reserved, when it started):
    # the part of the change that earlier cells made; None: not known or not relevant
    carried: int | None = None
    spread: Spread | None = None  # the first run's (spread figures)

    @property
    def change(self) -> int | None:
        if self.before is None or self.after is None:
            return None
        return self.after - self.before

    @property
    def own(self) -> int | None:
        """The part of the change the cell made itself."""
        change = self.change
        if change is None:
            return None
        return change - (self.carried or 0)

    @property
    def inherited(self) -> bool:
        """A regression only because the cell began with more (earlier cells keep more)."""
        own = self.own
        return self.outcome == "regression" and own is not None and own <= self.allowed


class Why(NamedTuple):
    """One reason for a change: a category, module or line whose bytes changed."""

    kind: WhyKind
    # "activations", "model.layers.3", "line 4 `h = block(x)`"; carried: what the cell began
    # with more of, "allocated" or "reserved"
    name: str
    before: int | None
    after: int | None

    @property
    def change(self) -> int:
        return (self.after or 0) - (self.before or 0)


@dataclass(frozen=True, slots=True)
class DeviceDiff:
    device: int
    worker: str | None  # a worker process's device ("rank 1"), None: the kernel's own
    figures: tuple[FigureChange, ...]
    why: tuple[Why, ...] = ()  # largest change first, for a device with a regression
    notes: tuple[str, ...] = ()  # what could not be explained, and why

    @property
    def regressions(self) -> tuple[FigureChange, ...]:
        return tuple(f for f in self.figures if f.outcome == "regression")

    def figure(self, name: str) -> FigureChange | None:
        for f in self.figures:
            if f.figure == name:
                return f
        return None


@dataclass(frozen=True, slots=True)
class CellRef:
    """A cell of one run: its place in the notebook (0-based, markdown cells counted), its
    execution count and first line of code."""

    index: int | None
    execution_count: int | None
    first_line: str
    status: str = "ok"

    @property
    def label(self) -> str:
        n = f" [{self.execution_count}]" if self.execution_count is not None else ""
        line = self.first_line if len(self.first_line) <= 60 else self.first_line[:59] + "…"
        at = f"cell {self.index + 1}" if self.index is not None else "cell"
        return f"{at}{n} `{line}`"


@dataclass(frozen=True, slots=True)
class CellDiff:
    match: MatchKind
    before: CellRef | None
    after: CellRef | None
    devices: tuple[DeviceDiff, ...] = ()
    similarity: float | None = None  # an edited cell's: 0..1
    code: tuple[str, ...] = ()  # an edited cell's changed lines, "-old" / "+new"
    notes: tuple[str, ...] = ()  # a status that changed ("raised ...", "not run")

    @property
    def ref(self) -> CellRef:
        ref = self.after or self.before
        assert ref is not None
        return ref

    @property
    def regressions(self) -> tuple[tuple[DeviceDiff, FigureChange], ...]:
        return tuple((d, f) for d in self.devices for f in d.regressions)

    @property
    def carried_only(self) -> bool:
        """Every regression of the cell is there only because it began with more."""
        regs = self.regressions
        return bool(regs) and all(f.inherited for _, f in regs)


@dataclass(frozen=True, slots=True)
class RunDiff(ShowsItself):
    """The second run (``after``) against the first (``before``)."""

    before: str  # what each run is, in words: "base.json", "this run", "this kernel"
    after: str
    tolerance: Tolerance
    # reserved without a measured spread: this fraction of the figure, at least floor bytes
    default_spread: tuple[float, int]
    cells: tuple[CellDiff, ...]  # in the second run's order, removed cells where they were
    run: tuple[DeviceDiff, ...]  # the whole run: its peaks and what it ends with
    matched_by: Literal["source", "first line"]
    warnings: tuple[str, ...] = ()
    error: str | None = None  # the second run did not complete: its figures are partial

    @property
    def regressions(self) -> tuple[tuple[CellDiff, DeviceDiff, FigureChange], ...]:
        return tuple((c, d, f) for c in self.cells for d, f in c.regressions)

    @property
    def run_regressions(self) -> tuple[tuple[DeviceDiff, FigureChange], ...]:
        return tuple((d, f) for d in self.run for f in d.regressions)

    @property
    def exit_code(self) -> int:
        """0: no figure grew past what is allowed; 1: one did; 2: the second run did not
        complete (its figures cannot be trusted to be all there)."""
        if self.error is not None:
            return 2
        return 1 if self.regressions or self.run_regressions else 0

    def count(self, kind: MatchKind) -> int:
        return sum(c.match == kind for c in self.cells)
