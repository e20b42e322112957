"""The one conversion from the model's records to the protocol's objects (schema.json's
``$defs``): :func:`to_protocol`, one :class:`~.wire.Wire` per record type.

A record's object is its fields (``wire.py`` derives the conversion from them); what the
wire leaves out, adds or names differently is said here once, in :data:`WIRES`: a
device's allocator figures are flattened into the ``Device`` object, a child process's
bytes travel as ``used``, a site carries its label, a ``WhoReport`` its time in ms, a
``Replay`` its sentence. A cell's devices and a segment map's blocks are views, written
out below. Tests validate every object this makes against schema.json, and check that
every field of every record here is in the schema or left out by name.
"""

from __future__ import annotations

from functools import singledispatch
from typing import Any

from ..collectors.torch_build import torch_version
from ..model import (
    AllocatorStats,
    Breakdown,
    CategoryShare,
    CellReport,
    DeviceRow,
    DeviceSample,
    Fix,
    Forecast,
    FreeSpace,
    HistoryRow,
    Limit,
    LineShare,
    Measurement,
    ModuleShare,
    PostMortem,
    ProcessMemory,
    Replay,
    SegmentMap,
    SegmentView,
    Site,
    WhoReport,
    WhoRow,
    WorkerDevice,
    WorkerReport,
)
from ..model.free import DeviceFree, FreeReport, Holder, LetGo
from .wire import Convert, Wire, converter


@singledispatch
def to_protocol(record: Any) -> Any:
    raise TypeError(f"no protocol object for {type(record).__name__}")


def _each(items: Any) -> list[Any]:
    return [to_protocol(x) for x in items]


def _maybe(record: Any) -> Any:
    return None if record is None else to_protocol(record)


def _round3(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _each_as(name: str) -> Convert:
    """A value function: the objects of a tuple of records that travel as ``WIRES[name]``
    says (an object nested in another, not the record's own protocol object)."""

    def each(items: Any) -> list[Any]:
        convert = _nested(name)
        return [convert(x) for x in items]

    return each


_made: dict[str, Convert] = {}


def _nested(name: str) -> Convert:
    """The converter of an object nested in another (``WIRES[name]``), made once."""
    convert = _made.get(name)
    if convert is None:
        convert = _made[name] = converter(*WIRES[name])
    return convert


def _cell_devices(r: CellReport) -> list[dict[str, Any]]:
    """A cell's devices: what it kept and its peak, and the lines that allocated what it
    kept (a view of the cell's figures, not a record's fields)."""
    out = []
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
        out.append(row)
    return out


def last_cell(r: CellReport, tracking: bool) -> dict[str, Any]:
    """A cell's report in more detail than its history row (the ``last_cell`` action):
    per device its peak reserved, the lines that allocated what it kept (``tracking``: all
    of them, largest first, none when it kept nothing; None: tracking is off) and its
    breakdown (--breakdown)."""
    breakdowns = {b.device: b for b in r.breakdowns}
    devices = []
    for d in r.devices:
        attribution = r.device_attribution(d.index)
        b = breakdowns.get(d.index)
        devices.append(
            {
                "index": d.index,
                "peak_reserved": d.peak_reserved,
                "peak_exact": d.peak_exact,
                "kept_lines": [to_protocol(s) for s in attribution.lines]
                if attribution is not None
                else []
                if tracking
                else None,
                "breakdown": None if b is None else to_protocol(b),
            }
        )
    return {
        "execution_count": r.execution_count,
        "devices": devices,
        "breakdown_note": r.breakdown_note,
    }


def _map_labels(m: SegmentMap) -> list[str]:
    """The allocation sites of a map's blocks, each once, in the order met."""
    return list(dict.fromkeys(b.site for s in m.segments for b in s.blocks if b.site))


def _map_segments(m: SegmentMap) -> list[dict[str, Any]]:
    """A map's segments, blocks as ``[offset, size, kind, label index]`` (-1: no site)."""
    labels = {label: i for i, label in enumerate(_map_labels(m))}
    out = []
    segment_of = _nested("segment_map.segments")
    for s in m.segments:
        segment = segment_of(s)
        segment["blocks"] = [
            [b.offset, b.size, b.kind, labels[b.site] if b.site else -1] for b in s.blocks
        ]
        out.append(segment)
    return out


# Where each record travels in schema.json (a ``$defs`` object, or an object nested in
# one: ``device.children`` is the items of the Device's ``children``), as what. A record's
# own protocol object (to_protocol's) is its ``$defs`` one, or the one in REGISTERED.
WIRES: dict[str, tuple[type, Wire]] = {
    "sample": (
        Measurement,
        Wire(
            omit=("clock",),  # this process's perf_counter: nothing to another one
            value={"devices": _each, "workers": _each, "replay": to_protocol},
            when={"workers": "truthy", "replay": "not_none"},
        ),
    ),
    "replay": (
        Replay,
        Wire(
            # the sentence every view shows
            extra={"description": lambda r: r.describe(torch_version())},
            when={"recorded": "not_none"},
            order=("gpu", "torch_version", "description", ...),
        ),
    ),
    "worker": (
        WorkerReport,
        Wire(
            # the kernel's own business: its OOM events and snapshot, and their post-mortem
            omit=("world_size", "ooms", "via", "oom_snapshot", "postmortem"),
            value={"age": _round3, "devices": _each_as("worker.devices")},
        ),
    ),
    "worker.devices": (
        WorkerDevice,
        Wire(omit=("allocated_before", "device_allocs", "peak_exact")),
    ),
    "device": (
        DeviceSample,
        Wire(
            # the allocator's figures, less the segments, blocks and fragmentation peak the
            # scan reads (the kernel's own)
            spread={"allocator": (AllocatorStats, ("segments", "blocks", "peak_inactive_split"))},
            value={"limit": _maybe, "children": _each_as("device.children")},
        ),
    ),
    "limit": (Limit, Wire()),
    "device.children": (ProcessMemory, Wire(rename={"bytes": "used"})),
    "cell_marker": (
        CellReport,
        Wire(
            # The rest is the cell's report in the kernel (%gpumem shows it); attribution
            # travels as each device's kept_at.
            omit=(
                *("before", "after", "error", "ooms", "hints", "attribution", "traceback"),
                *("trace", "breakdowns", "breakdown_note", "workers"),
            ),
            extra={"time": lambda r: r.after.time, "devices": _cell_devices},
            value={"postmortems": _each, "forecasts": _each},
            when={"postmortems": "truthy", "forecasts": "truthy"},
            order=("execution_count", "time", "wall_time", "failed", "first_line", ...),
        ),
    ),
    "forecast": (
        Forecast,
        Wire(omit=("factor",), value={"seconds_left": _round3}),  # factor: the text's
    ),
    # no message carries a site alone (a row names its site as a string)
    "site": (
        Site,
        Wire(
            extra={"label": lambda s: s.label},
            order=("kind", "label", "execution_count", ...),
        ),
    ),
    "line_share": (LineShare, Wire(omit=("site",))),  # the line is the cell's own
    "breakdown": (
        Breakdown,
        Wire(
            value={
                "categories": _each_as("breakdown.categories"),
                "modules": _each_as("breakdown.modules"),
            }
        ),
    ),
    "breakdown.categories": (CategoryShare, Wire()),
    "breakdown.modules": (ModuleShare, Wire()),
    "who_row": (WhoRow, Wire()),
    "who_report": (
        WhoReport,
        Wire(
            rename={"elapsed": "elapsed_ms"},
            value={"rows": _each, "notes": list, "elapsed": lambda s: round(s * 1000, 3)},
        ),
    ),
    "fix": (Fix, Wire(value={"free_names": list}, when={"free_names": "truthy"})),
    "postmortem": (
        PostMortem,
        Wire(
            omit=("expandable_segments",),  # said in the fixes' sentences
            value=dict.fromkeys(("other_processes", "owners", "lines", "fixes"), _each),
            order=("execution_count", "time", ...),
        ),
    ),
    "postmortem.other_processes": (ProcessMemory, Wire()),
    "history_cell": (
        HistoryRow,
        Wire(omit=("host_rss_delta",), value={"devices": _each_as("history_cell.devices")}),
    ),
    "history_cell.devices": (
        DeviceRow,
        Wire(
            omit=("outside_torch_delta", "device_allocs"),  # %gpumem history's own
            rename={"device": "index"},
            when={"worker": "not_none", "oom": "truthy"},
            order=(..., "worker", "oom"),
        ),
    ),
    "segment_map": (
        SegmentMap,
        Wire(
            omit=("owner",),  # the panel names the worker itself
            rename={"space": "summary"},
            value={"space": lambda s: _nested("segment_map.summary")(s)},
            extra={"segments": _map_segments, "labels": _map_labels},
            order=("device", "summary", "segments", "labels", ...),
        ),
    ),
    "free_report": (
        FreeReport,
        Wire(
            rename={"elapsed": "elapsed_ms"},
            value={
                **dict.fromkeys(("let_go", "kept", "devices", "still"), _each),
                "names": list,
                "notes": list,
                "elapsed": lambda s: round(s * 1000, 3),
            },
        ),
    ),
    "free_let_go": (LetGo, Wire()),
    "free_holder": (Holder, Wire()),
    "free_device": (DeviceFree, Wire()),
    # blocks: written by _map_segments (a block is an array, its site an index)
    "segment_map.segments": (SegmentView, Wire(omit=("blocks",))),
    "segment_map.summary": (
        FreeSpace,
        Wire(
            omit=("largest_piece", "expandable"),  # the map's text says them
            extra={
                "cached_free": lambda s: s.cached_free,
                "fragmentation": lambda s: round(s.fragmentation, 4),
            },
            order=("segments", "reserved", "allocated", "cached_free", ...),
        ),
    ),
}


def _register(cls: type, wire: Wire) -> None:
    """``cls``'s protocol object, its converter generated when first asked for."""

    def first(record: Any) -> Any:
        convert = converter(cls, wire)
        to_protocol.register(cls, convert)
        return convert(record)

    to_protocol.register(cls, first)


# A process's own object: as the post-mortem lists other processes (no $defs of its own).
REGISTERED = ("postmortem.other_processes",)

for _name, (_cls, _wire) in WIRES.items():
    if "." not in _name or _name in REGISTERED:
        _register(_cls, _wire)
