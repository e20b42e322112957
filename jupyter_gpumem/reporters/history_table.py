"""``%gpumem history`` as a table: one row per device of each measured cell, and a line
for each worker's out-of-memory error under it. For the magic, which pairs the table with
its plot (``bundles.history``)."""

from __future__ import annotations

from collections.abc import Sequence

from ..model import HistoryRow
from ..units import cuda_label, format_bytes, format_delta

HEADER = (
    "cell",
    "first line",
    "device",
    "alloc Δ",
    "reserved Δ",
    "peak",
    "above start",
    "OOMs",
    "time",
)


def history_rows(rows: Sequence[HistoryRow]) -> list[tuple[str, ...]]:
    """The table's rows (``HEADER``'s columns): a cell that touched no device gets one
    row of dashes."""
    body: list[tuple[str, ...]] = []
    for r in rows:
        for d in r.devices or (None,):
            body.append(
                (
                    "" if r.execution_count is None else str(r.execution_count),
                    r.first_line + (" (failed)" if r.failed else ""),
                    "-"
                    if d is None
                    else f"{cuda_label(d.device)}" + (f" {d.worker}" if d.worker else ""),
                    "-" if d is None else format_delta(d.allocated_delta),
                    "-" if d is None else format_delta(d.reserved_delta),
                    "-" if d is None else format_bytes(d.peak_allocated),
                    "-" if d is None else format_delta(d.peak_above_start),
                    str(d.ooms) if d is not None and d.ooms else "",
                    f"{r.wall_time:.3f} s",
                )
            )
    return body


def worker_oom_lines(rows: Sequence[HistoryRow]) -> list[str]:
    """A worker's out-of-memory error, in one line each (its post-mortem's)."""
    out = []
    for r in rows:
        for d in r.devices:
            if d.oom:
                cell = "" if r.execution_count is None else f"[{r.execution_count}] "
                out.append(
                    f"gpumem: {cell}{cuda_label(d.device)} {d.worker or ''}: out of memory: {d.oom}"
                )
    return out


__all__ = ["HEADER", "history_rows", "worker_oom_lines"]
