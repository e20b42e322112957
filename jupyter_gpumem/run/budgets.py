"""Memory budgets: parse ``peak<=20GiB`` and check it against a cell's figures.

Grammar (whitespace allowed around each part, metric names case-insensitive)::

    budget := METRIC OP SIZE
    METRIC := peak | kept | allocated | reserved
    OP     := <= | <
    SIZE   := a number with a unit: B, KB, MB, GB, TB (powers of 1000) or
              KiB, MiB, GiB, TiB (powers of 1024); 0 alone is allowed

A cell's tags carry budgets as ``gpumem: peak<=4GiB`` (also ``gpumem:peak<=4GiB``). Several
budgets: several tags, or ``;`` between them in one tag (nbformat forbids commas in tags).
A cell's budget for a metric replaces the global ``--budget`` of that metric for that cell.

Everything here is plain records and pure functions: no kernel, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import BudgetError
from ..units import cuda_label, format_bytes, parse_size, shown

# The figures of a HistoryCell device row that each metric reads.
METRICS: dict[str, tuple[str, str]] = {
    "peak": ("peak_allocated", "the cell's exact peak of allocated memory"),
    "kept": ("allocated_delta", "allocated after the cell minus before (what the cell kept)"),
    "allocated": ("allocated", "allocated after the cell"),
    "reserved": ("reserved", "reserved (cached by PyTorch) after the cell"),
}
Op = Literal["<=", "<"]
Scope = Literal["global", "cell"]  # --budget, or a cell's tag
TAG_PREFIX = "gpumem:"

FORM = (
    "METRIC<=SIZE or METRIC<SIZE, METRIC one of peak, kept, allocated, reserved; "
    "SIZE like 20GiB, 512MiB, 24GB (GiB/MiB: powers of 1024; GB/MB: powers of 1000), "
    "e.g. 'peak<=20GiB'"
)

_EXPR = re.compile(r"^\s*([A-Za-z_]+)\s*(<=|<)\s*(.+?)\s*$")
_ZERO = re.compile(r"^\s*(?:0+(?:\.0*)?|\.0+)\s*([A-Za-z]*)\s*$")


@dataclass(frozen=True, slots=True)
class Budget:
    metric: str  # a key of METRICS
    op: Op
    limit: int  # bytes
    text: str  # as written, normalised: "peak<=20GiB"
    scope: Scope = "global"

    def holds(self, value: int) -> bool:
        return value <= self.limit if self.op == "<=" else value < self.limit

    @property
    def field(self) -> str:
        return METRICS[self.metric][0]


@dataclass(frozen=True, slots=True)
class BudgetResult:
    budget: Budget
    device: int | None  # None: no device had the figure
    value: int | None  # None: not measured, so not checked
    ok: bool | None  # None: not checked
    worker: str | None = None  # the device is a worker process's ("rank 1 (pid 4242)")

    def to_dict(self) -> dict[str, Any]:
        return {
            **({"worker": self.worker} if self.worker else {}),
            "expression": self.budget.text,
            "scope": self.budget.scope,
            "metric": self.budget.metric,
            "op": self.budget.op,
            "limit": self.budget.limit,
            "device": self.device,
            "value": self.value,
            "ok": self.ok,
        }

    def describe(self) -> str:
        """``peak 5.20 GiB (5583457484 B) > 4.00 GiB (4294967296 B) on cuda:0``."""
        b = self.budget
        if self.value is None:
            return f"{b.metric}: not measured, {b.text} not checked"
        rel: str
        if self.ok:
            rel = b.op
        else:
            rel = ">" if b.op == "<=" else ">="
        where = f" on {cuda_label(self.device)}" if self.device is not None else ""
        if self.worker:
            where += f" of {self.worker}"
        return f"{b.metric} {_exact(self.value, b.metric)} {rel} {_exact(b.limit)}{where}"


def _exact(n: int, metric: str = "") -> str:
    """``5.20 GiB (5583457484 B)``; ``512 B`` alone. Kept memory gets its sign."""
    text = format_bytes(n)
    if metric == "kept" and n > 0:
        text = "+" + text
    return text if abs(n) < 1024 else f"{text} ({n} B)"


def _size(text: str) -> int:
    zero = _ZERO.match(text)
    if zero is not None:  # parse_size wants at least one byte; a budget may say 0
        parse_size("1" + zero.group(1))  # the unit must still be one
        return 0
    return parse_size(text)


def parse_budget(text: str, scope: Scope = "global") -> Budget:
    """``'peak<=20GiB'`` -> :class:`Budget`; :class:`BudgetError` with the form otherwise."""
    m = _EXPR.match(text)
    if m is None:
        raise BudgetError(f"not a budget: {shown(text)}; expected {FORM}")
    metric, size = m.group(1).lower(), m.group(3)
    op: Op = "<=" if m.group(2) == "<=" else "<"  # the pattern allows these two
    if metric not in METRICS:
        raise BudgetError(
            f"unknown metric {shown(m.group(1))} in budget {shown(text)}; expected {FORM}"
        )
    if size.startswith("="):  # "peak<==4GiB"
        raise BudgetError(f"not a budget: {shown(text)}; expected {FORM}")
    try:
        limit = _size(size)
    except ValueError as e:
        raise BudgetError(f"bad size in budget {shown(text)}: {e}; expected {FORM}") from None
    return Budget(metric, op, limit, f"{metric}{op}{size.replace(' ', '')}", scope)


def tag_budgets(tags: Iterable[Any]) -> list[Budget]:
    """The budgets in a cell's ``gpumem: ...`` tags (other tags are ignored). ``tags`` is
    what the notebook's cell metadata holds: anything but a list of strings is an error."""
    if not isinstance(tags, (list, tuple)):
        raise BudgetError(
            f"the cell's tags must be a list of strings, got {shown(tags)}; "
            'e.g. "tags": ["gpumem: peak<=4GiB"]'
        )
    out: list[Budget] = []
    for tag in tags:
        if not isinstance(tag, str):
            continue
        t = tag.strip()
        if not t.lower().startswith(TAG_PREFIX):
            continue
        body = t[len(TAG_PREFIX) :]
        parts = [p for p in body.split(";") if p.strip()]
        if not parts:
            raise BudgetError(f"empty budget tag {shown(tag)}; expected 'gpumem: {FORM}'")
        for part in parts:
            out.append(parse_budget(part.strip(), scope="cell"))
    return out


def effective(global_budgets: Sequence[Budget], cell_budgets: Sequence[Budget]) -> list[Budget]:
    """What one cell must satisfy: its own budgets, plus the global ones for metrics its
    tags do not mention (a tag's metric replaces the global budget of that metric)."""
    own = {b.metric for b in cell_budgets}
    return [*cell_budgets, *(b for b in global_budgets if b.metric not in own)]


def check(budgets: Sequence[Budget], devices: Sequence[Mapping[str, Any]]) -> list[BudgetResult]:
    """Check each budget on each device row (a HistoryCell's ``devices``, the worker
    processes' included: each worker's device must fit as the kernel's must) that has the
    figure; a budget no device has a figure for is reported as not checked."""
    results: list[BudgetResult] = []
    for b in budgets:
        checked = False
        for d in devices:
            value = d.get(b.field)
            if value is None:
                continue
            checked = True
            results.append(
                BudgetResult(b, int(d["index"]), int(value), b.holds(int(value)), d.get("worker"))
            )
        if not checked:
            results.append(BudgetResult(b, None, None, None))
    return results
