"""One cell's allocations over time, from the allocator's trace (``%%gpumem --trace``).

The trace lists alloc and free events with the Python stack of each allocation (torch's
``device_traces``). Allocated memory after each event is the bytes allocated when the cell
began plus what the events added: its maximum is the cell's exact peak when the trace kept
every event (the ring buffer of ``max_entries`` did not wrap). Frees are counted when
requested, as the allocator's ``allocated_bytes`` counts them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..model import Timeline, TraceAllocation
from .sites import SiteResolver


def build_timeline(
    entries: Sequence[Mapping[str, Any]],
    device: int,
    base: int,
    resolver: SiteResolver,
    cell_files: frozenset[str],
    max_entries: int,
    snapshot_ms: float = 0.0,
) -> Timeline:
    times: list[int] = []
    active: list[int] = []
    allocations: list[dict[str, Any]] = []
    live: dict[int, int] = {}  # address -> index in allocations
    now = base
    for e in entries:
        action = e.get("action")
        if action == "alloc":
            now += int(e["size"])
            live[int(e["addr"])] = len(allocations)
            allocations.append({"e": e, "start": len(times), "end": None})
        elif action == "free_requested":
            now -= int(e["size"])
            i = live.pop(int(e["addr"]), None)
            if i is not None:
                allocations[i]["end"] = len(times)
        else:
            continue
        times.append(int(e.get("time_us", 0)))
        active.append(now)
    made = []
    for a in allocations:
        e = a["e"]
        frames = e.get("frames", [])
        f = resolver.cell_line(frames, cell_files) if frames else None
        line = int(f["line"]) if f is not None else None
        text = resolver.cells.line_text(f["filename"], line) if f is not None and line else ""
        made.append(
            TraceAllocation(
                int(e["addr"]),
                int(e["size"]),
                a["start"],
                a["end"],
                resolver.site(frames),
                line,
                text,
            )
        )
    peak_event = max(range(len(active)), key=active.__getitem__) if active else -1
    return Timeline(
        device=device,
        base=base,
        times_us=tuple(times),
        active=tuple(active),
        allocations=tuple(made),
        peak=active[peak_event] if active else base,
        peak_event=peak_event,
        entries=len(entries),
        max_entries=max_entries,
        complete=len(entries) < max_entries,
        snapshot_ms=snapshot_ms,
    )
