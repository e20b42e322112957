"""The one conversion from the model's records to the protocol's objects (schema.json's
``$defs``): :func:`to_protocol`, one rule per record type.

The records stay plain data; what the wire adds or names differently is said here once:
a device's allocator figures are flattened into the ``Device`` object, a child process's
bytes travel as ``used``, a site carries its label, a ``WhoReport`` its time in ms, a
``Replay`` its sentence.
Tests validate every object this makes against schema.json.
"""

from __future__ import annotations

from dataclasses import asdict
from functools import singledispatch
from typing import Any

from ..model import (
    AllocatorStats,
    CellReport,
    DeviceSample,
    Fix,
    Forecast,
    HistoryRow,
    LineShare,
    Measurement,
    PostMortem,
    ProcessMemory,
    Replay,
    SegmentMap,
    Site,
    WhoReport,
    WhoRow,
    WorkerReport,
)

# Allocator figures the Device object carries (segments, blocks and the fragmentation
# peak the scan reads are the kernel's own).
_DEVICE_ALLOCATOR = tuple(
    f
    for f in AllocatorStats.__dataclass_fields__
    if f not in ("segments", "blocks", "peak_inactive_split")
)
_NO_ALLOCATOR = dict.fromkeys(_DEVICE_ALLOCATOR)


@singledispatch
def to_protocol(record: Any) -> Any:
    raise TypeError(f"no protocol object for {type(record).__name__}")


@to_protocol.register
def _(m: Measurement) -> dict[str, Any]:
    """A ``Sample``."""
    sample = {
        "time": m.time,
        "state": m.state,
        "message": m.message,
        "torch_version": m.torch_version,
        "host_rss": m.host_rss,
        "caching": m.caching,
        "devices": [to_protocol(d) for d in m.devices],
    }
    if m.workers:
        sample["workers"] = [to_protocol(w) for w in m.workers]
    if m.replay is not None:
        sample["replay"] = to_protocol(m.replay)
    return sample


@to_protocol.register
def _(r: Replay) -> dict[str, Any]:
    """A ``Replay``: the record's fields and its sentence, which every view shows."""
    out = {"gpu": r.gpu, "torch_version": r.torch_version, "description": r.description}
    if r.recorded is not None:
        out["recorded"] = r.recorded
    return out


@to_protocol.register
def _(w: WorkerReport) -> dict[str, Any]:
    """A ``Worker``."""
    return {
        "pid": w.pid,
        "rank": w.rank,
        "host": w.host,
        "status": w.status,
        "started_in_cell": w.started_in_cell,
        "age": round(w.age, 3),
        "devices": [
            {
                "index": d.index,
                "name": d.name,
                "allocated": d.allocated,
                "reserved": d.reserved,
                "peak_allocated": d.peak_allocated,
                "peak_reserved": d.peak_reserved,
                "ooms": d.ooms,
            }
            for d in w.devices
        ],
    }


@to_protocol.register
def _(d: DeviceSample) -> dict[str, Any]:
    """A ``Device``."""
    a = d.allocator
    figures = {f: getattr(a, f) for f in _DEVICE_ALLOCATOR} if a is not None else _NO_ALLOCATOR
    return {
        "index": d.index,
        "name": d.name,
        "backend": d.backend,
        "initialized": d.initialized,
        **figures,
        "total": d.total,
        "device_used": d.device_used,
        "process_used": d.process_used,
        "limit": asdict(d.limit) if d.limit is not None else None,
        "error": d.error,
        "children": [{"pid": c.pid, "name": c.name, "used": c.bytes} for c in d.children],
    }


@to_protocol.register
def _(r: CellReport) -> dict[str, Any]:
    """A ``CellMarker``."""
    out: dict[str, Any] = {
        "execution_count": r.execution_count,
        "time": r.after.time,
        "wall_time": r.wall_time,
        "failed": r.failed,
        "first_line": r.first_line,
        "devices": [],
    }
    for d in r.devices:
        row: dict[str, Any] = {
            "index": d.index,
            "allocated_delta": d.allocated_delta or 0,
            "reserved_delta": d.reserved_delta or 0,
            "peak_allocated": d.peak_allocated,
        }
        attribution = r.device_attribution(d.index)
        if attribution is not None:
            row["kept_at"] = [to_protocol(s) for s in attribution.lines[:3]]
        out["devices"].append(row)
    if r.postmortems:
        out["postmortems"] = [to_protocol(p) for p in r.postmortems]
    if r.forecasts:
        out["forecasts"] = [to_protocol(f) for f in r.forecasts]
    return out


@to_protocol.register
def _(f: Forecast) -> dict[str, Any]:
    """A ``Forecast``."""
    return {
        "device": f.device,
        "worker": f.worker,
        "bytes_per_cell": f.bytes_per_cell,
        "cells_left": f.cells_left,
        "seconds_left": round(f.seconds_left, 3) if f.seconds_left is not None else None,
        "limit": f.limit,
        "limit_kind": f.limit_kind,
        "allocated": f.allocated,
        "cells": f.cells,
        "first_cell": f.first_cell,
        "who": f.who,
    }


@to_protocol.register
def _(s: Site) -> dict[str, Any]:
    return {
        "kind": s.kind,
        "label": s.label,
        "execution_count": s.execution_count,
        "filename": s.filename,
        "line": s.line,
        "function": s.function,
        "text": s.text,
        "library": s.library,
    }


@to_protocol.register
def _(s: LineShare) -> dict[str, Any]:
    return {"line": s.line, "text": s.text, "bytes": s.bytes, "blocks": s.blocks}


@to_protocol.register
def _(r: WhoRow) -> dict[str, Any]:
    return {
        "key": r.key,
        "detail": r.detail,
        "bytes": r.bytes,
        "blocks": r.blocks,
        "example": r.example,
        "kind": r.kind,
        "site": r.site,
    }


@to_protocol.register
def _(r: WhoReport) -> dict[str, Any]:
    return {
        "device": r.device,
        "by": r.by,
        "allocated": r.allocated,
        "explained": r.explained,
        "rows": [to_protocol(row) for row in r.rows],
        "tracking": r.tracking,
        "notes": list(r.notes),
        "outside_allocator": r.outside_allocator,
        "elapsed_ms": round(r.elapsed * 1000, 3),
    }


@to_protocol.register
def _(f: Fix) -> dict[str, Any]:
    return {
        "kind": f.kind,
        "text": f.text,
        "frees": f.frees,
        "fits": f.fits,
        "command": f.command,
        "first_step": f.first_step,
        "shortfall": f.shortfall,
    }


@to_protocol.register
def _(p: ProcessMemory) -> dict[str, Any]:
    return {"pid": p.pid, "name": p.name, "bytes": p.bytes}


@to_protocol.register
def _(p: PostMortem) -> dict[str, Any]:
    return {
        "execution_count": p.execution_count,
        "time": p.time,
        "device": p.device,
        "requested": p.requested,
        "free": p.free,
        "total": p.total,
        "cap": p.cap,
        "reserved": p.reserved,
        "allocated": p.allocated,
        "cached_free": p.cached_free,
        "releasable": p.releasable,
        "free_pieces": p.free_pieces,
        "free_pieces_bytes": p.free_pieces_bytes,
        "largest_free_block": p.largest_free_block,
        "outside_torch": p.outside_torch,
        "other_processes": [to_protocol(o) for o in p.other_processes],
        "owners": [to_protocol(r) for r in p.owners],
        "lines": [to_protocol(r) for r in p.lines],
        "fixes": [to_protocol(f) for f in p.fixes],
        "need": p.need,
        "need_full": p.need_full,
        "room": p.room,
        "hint": p.hint,
    }


@to_protocol.register
def _(row: HistoryRow) -> dict[str, Any]:
    """A ``HistoryCell``: the cell's row of ``%gpumem history`` (a worker's device names
    its worker)."""
    return {
        "execution_count": row.execution_count,
        "time": row.time,
        "first_line": row.first_line,
        "wall_time": row.wall_time,
        "failed": row.failed,
        "devices": [
            {
                "index": d.device,
                "allocated": d.allocated,
                "allocated_delta": d.allocated_delta,
                "reserved": d.reserved,
                "reserved_delta": d.reserved_delta,
                "peak_allocated": d.peak_allocated,
                "peak_above_start": d.peak_above_start,
                "kept_at": d.kept_at,
                "ooms": d.ooms,
                **({"worker": d.worker} if d.worker is not None else {}),
                **({"oom": d.oom} if d.oom else {}),
            }
            for d in row.devices
        ],
    }


@to_protocol.register
def _(m: SegmentMap) -> dict[str, Any]:
    """A device's ``SegmentMap``: blocks as ``[offset, size, kind, label index]``, the
    labels (allocation sites) listed once."""
    labels: dict[str, int] = {}
    segments = []
    for s in m.segments:
        blocks = []
        for b in s.blocks:
            label = labels.setdefault(b.site, len(labels)) if b.site else -1
            blocks.append([b.offset, b.size, b.kind, label])
        segments.append(
            {
                "address": s.address,
                "size": s.size,
                "pool": s.pool,
                "stream": s.stream,
                "expandable": s.expandable,
                "blocks": blocks,
            }
        )
    sp = m.space
    return {
        "device": m.device,
        "summary": {
            "segments": sp.segments,
            "reserved": sp.reserved,
            "allocated": sp.allocated,
            "cached_free": sp.cached_free,
            "releasable": sp.releasable,
            "pieces": sp.pieces,
            "pieces_bytes": sp.pieces_bytes,
            "largest_free_block": sp.largest_free_block,
            "fragmentation": round(sp.fragmentation, 4),
        },
        "segments": segments,
        "labels": list(labels),
        "omitted": m.omitted,
        "omitted_bytes": m.omitted_bytes,
        "tracking": m.tracking,
    }
