"""What a cell's peak was made of, from plain records (``%%gpumem --breakdown``).

Inputs, all recorded while the cell ran (``collectors/step.py``) and then read from the
allocator:

- the allocator's trace of the cell on one device: every ``alloc`` and ``free_requested``
  with its address and block size, and the segment events, in order;
- the blocks alive when the cell ended (address, size);
- *observations*: "at this point, this storage was a parameter / a gradient / optimizer
  state / saved by autograd for backward", each stamped with the device's position (how
  many allocations and frees it had made since the cell began: the allocator's own
  counters, read when the observation was made);
- *marks*: where the forward pass, the backward pass and each optimizer step began and
  ended, and each module's forward call, stamped the same way.

Replaying the trace gives the exact peak (the allocator counts frees when requested) and
the blocks alive then. Each block gets the first category of :data:`CATEGORIES` that an
observation made *during its lifetime* gives it: addresses are reused all the time, and a
position says whether the observed storage was this block or an earlier one at the same
address. Blocks nobody claimed are temporaries (allocated in the cell) or kept from before.
Every block alive at the peak is counted once, so the categories add up to the peak.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..model import (
    CATEGORIES,
    Breakdown,
    CategoryShare,
    CellReport,
    Mark,
    ModuleCall,
    ModuleShare,
    Observed,
    Phase,
    StepRecord,
)
from .allocator_rules import MIN_BLOCK_SIZE
from .blocks import Heap, end_differences, settings_notes

_RANK: dict[str, int] = {c: i for i, c in enumerate(CATEGORIES)}
NO_MODULE = "(outside any module)"


class _Block:
    __slots__ = ("address", "end", "size", "start")

    def __init__(self, address: int, size: int, start: int) -> None:
        self.address = address
        self.size = size
        self.start = start  # the event that allocated it (0: before the cell)
        self.end: int | None = None  # the event that freed it

    def alive(self, position: int) -> bool:
        return self.start <= position and (self.end is None or position < self.end)


_ACTIONS = frozenset(
    (
        "alloc",
        "free_requested",
        "free_completed",
        "segment_alloc",
        "segment_free",
        "segment_map",
        "segment_unmap",
    )
)


Event = tuple[str, int, int, int]  # action, address, size, time_us
TOLERANCE_US = 1  # the trace's clock and Python's agree to about this


def events_from_trace(entries: Iterable[Mapping[str, Any]]) -> list[Event]:
    """(action, address, size, time_us) of the events that matter, from
    ``torch.cuda.memory._snapshot()["device_traces"][i]`` (plain tuples: a training step
    has tens of thousands of them)."""
    actions = _ACTIONS
    return [
        (e["action"], e["addr"], e["size"], e.get("time_us", 0))
        for e in entries
        if e["action"] in actions
    ]


def analyze(
    device: int,
    events: Sequence[Event],
    begin_segments: Sequence[Mapping[str, Any]],
    live_at_end: Sequence[tuple[int, int]],
    observations: Iterable[Observed],
    marks: Sequence[Mark],
    calls: Sequence[ModuleCall],
    *,
    base: int,
    base_reserved: int | None,
    counter_peak: int | None,
    end_position: int | None,
    settings: Mapping[str, Any] | None = None,
    outside_torch: int | None = None,
    max_modules: int = 8,
) -> Breakdown:
    """The breakdown of one device's peak. ``begin_segments``: the allocator's segments
    (with their blocks) when the cell began; ``live_at_end``: its live blocks (address,
    size) when it ended; ``end_position``: its own count of the cell's allocations and
    frees (checks that the trace lost nothing); ``counter_peak``: its peak counter, reset
    when the cell began (checks the replay)."""
    max_split, _ = settings_notes(settings or {})
    heap = Heap.from_segments(begin_segments, max_split)
    base_list = [_Block(a, size, 0) for a, size in heap.live.items()]
    replay = _replay(heap, base_list, events, base_reserved)
    peak_at = replay.peak_at
    notes = _replay_notes(replay, heap, base_list, live_at_end, base, counter_peak, end_position)
    at_peak = [b for b in base_list if b.alive(peak_at)]
    at_peak += [b for b in replay.blocks if b.alive(peak_at)]
    claims = _Claims(device, observations, marks, replay.times, peak_at)
    totals, activations, temporaries = _categorize(at_peak, claims)
    categories = tuple(
        CategoryShare(c, totals[c][0], totals[c][1]) for c in CATEGORIES if totals[c][1]
    )
    shares = _module_shares(calls, replay.times, temporaries, activations)
    return Breakdown(
        device=device,
        peak=replay.peak,
        base=base,
        categories=categories,
        phase=_phase(device, marks, peak_at),
        modules=tuple(shares[:max_modules]),
        reserved_at_peak=replay.reserved_at_peak,
        outside_torch=outside_torch,
        exact=not notes,
        events=replay.position,
        peak_event=peak_at,
        counter_peak=counter_peak,
        note="; ".join(notes),
    )


@dataclass(frozen=True, slots=True)
class _Replay:
    """The trace replayed on the allocator's blocks: the exact peak and where it was."""

    blocks: list[_Block]  # every block the cell allocated, in order
    position: int  # allocations and frees replayed
    peak: int  # the largest allocated
    peak_at: int  # the position of the allocation that made it (0: before the cell)
    reserved_at_peak: int | None
    times: list[int]  # time_us of the event at each position (position - 1)


def _replay(
    heap: Heap, base_list: list[_Block], events: Sequence[Event], base_reserved: int | None
) -> _Replay:
    """Replay the trace on ``heap`` (its blocks when the cell began: ``base_list``),
    stamping each block with the positions that allocated and freed it. The allocator
    counts a free when it is requested."""
    blocks: list[_Block] = []
    live: dict[int, _Block] = {b.address: b for b in base_list}
    allocated, reserved = sum(heap.live.values()), base_reserved
    position = 0
    peak, peak_at, reserved_at_peak = allocated, 0, base_reserved
    alloc, free_requested, free_completed = heap.alloc, heap.free_requested, heap.free_completed
    times: list[int] = []
    for action, address, size, time_us in events:
        if action == "alloc":
            position += 1
            times.append(time_us)
            b = _Block(address, alloc(address, size), position)
            blocks.append(b)
            live[address] = b
            allocated += b.size
            if allocated > peak:
                peak, peak_at, reserved_at_peak = allocated, position, reserved
        elif action == "free_requested":
            position += 1
            times.append(time_us)
            allocated -= free_requested(address, size)
            found = live.pop(address, None)
            if found is not None:
                found.end = position
        elif action == "free_completed":
            free_completed(address)
        elif action in ("segment_alloc", "segment_map"):
            heap.segment_alloc(address, size)
            if reserved is not None:
                reserved += size
        elif action in ("segment_free", "segment_unmap"):
            heap.segment_free(address, size)
            if reserved is not None:
                reserved -= size
    return _Replay(blocks, position, peak, peak_at, reserved_at_peak, times)


def _replay_notes(
    replay: _Replay,
    heap: Heap,
    base_list: list[_Block],
    live_at_end: Sequence[tuple[int, int]],
    base: int,
    counter_peak: int | None,
    end_position: int | None,
) -> list[str]:
    """Why the replay may not be exact, checked against the allocator's own figures:
    none when it is."""
    notes = []
    position, peak = replay.position, replay.peak
    if end_position is not None and end_position != position:
        notes.append(
            f"the trace holds {position} of the cell's {end_position} allocations and frees "
            "(its ring buffer wrapped: raise --entries)"
        )
    base_sum = sum(b.size for b in base_list)
    if base_sum != base:
        notes.append(f"blocks from before the cell sum to {base_sum} B, not {base} B")
    differ = end_differences(heap, live_at_end) + heap.mismatches
    if differ:
        notes.append(
            f"the replay of the allocator's blocks differs from its end state in {differ} block(s)"
        )
    if counter_peak is not None and counter_peak != peak:
        notes.append(f"the replayed peak {peak} B differs from the allocator's {counter_peak} B")
    return notes


class _Claims:
    """The observations of one device, by address: which one claims a block."""

    __slots__ = ("by_address", "released_by_peak", "times")

    def __init__(
        self,
        device: int,
        observations: Iterable[Observed],
        marks: Sequence[Mark],
        times: list[int],
        peak_at: int,
    ) -> None:
        self.times = times
        self.by_address: dict[int, list[Observed]] = {}
        for o in observations:
            if o.device == device:
                self.by_address.setdefault(o.address, []).append(o)
        # A saved tensor is an activation until the backward pass that uses it is over:
        # then autograd has let go of it, whatever else still holds its storage (the
        # input batch).
        done = [m.positions.get(device, 0) for m in marks if m.phase == "backward done"]
        self.released_by_peak = [d for d in done if d < peak_at]

    def window(self, t_ns: int) -> tuple[int, int]:
        """The positions a moment of Python's clock falls between, on the trace's clock."""
        t = t_ns // 1000
        times = self.times
        return bisect_left(times, t - TOLERANCE_US), bisect_right(times, t + TOLERANCE_US)

    def owner(self, b: _Block) -> Observed | None:
        """The observation that claims ``b``: made during its lifetime, of the first
        category of :data:`CATEGORIES` among them; None when nobody claimed it."""
        best: Observed | None = None
        released_by_peak = self.released_by_peak
        for o in self.by_address.get(b.address, ()):
            if o.position >= 0:
                if not b.alive(o.position):
                    continue
                seen_at = o.position
            else:  # stamped by the clock: the block alive at some point of its window
                lo, hi = self.window(o.time_ns)
                if not (b.start <= hi and (b.end is None or b.end > lo)):
                    continue
                seen_at = lo
            if o.category == "activations" and any(seen_at <= d for d in released_by_peak):
                continue
            if best is None or _RANK[o.category] < _RANK[best.category]:
                best = o
        return best


def _categorize(
    at_peak: list[_Block], claims: _Claims
) -> tuple[dict[str, list[int]], dict[str, int], list[_Block]]:
    """(bytes and blocks by category, bytes each module saved for backward, the
    temporaries) of the blocks alive at the peak; every block counted once."""
    totals: dict[str, list[int]] = {c: [0, 0] for c in CATEGORIES}
    activations: dict[str, int] = {}  # module -> bytes it saved, alive at the peak
    temporaries: list[_Block] = []
    for b in at_peak:
        claim = claims.owner(b)
        if claim is None:
            category = "kept from before" if b.start == 0 else "temporaries"
            totals[category][0] += b.size
            totals[category][1] += 1
            if b.start:
                temporaries.append(b)
            continue
        owned = min(b.size, _rounded(claim.nbytes))
        totals[claim.category][0] += owned
        totals[claim.category][1] += 1
        if b.size > owned:
            totals["block slack"][0] += b.size - owned
            totals["block slack"][1] += 1
        if claim.category == "activations":
            name = claim.module or NO_MODULE
            activations[name] = activations.get(name, 0) + owned
    return totals, activations, temporaries


def _module_shares(
    calls: Sequence[ModuleCall],
    times: list[int],
    temporaries: list[_Block],
    activations: dict[str, int],
) -> list[ModuleShare]:
    """Each module's activations and temporaries alive at the peak, largest first: a
    temporary belongs to the innermost module whose forward was running when it was
    allocated."""
    spans = [
        (
            c.name,
            bisect_right(times, c.start_ns // 1000),
            bisect_right(times, c.end_ns // 1000) if c.end_ns is not None else None,
        )
        for c in calls
    ]
    made_in = _innermost_calls(spans, sorted(b.start for b in temporaries))
    temps: dict[str, int] = {}
    for b in temporaries:
        name = made_in.get(b.start) or NO_MODULE
        temps[name] = temps.get(name, 0) + b.size
    shares = [
        ModuleShare(name, activations.get(name, 0), temps.get(name, 0))
        for name in set(activations) | set(temps)
    ]
    shares.sort(key=lambda m: (-m.bytes, m.module))
    return shares


def _rounded(n: int) -> int:
    return -(-n // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def _innermost_calls(
    calls: Sequence[tuple[str, int, int | None]], starts: list[int]
) -> dict[int, str]:
    """For each allocation (by its position), the innermost module whose forward was running.

    A call (name, p, q) that began at position p and ended at q made the allocations
    p+1 .. q. Calls nest, so a sweep with a stack finds the innermost one."""
    if not starts or not calls:
        return {}
    edges: list[tuple[float, int, int]] = []  # (where, 0 push / 1 pop, call index)
    for i, (_, start, end) in enumerate(calls):
        if end is not None and end <= start:
            continue  # allocated nothing
        edges.append((start + 0.5, 0, i))
        edges.append((end + 0.5 if end is not None else float("inf"), 1, i))
    edges.sort()
    out: dict[int, str] = {}
    stack: list[int] = []
    e = 0
    for s in starts:
        while e < len(edges) and edges[e][0] < s:
            _, kind, i = edges[e]
            if kind == 0:
                stack.append(i)
            elif i in stack:
                stack.remove(i)
            e += 1
        if stack:
            out[s] = calls[stack[-1]][0]
    return out


def _phase(device: int, marks: Sequence[Mark], peak_at: int) -> Phase:
    """The phase of the last mark made before the peak's allocation."""
    phase = "other"
    for m in marks:
        if m.positions.get(device, 0) < peak_at:
            phase = "other" if m.phase == "backward done" else m.phase
        else:
            break
    return phase  # type: ignore[return-value]


def breakdowns_from_raw(
    raw: Mapping[str, Any], record: StepRecord, report: CellReport
) -> tuple[Breakdown, ...]:
    """Each device the cell allocated on: its breakdown, from the raw snapshot taken when
    the cell ended (``torch.cuda.memory._snapshot()``, with the cell's trace)."""
    traces = raw.get("device_traces") or []
    alive: dict[int, list[tuple[int, int]]] = {}
    for seg in raw.get("segments", ()):
        device = int(seg.get("device", 0))
        for b in seg.get("blocks", ()):
            if b.get("state") == "active_allocated":
                alive.setdefault(device, []).append((int(b["address"]), int(b["size"])))
    out = []
    for d in report.devices:
        if d.after.allocator is None or d.index >= len(traces):
            continue
        events = events_from_trace(traces[d.index])
        before = d.before.allocator
        begin = [seg for seg in record.begin_segments if int(seg.get("device", 0)) == d.index]
        out.append(
            analyze(
                d.index,
                events,
                begin,
                alive.get(d.index, []),
                record.observations,
                record.marks,
                record.calls,
                base=before.allocated if before is not None else 0,
                base_reserved=before.reserved if before is not None else 0,
                counter_peak=d.peak_allocated if d.peak_exact else None,
                end_position=record.end_positions.get(d.index),
                settings=raw.get("allocator_settings") or {},
                outside_torch=d.after.outside_torch,
            )
        )
    return tuple(out)
