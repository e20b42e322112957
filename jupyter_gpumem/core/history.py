"""Bounded history of measured cells, a few hundred bytes per cell."""

from __future__ import annotations

import csv
from collections import deque
from collections.abc import Iterator
from itertools import islice
from typing import Any

from ..model import CellReport, DeviceRow, HistoryRow
from ..reporters._rows import postmortem_line

FIRST_LINE_CHARS = 60


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


# CSV/DataFrame columns: the cell's fields, then the device's.
COLUMNS = (*HistoryRow._fields[:-1], *DeviceRow._fields)


def _kept_at(r: CellReport, device: int) -> str | None:
    a = r.device_attribution(device)
    if a is None or not a.lines:
        return None
    top = a.lines[0]
    text = top.text if len(top.text) <= 40 else top.text[:39] + "…"
    return f"line {top.line} `{text}`"


def _worker_rows(r: CellReport) -> tuple[DeviceRow, ...]:
    return tuple(
        DeviceRow(
            d.index,
            d.allocated,
            d.allocated_delta,
            d.reserved,
            None,
            d.peak_allocated,
            d.peak_allocated - d.allocated_before,
            None,
            None,
            None,
            w.label,
            d.ooms,
            postmortem_line(w.postmortem)
            if w.postmortem is not None and w.postmortem.device == d.index
            else None,
        )
        for w in r.workers
        for d in w.devices
    )


def row_from_report(r: CellReport) -> HistoryRow:
    devices: tuple[DeviceRow, ...] = ()
    if r.devices:  # most cells touch no device: no rows to make
        devices = tuple(
            DeviceRow(
                d.index,
                d.after.allocator.allocated if d.after.allocator else None,
                d.allocated_delta,
                d.after.allocator.reserved if d.after.allocator else None,
                d.reserved_delta,
                d.peak_allocated,
                d.peak_above_start,
                d.outside_torch_delta,
                d.device_allocs,
                _kept_at(r, d.index),
                None,
                d.ooms,
            )
            for d in r.devices
        )
    if r.workers:
        devices += _worker_rows(r)
    return HistoryRow(
        r.execution_count,
        r.after.time,
        r.first_line[:FIRST_LINE_CHARS],
        r.wall_time,
        r.failed,
        r.host_rss_delta,
        devices,
    )


class History:
    def __init__(self, maxlen: int = 1000) -> None:
        self._rows: deque[HistoryRow] = deque(maxlen=maxlen)

    @property
    def maxlen(self) -> int:
        return self._rows.maxlen or 0

    def add(self, report: CellReport) -> HistoryRow:
        row = row_from_report(report)
        self._rows.append(row)
        return row

    def add_row(self, row: HistoryRow) -> None:
        """A row made elsewhere (a recorded cell that the demo's kernel plays back)."""
        self._rows.append(row)

    def clear(self) -> None:
        self._rows.clear()

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[HistoryRow]:
        return iter(self._rows)

    def last(self, n: int | None = None) -> list[HistoryRow]:
        rows = list(self._rows)
        return rows if n is None else rows[-n:] if n > 0 else []

    def tail(self, n: int) -> list[HistoryRow]:
        """The last ``n`` rows, oldest first, without copying the whole history (what
        every measured cell's forecast reads)."""
        rows = list(islice(reversed(self._rows), n))
        rows.reverse()
        return rows

    def records(self, n: int | None = None) -> list[dict[str, Any]]:
        """One flat record per (cell, device); a cell that touched no device gets one row."""
        out: list[dict[str, Any]] = []
        for row in self.last(n):
            base = dict(zip(HistoryRow._fields[:-1], row[:-1], strict=True))
            devs = row.devices or (DeviceRow(*([None] * len(DeviceRow._fields))),)  # type: ignore[arg-type]
            for d in devs:
                rec = dict(base)
                rec.update(d._asdict())
                out.append(rec)
        return out

    def write_csv(self, path: str, n: int | None = None) -> int:
        """Write the rows to a new file. Text that a spreadsheet would read as a formula
        (a cell's first line starting with = + - @, tab or carriage return) gets a leading
        apostrophe, as spreadsheet-safe CSV writers do (OWASP "CSV injection")."""
        recs = [{k: spreadsheet_safe(v) for k, v in r.items()} for r in self.records(n)]
        with open(path, "x", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(COLUMNS))
            w.writeheader()
            w.writerows(recs)
        return len(recs)

    def dataframe(self, n: int | None = None) -> Any:
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError(
                "jupyter_gpumem.history() returns a pandas DataFrame: pip install pandas "
                "(or use `%gpumem history --csv PATH`)"
            ) from e
        df = pd.DataFrame.from_records(self.records(n), columns=list(COLUMNS))
        df["time"] = pd.to_datetime(df["time"], unit="s")
        return df
