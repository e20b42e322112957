"""What a report says, as plain rows; text.py and html.py only lay them out."""

from __future__ import annotations

from dataclasses import dataclass

from ..model import CellReport, DeviceCellReport, DeviceSample, Measurement
from ..units import format_bytes as fb
from ..units import format_delta as fd


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    value: str
    note: str = ""


@dataclass(frozen=True, slots=True)
class Section:
    title: str
    rows: tuple[Row, ...]


def device_label(d: DeviceSample) -> str:
    prefix = "cuda" if d.backend in ("cuda", "rocm", "nvml") else d.backend
    return f"{prefix}:{d.index}" + (f" {d.name}" if d.name else "")


def _change(before: int | None, after: int | None, delta: int | None) -> str:
    if after is None:
        return "n/a"
    if before is None:
        return f"{fb(after)} ({fd(delta)})" if delta is not None else fb(after)
    return f"{fb(before)} -> {fb(after)} ({fd(delta)})"


def cell_header(r: CellReport) -> str:
    cell = f"cell [{r.execution_count}]" if r.execution_count is not None else "cell"
    status = f"FAILED ({r.error})" if r.failed else "ok"
    rss = f", host RSS {fd(r.host_rss_delta)}" if r.host_rss_delta is not None else ""
    return f"gpumem: {cell} {status} in {_seconds(r.wall_time)}{rss}"


def _seconds(s: float) -> str:
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def device_section(r: CellReport, d: DeviceCellReport) -> Section:
    a, b = d.after.allocator, d.before.allocator
    rows: list[Row] = []
    if a is None:
        used = d.after.device_used
        rows.append(
            Row("device used", f"{fb(used)} of {fb(d.after.total)}", "all processes (NVML)")
        )
        return Section(device_label(d.after), tuple(rows))
    ba = b.allocated if b else None
    br = b.reserved if b else None
    rows.append(Row("allocated", _change(ba, a.allocated, d.allocated_delta), "live tensors"))
    rows.append(Row("reserved", _change(br, a.reserved, d.reserved_delta), "cached by PyTorch"))
    peak_note = "exact" if d.peak_exact else "upper bound (--keep-peak: no new global peak)"
    rows.append(
        Row(
            "peak allocated",
            f"{fb(d.peak_allocated)} ({fd(d.peak_above_start)} above start)",
            peak_note,
        )
    )
    rows.append(Row("peak reserved", fb(d.peak_reserved), peak_note))
    outside_b, outside_a = d.before.outside_torch, d.after.outside_torch
    whose = "this process (NVML)" if d.after.outside_torch_is_process else "whole device"
    rows.append(
        Row(
            "outside PyTorch",
            _change(outside_b, outside_a, d.outside_torch_delta),
            f"context, libraries, uncached allocations; {whose}",
        )
    )
    if d.after.device_used is not None:
        rows.append(
            Row(
                "device used",
                f"{fb(d.after.device_used)} of {fb(d.after.total)} ({fd(d.device_used_delta)})",
                "all processes",
            )
        )
    rows.append(
        Row(
            "cudaMalloc / cudaFree",
            f"{d.device_allocs} / {d.device_frees}",
            f"retries {d.alloc_retries}, OOMs {d.ooms}",
        )
    )
    rows.append(
        Row("non-releasable", fb(a.inactive_split), "free pieces of split blocks (fragmentation)")
    )
    if d.after.limit is not None:
        rows.append(
            Row("cap", f"{fb(d.after.limit.bytes)} ({d.after.limit.fraction:.3g} of device)")
        )
    return Section(device_label(d.after), tuple(rows))


def cell_sections(r: CellReport) -> list[Section]:
    return [device_section(r, d) for d in r.devices]


def no_device_line(r: CellReport) -> str:
    if r.after.state != "ok":
        return r.after.message
    return "no GPU memory change on any device"


def compact_line(r: CellReport) -> str:
    """One line per cell for auto mode."""
    parts = []
    for d in r.devices:
        if d.after.allocator is None:
            continue
        a = d.after.allocator
        parts.append(
            f"{device_label(d.after).split()[0]} alloc {fd(d.allocated_delta)} "
            f"({fb(a.allocated)}), reserved {fd(d.reserved_delta)} ({fb(a.reserved)}), "
            f"peak {fb(d.peak_allocated)} ({fd(d.peak_above_start)})"
        )
    body = "; ".join(parts) if parts else no_device_line(r)
    cell = f"[{r.execution_count}] " if r.execution_count is not None else ""
    status = f" FAILED ({r.error})" if r.failed else ""
    return f"gpumem {cell}{body} | {_seconds(r.wall_time)}{status}"


TABLE_COLUMNS = (
    "device",
    "allocated",
    "reserved",
    "peak allocated",
    "non-releasable",
    "outside PyTorch",
    "process used",
    "device used / total",
    "cap",
)


def table_rows(m: Measurement) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for d in m.devices:
        a = d.allocator
        used = f"{fb(d.device_used)} / {fb(d.total)}" if d.total is not None else "n/a"
        cap = f"{fb(d.limit.bytes)}" if d.limit else "-"
        if a is None:
            rows.append((device_label(d), "-", "-", "-", "-", "-", fb(d.process_used), used, cap))
            continue
        rows.append(
            (
                device_label(d),
                fb(a.allocated),
                fb(a.reserved),
                fb(a.peak_allocated),
                fb(a.inactive_split),
                fb(d.outside_torch),
                fb(d.process_used),
                used,
                cap,
            )
        )
    return rows


def measurement_notes(m: Measurement) -> list[str]:
    notes = []
    if m.message:
        notes.append(m.message)
    if m.caching is False:
        notes.append(
            "caching is OFF: allocations go straight to cudaMalloc and are invisible to "
            "PyTorch's counters; device-level figures show them"
        )
    for d in m.devices:
        if d.error:
            notes.append(f"{device_label(d)}: {d.error}")
    if m.host_rss is not None:
        notes.append(f"host RSS {fb(m.host_rss)}")
    return notes
