"""What a report says, as plain rows; text.py and html.py only lay them out."""

from __future__ import annotations

from dataclasses import dataclass

from ..model import (
    CellReport,
    DeviceAttribution,
    DeviceCellReport,
    DeviceSample,
    Forecast,
    Measurement,
    PostMortem,
    TracebackHoldings,
    WorkerReport,
)
from ..units import cuda_label, format_bytes
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
        return f"{format_bytes(after)} ({fd(delta)})" if delta is not None else format_bytes(after)
    return f"{format_bytes(before)} -> {format_bytes(after)} ({fd(delta)})"


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
            Row(
                "device used",
                f"{format_bytes(used)} of {format_bytes(d.after.total)}",
                "all processes (NVML)",
            )
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
            f"{format_bytes(d.peak_allocated)} ({fd(d.peak_above_start)} above start)",
            peak_note,
        )
    )
    rows.append(Row("peak reserved", format_bytes(d.peak_reserved), peak_note))
    rows.append(_outside_row(d))
    if d.after.device_used is not None:
        rows.append(
            Row(
                "device used",
                f"{format_bytes(d.after.device_used)} of {format_bytes(d.after.total)} "
                f"({fd(d.device_used_delta)})",
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
        Row(
            "non-releasable",
            format_bytes(a.inactive_split),
            "free pieces of split blocks (fragmentation)",
        )
    )
    if d.after.limit is not None:
        rows.append(
            Row(
                "cap",
                f"{format_bytes(d.after.limit.bytes)} ({d.after.limit.fraction:.3g} of device)",
            )
        )
    attribution = r.device_attribution(d.index)
    if attribution is not None:
        rows.append(Row("kept, allocated at", attribution_text(attribution), "allocation tracking"))
    return Section(device_label(d.after), tuple(rows))


def attribution_text(a: DeviceAttribution, lines: int = 3) -> str:
    """``1.00 GiB at line 3 `acts.append(h)`, 200.00 MiB at line 5``."""
    parts = [
        f"{format_bytes(s.bytes)} at line {s.line}" + (f" `{_clip(s.text)}`" if s.text else "")
        for s in a.lines[:lines]
    ]
    rest = sum(s.bytes for s in a.lines[lines:])
    if rest:
        parts.append(f"{format_bytes(rest)} at {len(a.lines) - lines} more line(s)")
    if a.elsewhere:
        parts.append(f"{format_bytes(a.elsewhere)} outside this cell's code")
    if a.no_stack:
        parts.append(f"{format_bytes(a.no_stack)} without a Python stack (backward pass, C++)")
    return ", ".join(parts) if parts else "nothing new is alive"


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def postmortem_sections(p: PostMortem, who: str = "", trimmed: bool = False) -> list[Section]:
    """The post-mortem's two sections; ``who``: a worker process's (``rank 1 (pid 42)``),
    from the snapshot its own OOM observer took at the failure."""
    dev = f"{who} {cuda_label(p.device)}" if who else f"{cuda_label(p.device)}"
    needer = "the cell"
    rows = [Row("asked for", format_bytes(p.requested), "the allocation that failed")]
    rows.append(
        Row(
            "free on the device",
            format_bytes(p.free),
            f"of {format_bytes(p.total)}, all processes" if p.total else "",
        )
    )
    if p.cap is not None:
        rows.append(
            Row("cap", format_bytes(p.cap), f"PyTorch reserves {format_bytes(p.reserved)} of it")
        )
    if who:
        needer = "the rank" if who.startswith("rank") or " rank " in who else "the worker"
        note = "its live blocks at the failure" + (
            " (snapshot trimmed: adjacent live blocks merged)" if trimmed else ""
        )
        rows.append(Row("allocated by PyTorch", format_bytes(p.allocated), note))
    else:
        rows.append(
            Row("allocated by PyTorch", format_bytes(p.allocated), "live tensors, by owner:")
        )
    rows += [Row(f"  {w.key}", format_bytes(w.bytes), _who_note(w)) for w in p.owners]
    if p.lines:
        rows.append(Row("allocated, by line", "", "where the live blocks were allocated:"))
        rows += [Row(f"  {w.key}", format_bytes(w.bytes), _who_note(w)) for w in p.lines]
    pieces = (
        f"{p.free_pieces} piece(s) in use segments ({format_bytes(p.free_pieces_bytes)}), "
        f"largest free block {format_bytes(p.largest_free_block)}"
    )
    if not who:
        pieces += f"; empty-cache would return {format_bytes(p.releasable)}"
    rows.append(Row("cached, free", format_bytes(p.cached_free), pieces))
    if p.outside_torch is not None:
        rows.append(
            Row("outside PyTorch", format_bytes(p.outside_torch), "CUDA context, libraries")
        )
    others = sum(b for _, _, b in p.other_processes)
    if not who:  # a worker's post-mortem does not list the device's other processes
        rows.append(
            Row(
                "other processes",
                format_bytes(others) if p.other_processes else "none",
                ", ".join(
                    f"PID {pid} {name} {format_bytes(b)}" for pid, name, b in p.other_processes[:5]
                ),
            )
        )
    if p.need is not None and p.room is not None:
        whole = (
            f"; the whole cell needs {format_bytes(p.need_full)}" if p.need_full is not None else ""
        )
        if who:
            rows.append(
                Row(
                    f"{needer} needed",
                    format_bytes(p.need),
                    "all it held when it failed, with the request; restarted, PyTorch can "
                    f"use {format_bytes(p.room)} for it here",
                )
            )
        else:
            rows.append(
                Row(
                    "the cell needs",
                    format_bytes(p.need) + " so far",
                    f"above its start when it failed, with the request{whole}; after the "
                    f"first steps PyTorch can use {format_bytes(p.room)} for it here",
                )
            )
    if p.hint:
        rows.append(Row("largest that fits", "", p.hint))
    fixes = []
    for i, f in enumerate(p.fixes, 1):
        verdict = "first" if f.first_step else {True: "fits", False: "no", None: "maybe"}[f.fits]
        fixes.append(Row(f"{i}. {verdict}", f.text))
    return [
        Section(f"out of memory on {dev}: what filled it", tuple(rows)),
        Section(f"out of memory on {dev}: fixes, best first", tuple(fixes)),
    ]


def postmortem_line(p: PostMortem) -> str:
    """The post-mortem in one line (the history's short form): ``asked 3.00 GiB, largest
    free block 512.00 MiB, free 76.00 GiB, cap 4.00 GiB; best fix: cap (maybe)``."""
    parts = [
        f"asked {format_bytes(p.requested)}",
        f"largest free block {format_bytes(p.largest_free_block)}",
        f"free {format_bytes(p.free)}",
    ]
    if p.cap is not None:
        parts.append(f"cap {format_bytes(p.cap)}")
    text = ", ".join(parts)
    best = next((f for f in p.fixes if not f.first_step and f.kind != "smaller"), None)
    if best is not None:
        verdict = {True: "fits", False: "no", None: "maybe"}[best.fits]
        text += f"; best fix: {best.kind} ({verdict})"
    return text


def _who_note(w: object) -> str:
    from ..model import WhoRow

    assert isinstance(w, WhoRow)
    parts = [w.detail, f"allocated at {w.site}" if w.site else "", w.example]
    return "; ".join(p for p in parts if p)


def traceback_section(t: TracebackHoldings) -> Section:
    rows = [Row(h.name, format_bytes(h.bytes), h.frame) for h in t.holdings]
    rows.append(Row("release with", "%gpumem release-traceback", "drops the kept frames"))
    return Section(f"the kept traceback holds {format_bytes(t.bytes)}", tuple(rows))


def _outside_row(d: DeviceCellReport) -> Row:
    """Device memory beyond PyTorch's reservation, both ends from one source: this
    process's NVML figure when known at both ends, else the whole device's usage."""
    b, a = d.before, d.after
    reserved_b = b.allocator.reserved if b.allocator is not None else 0
    reserved_a = a.allocator.reserved if a.allocator is not None else 0
    if a.process_used is not None and (b.process_used is not None or not b.initialized):
        before = (b.process_used or 0) - reserved_b if b.initialized else None
        after = a.process_used - reserved_a
        whose = "this process (NVML)"
    elif a.device_used is not None and b.device_used is not None and b.initialized:
        before, after = b.device_used - reserved_b, a.device_used - reserved_a
        whose = "whole device: all processes"
    else:
        return Row("outside PyTorch", "n/a", "not known at both ends of the cell")
    delta = after - before if before is not None else after
    return Row(
        "outside PyTorch",
        _change(before, after, delta),
        f"context, libraries, uncached allocations; {whose}",
    )


def cell_sections(r: CellReport) -> list[Section]:
    out = [device_section(r, d) for d in r.devices]
    for p in r.postmortems:
        out += postmortem_sections(p)
    if r.traceback is not None and r.traceback.bytes:
        out.append(traceback_section(r.traceback))
    if r.workers:
        out.append(workers_section(r.workers))
        for w in r.workers:
            if w.postmortem is not None:
                trimmed = w.oom_snapshot is not None and w.oom_snapshot.trimmed
                out += postmortem_sections(w.postmortem, w.label, trimmed)
    return out


_STATUS = {
    "exited": "exited",
    "running": "still running at the cell's end",
    "silent": "stopped reporting without a last report (killed or hung)",
}


def workers_section(workers: tuple[WorkerReport, ...]) -> Section:
    """Each worker's own allocator, per device: exact, as the worker read it."""
    rows: list[Row] = []
    for w in workers:
        notes = [_STATUS[w.status]]
        if w.status != "exited" and w.age >= 1:
            notes.append(f"last report {w.age:.1f} s before the cell's end")
        if not w.started_in_cell:
            notes.append("started before this cell: peak since its start")
        for e in w.ooms:
            notes.append(
                f"out of memory on {cuda_label(e.device)}: asked {format_bytes(e.requested)} "
                f"with {format_bytes(e.free)} free of {format_bytes(e.allowed)}"
            )
        if not w.devices:
            rows.append(Row(w.label, "no CUDA memory", "; ".join(notes)))
        for d in w.devices:
            before = None if w.started_in_cell else d.allocated_before
            value = (
                f"allocated {_change(before, d.allocated, d.allocated_delta)}, "
                f"peak {format_bytes(d.peak_allocated)}{'' if d.peak_exact else ' (upper bound)'}, "
                f"reserved {format_bytes(d.reserved)}"
            )
            if d.ooms:
                value += f", {d.ooms} OOM" + ("s" if d.ooms > 1 else "")
            rows.append(Row(f"{w.label} {cuda_label(d.index)}", value, "; ".join(notes)))
            notes = []
    return Section(f"worker processes ({len(workers)}): their own allocators", tuple(rows))


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
        part = (
            f"{device_label(d.after).split()[0]} alloc {fd(d.allocated_delta)} "
            f"({format_bytes(a.allocated)}), reserved {fd(d.reserved_delta)} "
            f"({format_bytes(a.reserved)}), peak {format_bytes(d.peak_allocated)} "
            f"({fd(d.peak_above_start)})"
        )
        attribution = r.device_attribution(d.index)
        if attribution is not None and attribution.lines:
            top = attribution.lines[0]
            part += f", top line {top.line} `{_clip(top.text, 40)}` {format_bytes(top.bytes)}"
        parts.append(part)
    if r.workers:
        peaks = ", ".join(
            (f"rank {w.rank}" if w.rank is not None else f"pid {w.pid}")
            + f" peak {format_bytes(w.peak_allocated)}"
            + (f" {w.status}" if w.status != "exited" else "")
            for w in r.workers
        )
        parts.append(f"workers: {peaks}")
    body = "; ".join(parts) if parts else no_device_line(r)
    cell = f"[{r.execution_count}] " if r.execution_count is not None else ""
    status = f" FAILED ({r.error})" if r.failed else ""
    line = f"gpumem {cell}{body} | {_seconds(r.wall_time)}{status}"
    if r.forecasts:
        # the device is named unless it is the only one the line speaks of
        named = len(r.forecasts) > 1 or len(parts) > 1 or r.forecasts[0].worker is not None
        line += " | " + "; ".join(
            (f"{forecast_target(f)}: " if named else "") + forecast_text(f) for f in r.forecasts
        )
    return line


def duration(seconds: float) -> str:
    """A time span as people say it: ``45 s``, ``12 min``, ``3.5 h``, ``2.5 days``."""
    if seconds < 59.5:
        return f"{max(1, round(seconds))} s"
    if seconds < 3570:  # 59.5 min rounds to "1.0 h"
        return f"{round(seconds / 60)} min"
    if seconds < 47.95 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def forecast_target(f: Forecast) -> str:
    """``cuda:0``, or the worker's device: ``rank 1 (pid 4242) cuda:0``."""
    return (f"{f.worker} " if f.worker else "") + f"{cuda_label(f.device)}"


def forecast_text(f: Forecast) -> str:
    """``at this rate, out of memory in about 112 cells (about 3.5 h)``."""
    if f.cells_left == 0:
        return "at this rate, out of memory in the next cell"
    cells = f"{f.cells_left} cell" + ("s" if f.cells_left != 1 else "")
    when = f" (about {duration(f.seconds_left)})" if f.seconds_left is not None else ""
    return f"at this rate, out of memory in about {cells}{when}"


def forecast_line(f: Forecast) -> str:
    """The full report's line: the forecast, the rate it comes from, against what, and
    who grows (with tracking)."""
    limit = (
        f"the cap of {format_bytes(f.limit)}"
        if f.limit_kind == "cap"
        else f"{format_bytes(f.limit)}, reserved + the device's free memory"
    )
    who = f"; grows at {f.who}" if f.who else ""
    if f.factor is not None:  # a geometric growth: the factor, 3 decimals when small
        rate = f"×{f.factor:.2f}" if f.factor >= 1.1 else f"×{f.factor:.3f}"
    else:
        rate = fd(f.bytes_per_cell)
    return (
        f"forecast {forecast_target(f)}: {forecast_text(f)}: {rate} a cell "
        f"over the last {f.cells} cells ({format_bytes(f.allocated)} allocated), against "
        f"{limit}{who}"
    )


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
        used = (
            f"{format_bytes(d.device_used)} / {format_bytes(d.total)}"
            if d.total is not None
            else "n/a"
        )
        cap = f"{format_bytes(d.limit.bytes)}" if d.limit else "-"
        if a is None:
            rows.append(
                (device_label(d), "-", "-", "-", "-", "-", format_bytes(d.process_used), used, cap)
            )
            rows += _child_rows(d)
            continue
        rows.append(
            (
                device_label(d),
                format_bytes(a.allocated),
                format_bytes(a.reserved),
                format_bytes(a.peak_allocated),
                format_bytes(a.inactive_split),
                format_bytes(d.outside_torch),
                format_bytes(d.process_used),
                used,
                cap,
            )
        )
        rows += _child_rows(d)
    return rows


def _child_rows(d: DeviceSample) -> list[tuple[str, ...]]:
    """The kernel's child processes on the device, under it (their own memory, NVML)."""
    return [
        (f"  child {pid} {name}", "-", "-", "-", "-", "-", format_bytes(used), "", "")
        for pid, name, used in d.children
    ]


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
        notes.append(f"host RSS {format_bytes(m.host_rss)}")
    return notes
