"""Two runs of a notebook compared: each cell's figures before and after, judged, and for
each regression why (``jupyter-gpumem diff``, ``run --baseline``, ``%gpumem history
--diff``; docs/run.md).

Fed with plain run documents (``jupyter-gpumem run --save``/``--json``, version 1, or this
session's history as one: ``analysis/run_documents.py``), so it runs on recorded runs.

- Cells are matched by their code (``analysis/cell_match.py``).
- **Exact figures** (PyTorch's counters: ``peak`` allocated, ``kept``, ``allocated``
  after the cell) regress when they grow by more than the tolerance (the larger of a
  share of the first run's figure and a size).
- **Reserved figures** (``reserved`` after the cell, ``peak_reserved``) depend on the
  caching allocator's history: they regress when they grow past the first run's spread
  plus the tolerance. The spread is the one measured (``run --repeat N``: the lowest and
  highest of N runs) or, when none was, :data:`DEFAULT_SPREAD`; the diff says which.
- A figure that grew only because the cell began with more (earlier cells keep more) is
  still a regression, marked *carried*: its own part is within what is allowed.
- Why: the ``--breakdown`` categories and modules whose bytes changed, the lines that
  allocate more of what the cell keeps, new such lines, the code that changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..model import (
    CellDiff,
    CellRef,
    DeviceDiff,
    FigureChange,
    Judged,
    Outcome,
    RunDiff,
    Spread,
    Tolerance,
    Why,
    WhyKind,
)
from .allocator_rules import LARGE_BUFFER
from .cell_match import match_cells
from .run_documents import device_key

EXACT = ("peak", "kept", "allocated")
SPREAD = ("peak_reserved", "reserved")
# A reserved figure without a measured spread may move by this share of itself, at least
# one of the allocator's 20 MiB segments (what a few requests in another order can cost).
DEFAULT_SPREAD: tuple[float, int] = (0.05, LARGE_BUFFER)
WHYS = 6  # reasons kept per kind


# -- the comparison ---------------------------------------------------------------------------
def compare(
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    tolerance: Tolerance,
    names: tuple[str, str] = ("before", "after"),
    order_matters: bool = True,
    default_spread: tuple[float, int] = DEFAULT_SPREAD,
) -> RunDiff:
    """``after`` against ``before`` (both checked with ``run_documents.check_document``)."""
    a, b = list(before["cells"]), list(after["cells"])
    by_source = all("source" in c for c in a + b)
    key = "source" if by_source else "first_line"
    matches = match_cells(
        [str(c.get(key, "")) for c in a], [str(c.get(key, "")) for c in b], order_matters
    )
    judge = _Judge(tolerance, default_spread, names)
    cells = []
    for m in matches:
        ca = a[m.before] if m.before is not None else None
        cb = b[m.after] if m.after is not None else None
        devices = judge.cell(ca, cb)
        cells.append(
            CellDiff(
                m.kind,
                _ref(ca),
                _ref(cb),
                devices,
                m.similarity,
                m.code,
                _status_notes(ca, cb, names),
            )
        )
    warnings = _environment(before, after, names)
    if not by_source:
        warnings.append(
            "cells were matched by their first line: "
            + " and ".join(
                n for n, d in zip(names, (a, b), strict=True) if any("source" not in c for c in d)
            )
            + " does not record the cells' code (written by an older jupyter-gpumem)"
        )
    summary = after.get("summary") or {}
    error = summary.get("message") if summary.get("result") == "error" else None
    return RunDiff(
        names[0],
        names[1],
        tolerance,
        default_spread,
        tuple(cells),
        judge.run(a, b),
        "source" if by_source else "first line",
        tuple(warnings),
        error,
    )


class _Judge:
    def __init__(
        self, tolerance: Tolerance, default_spread: tuple[float, int], names: tuple[str, str]
    ) -> None:
        self.tolerance = tolerance
        self.default_spread = default_spread
        self.names = names

    def spread(self, before: int, measured: Any) -> Spread:
        if isinstance(measured, list) and len(measured) == 2 and measured[0] is not None:
            return Spread(int(measured[0]), int(measured[1]), True, 0)
        share, floor = self.default_spread
        d = max(int(share * abs(before)), floor)
        return Spread(before - d, before + d, False, 0)

    def figure(
        self,
        name: str,
        before: int | None,
        after: int | None,
        carried: int | None = None,
        measured: Any = None,
        runs: int = 0,
    ) -> FigureChange:
        judged = _judged(name)
        if before is None or after is None:
            return FigureChange(name, before, after, judged, 0, "no_figure")
        tol = self.tolerance.allowed(before)
        spread = None
        allowed, floor = tol, -tol
        if judged == "spread":
            spread = self.spread(before, measured)
            if spread.measured:
                spread = Spread(spread.low, spread.high, True, runs)
            allowed, floor = spread.high - before + tol, spread.low - before - tol
        change = after - before
        outcome: Outcome = (
            "regression"
            if change > allowed
            else "improvement"
            if change < floor
            else "same"
            if change == 0
            else "within"
        )
        return FigureChange(name, before, after, judged, allowed, outcome, carried, spread)

    def device(self, da: dict[str, Any], db: dict[str, Any]) -> DeviceDiff:
        spread = da.get("spread") or {}
        runs = int(spread.get("runs") or 0)
        starts = (_start(da), _start(db))
        figures = tuple(
            self.figure(
                name,
                da.get(name),
                db.get(name),
                _carried(name, *starts),
                spread.get(name),
                runs,
            )
            for name in (*EXACT, *SPREAD)
        )
        key = device_key(db)
        d = DeviceDiff(key[1], key[0], figures)
        if not d.regressions:
            return d
        why, notes = explain(da, db, d.regressions, self.names)
        return DeviceDiff(d.device, d.worker, figures, why, notes)

    def cell(self, ca: dict[str, Any] | None, cb: dict[str, Any] | None) -> tuple[DeviceDiff, ...]:
        """The devices of a cell in both runs, judged; of a cell in one run (added or
        removed), its figures there, not judged."""
        if ca is None or cb is None:
            one = ca if ca is not None else cb
            if one is None or not _has_figures(one):
                return ()
            return tuple(
                DeviceDiff(
                    k[1],
                    k[0],
                    tuple(
                        FigureChange(
                            name,
                            d.get(name) if ca is not None else None,
                            d.get(name) if cb is not None else None,
                            _judged(name),
                            0,
                            "no_figure",
                        )
                        for name in (*EXACT, *SPREAD)
                    ),
                )
                for k, d in _devices(one).items()
            )
        if not (_has_figures(ca) and _has_figures(cb)):
            return ()
        da, db = _devices(ca), _devices(cb)
        return tuple(
            self.device(da.get(k) or _zero(k), db.get(k) or _zero(k)) for k in _keys(da, db)
        )

    def run(
        self, a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]
    ) -> tuple[DeviceDiff, ...]:
        """The whole run: its peaks (the largest of its cells') and what it ends with."""
        ra, rb = _whole(a), _whole(b)
        out = []
        for k in _keys(ra, rb):
            da, db = ra.get(k) or _zero(k), rb.get(k) or _zero(k)
            spread = da.get("spread") or {}
            figures = tuple(
                self.figure(
                    name, da.get(name), db.get(name), None, spread.get(name), spread.get("runs", 0)
                )
                for name in ("peak", "allocated", "peak_reserved", "reserved")
            )
            out.append(DeviceDiff(k[1], k[0], figures))
        return tuple(out)


def _judged(name: str) -> Judged:
    return "spread" if name in SPREAD else "exact"


def _keys(*sides: Mapping[tuple[str | None, int], Any]) -> list[tuple[str | None, int]]:
    keys = {k for side in sides for k in side}
    return sorted(keys, key=lambda k: (k[0] is not None, k[0] or "", k[1]))


def _devices(cell: Mapping[str, Any]) -> dict[tuple[str | None, int], dict[str, Any]]:
    return {device_key(d): d for d in cell.get("devices", []) if "index" in d}


def _zero(key: tuple[str | None, int]) -> dict[str, Any]:
    """A device a measured cell has no row for: nothing was allocated there."""
    return {
        "index": key[1],
        **({"worker": key[0]} if key[0] else {}),
        **dict.fromkeys(("kept", "peak", "allocated", "reserved", "reserved_delta"), 0),
        "peak_reserved": 0,
    }


def _has_figures(cell: Mapping[str, Any]) -> bool:
    return bool(cell.get("measured")) and any(
        d.get("peak") is not None for d in cell.get("devices", [])
    )


def _start(d: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(allocated, reserved) when the cell began."""
    alloc = (
        d["allocated"] - d["kept"]
        if d.get("allocated") is not None and d.get("kept") is not None
        else None
    )
    rd = d.get("reserved_delta")
    res = d["reserved"] - rd if d.get("reserved") is not None and rd is not None else None
    return alloc, res


def _carried(
    name: str, a: tuple[int | None, int | None], b: tuple[int | None, int | None]
) -> int | None:
    if name == "kept":
        return None
    k = 0 if name in ("peak", "allocated") else 1
    x, y = a[k], b[k]
    return None if x is None or y is None else y - x


def _whole(cells: Iterable[Mapping[str, Any]]) -> dict[tuple[str | None, int], dict[str, Any]]:
    """Per device: the largest peaks of the cells, what the last cell left, and the spread
    measured for those figures (the cell's each came from)."""
    out: dict[tuple[str | None, int], dict[str, Any]] = {}
    for c in cells:
        if not _has_figures(c):
            continue
        for k, d in _devices(c).items():
            w = out.setdefault(k, {"index": k[1], "peak": None, "peak_reserved": None})
            spread = w.setdefault("spread", {})
            measured = d.get("spread") or {}
            v = d.get("peak")
            if v is not None and (w["peak"] is None or v > w["peak"]):
                w["peak"] = v
            v = d.get("peak_reserved")
            if v is not None and (w["peak_reserved"] is None or v > w["peak_reserved"]):
                w["peak_reserved"] = v
                spread["peak_reserved"] = measured.get("peak_reserved")
            w["allocated"], w["reserved"] = d.get("allocated"), d.get("reserved")
            spread["reserved"] = measured.get("reserved")
            spread["runs"] = measured.get("runs", 0)
    return out


# -- why ----------------------------------------------------------------------------------------
def explain(
    da: Mapping[str, Any],
    db: Mapping[str, Any],
    regressions: Sequence[FigureChange],
    names: tuple[str, str] = ("the first run", "the second run"),
) -> tuple[tuple[Why, ...], tuple[str, ...]]:
    """What changed inside a device's figures: what the cell began with, the breakdown's
    categories and modules, the lines that allocated what it kept."""
    why: list[Why] = []
    notes: list[str] = []
    carried = [f for f in regressions if f.inherited]
    if carried:
        f = carried[0]
        name = "reserved" if f.figure in SPREAD else "allocated"
        k = 1 if f.figure in SPREAD else 0
        why.append(Why("carried", name, _start(da)[k], _start(db)[k]))
    ba, bb = da.get("breakdown"), db.get("breakdown")
    if ba and bb:
        why += _changed("category", _categories(ba), _categories(bb))
        why += _changed("module", _modules(ba), _modules(bb))
    elif ba or bb:
        notes.append(
            f"only {names[0] if ba else names[1]} has a --breakdown of this cell: nothing "
            "to compare its categories and modules with"
        )
    la, lb = da.get("kept_lines"), db.get("kept_lines")
    if la is not None and lb is not None:
        why += _lines(la, lb)
    elif (da.get("kept_at") or db.get("kept_at")) and da.get("kept_at") != db.get("kept_at"):
        notes.append(
            f"kept most at {db.get('kept_at') or 'no recorded line'} "
            f"({names[0]}: {da.get('kept_at') or 'no recorded line'})"
        )
    recorded = ba or bb or la is not None or lb is not None
    if not (recorded or da.get("kept_at") or db.get("kept_at")) and len(carried) < len(regressions):
        notes.append(
            "nothing recorded says why: record the lines that allocate what a cell keeps "
            "with tracking on (`run --save` has it on; `%gpumem track on`), and what its "
            "peak is made of with `%%gpumem --breakdown` in the cell"
        )
    return tuple(why), tuple(notes)


def _categories(b: Mapping[str, Any]) -> dict[str, int]:
    return {str(c["category"]): int(c["bytes"]) for c in b.get("categories", [])}


def _modules(b: Mapping[str, Any]) -> dict[str, int]:
    return {
        str(m["module"]): int(m.get("activations", 0)) + int(m.get("temporaries", 0))
        for m in b.get("modules", [])
    }


# Categories that are not what the code made: the allocator's rounding, and what was there
# before the cell (growth carried in is a reason of its own). Listed after the categories of
# tensors, whose growth is what the code changed.
_CONSEQUENCES = ("block slack", "kept from before")


def _changed(kind: Any, a: Mapping[str, int], b: Mapping[str, int]) -> list[Why]:
    rows = [Why(kind, k, a.get(k), b.get(k)) for k in {**a, **b} if a.get(k, 0) != b.get(k, 0)]
    rows.sort(key=lambda w: (kind == "category" and w.name in _CONSEQUENCES, -w.change, w.name))
    return rows[:WHYS]


def _lines(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> list[Why]:
    """Lines matched by their text (an edit above them moves their numbers)."""

    def by_text(lines: Sequence[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for line in lines:
            text = str(line.get("text", ""))
            n, total = out.get(text, (int(line.get("line", 0)), 0))
            out[text] = (n, total + int(line.get("bytes", 0)))
        return out

    ta, tb = by_text(a), by_text(b)
    rows = []
    for text in {**ta, **tb}:
        before = ta[text][1] if text in ta else None
        after = tb[text][1] if text in tb else None
        if (before or 0) == (after or 0):
            continue
        line = (tb.get(text) or ta[text])[0]
        kind: WhyKind = "new_line" if before is None else "line"
        rows.append(Why(kind, f"line {line} `{text}`", before, after))
    rows.sort(key=lambda w: (-w.change, w.name))
    return rows[:WHYS]


# -- what else differs --------------------------------------------------------------------------
def _ref(cell: Mapping[str, Any] | None) -> CellRef | None:
    if cell is None:
        return None
    return CellRef(
        cell.get("index"),
        cell.get("execution_count"),
        str(cell.get("first_line", "")),
        str(cell.get("status", "ok")),
    )


def _status_notes(
    ca: Mapping[str, Any] | None, cb: Mapping[str, Any] | None, names: tuple[str, str]
) -> tuple[str, ...]:
    """How the cell ended in each run, when that differs (it raised, did not run, had no
    GPU figures)."""
    if ca is None or cb is None:
        return ()
    if ca.get("status") == cb.get("status") and _has_figures(ca) == _has_figures(cb):
        return ()
    notes = []
    for cell, name in ((cb, names[1]), (ca, names[0])):
        status = cell.get("status")
        if status == "error":
            e = cell.get("error") or {}
            notes.append(f"raised {e.get('ename') or 'an error'} in {name}")
        elif status in ("not_run", "skipped"):
            notes.append(f"{str(status).replace('_', ' ')} in {name}")
        elif not _has_figures(cell):
            notes.append(f"no GPU figures in {name}")
    return tuple(notes)


def _environment(
    before: Mapping[str, Any], after: Mapping[str, Any], names: tuple[str, str]
) -> list[str]:
    out = []

    def gpus(doc: Mapping[str, Any]) -> str | None:
        g = doc.get("gpu") or {}
        found = ", ".join(dict.fromkeys(str(d.get("name")) for d in g.get("devices", [])))
        return found or None

    def torch(doc: Mapping[str, Any]) -> str | None:
        return (doc.get("gpu") or {}).get("torch_version")

    for what, read in (("GPUs", gpus), ("torch versions", torch)):
        x, y = read(before), read(after)
        if x and y and x != y:
            out.append(
                f"the runs were made with different {what} ({names[0]}: {x}; {names[1]}: {y}): "
                "figures may differ for that reason alone"
            )
    for doc, name in ((before, names[0]), (after, names[1])):
        replay = doc.get("replay")
        if replay:
            out.append(f"{name}: {replay.get('description') or 'replayed figures'}")
    return out


__all__ = [
    "DEFAULT_SPREAD",
    "compare",
    "explain",
]
