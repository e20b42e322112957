"""Free space inside the allocator's segments, and whether a request would fit.

Facts from PyTorch's caching allocator (CUDACachingAllocator.cpp, torch 2.x) this rests on,
beside its size rules (``allocator_rules``: a request's block, its pool, the segment a
new block is cut from):
- A cached free block serves a request of the same pool if it is at least as large;
  adjacent free blocks of a segment merge.
- Before raising OutOfMemoryError the allocator releases every segment that holds no live
  block and retries: what is left cached afterwards are free pieces of segments that also
  hold live blocks ("non-releasable", inactive_split), which only help requests that fit
  in one piece.
- With a cap (``set_per_process_memory_fraction``) a new segment must keep the reserved
  total within the cap.
- With ``expandable_segments:True`` free pieces are unmapped page by page (2 MiB) and new
  memory is mapped at the end of a segment, so free pieces count in full (page-aligned).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from ..model import ACTIVE, FreeSpace, Segment
from .allocator_rules import SMALL_BUFFER, SMALL_SIZE, allocation_size, round_size

PAGE = SMALL_BUFFER  # an expandable segment's page, as this module counts them


@dataclass(frozen=True, slots=True)
class FreeRun:
    """A run of adjacent free blocks in one segment, merged as the allocator merges them."""

    address: int
    size: int
    small: bool  # in a small-pool segment
    releasable: bool  # the whole segment is free: empty_cache (or an OOM retry) returns it


def free_runs(segments: Iterable[Segment], freed: Collection[int] = ()) -> list[FreeRun]:
    """Free runs of every segment, as if the blocks at the addresses in ``freed`` were
    free too."""
    runs: list[FreeRun] = []
    for seg in segments:
        blocks = sorted(seg.get("blocks", ()), key=lambda b: b["address"])
        small = seg.get("segment_type") == "small"
        seg_runs: list[tuple[int, int]] = []
        start = size = 0
        live = False
        for b in blocks:
            free = b["state"] == "inactive" or (b["state"] == ACTIVE and b["address"] in freed)
            if free:
                if size and start + size == b["address"]:
                    size += b["size"]
                else:
                    if size:
                        seg_runs.append((start, size))
                    start, size = b["address"], b["size"]
            else:
                live = True
                if size:
                    seg_runs.append((start, size))
                size = 0
        if size:
            seg_runs.append((start, size))
        releasable = not live and not seg.get("is_expandable", False)
        runs.extend(FreeRun(a, s, small, releasable) for a, s in seg_runs)
    return runs


def free_space(segments: Iterable[Segment]) -> FreeSpace:
    segs = list(segments)
    runs = free_runs(segs)
    reserved = sum(s.get("total_size", 0) for s in segs)
    allocated = sum(b["size"] for s in segs for b in s.get("blocks", ()) if b["state"] == ACTIVE)
    pieces = [r for r in runs if not r.releasable]
    return FreeSpace(
        segments=len(segs),
        reserved=reserved,
        allocated=allocated,
        releasable=sum(s.get("total_size", 0) for s in segs if _all_free(s)),
        pieces=len(pieces),
        pieces_bytes=sum(r.size for r in pieces),
        largest_free_block=max((r.size for r in runs), default=0),
        largest_piece=max((r.size for r in pieces), default=0),
        expandable=any(s.get("is_expandable", False) for s in segs),
    )


def _all_free(seg: Segment) -> bool:
    return not seg.get("is_expandable", False) and all(
        b["state"] == "inactive" for b in seg.get("blocks", ())
    )


def _page_aligned(run: FreeRun) -> int:
    start = -(-run.address // PAGE) * PAGE
    end = ((run.address + run.size) // PAGE) * PAGE
    return max(0, end - start)


def would_fit(
    segments: Iterable[Segment],
    request: int,
    device_free: int,
    cap: int | None,
    freed: Collection[int] = (),
    expandable: bool = False,
) -> bool:
    """Whether the allocator would serve ``request`` bytes: from a cached free run of the
    right pool, or by releasing whole free segments and mapping a new one within the
    device's free memory and the cap. ``freed``: addresses of live blocks to count as
    freed first; ``expandable``: as if ``expandable_segments:True`` had been set."""
    segs = list(segments)
    need = round_size(request)
    small = need <= SMALL_SIZE
    runs = free_runs(segs, freed)
    if any(r.small == small and r.size >= need for r in runs):
        return True
    reserved = sum(s.get("total_size", 0) for s in segs)
    released = sum(r.size for r in runs if r.releasable)
    if expandable:
        released += sum(_page_aligned(r) for r in runs if not r.releasable)
        new = -(-need // PAGE) * PAGE
    else:
        new = allocation_size(need)
    if new > device_free + released:
        return False
    return cap is None or reserved - released + new <= cap
