"""The segment map: every segment the allocator holds, and the blocks inside it, as plain
records for the views (``%gpumem segments``, the panel's Segments tab).

Block kinds, in the user's words: ``allocated`` (a live tensor), ``pending`` (freed, waiting
for another stream), ``piece`` (free, in a segment that also holds live blocks: empty_cache
can't return it, a large request can't use it unless it fits: fragmentation) and
``cached`` (free, and its whole segment is free: empty_cache returns it).
"""

from __future__ import annotations

from ..model import (
    ACTIVE,
    AllocatorSnapshot,
    BlockKind,
    BlockView,
    Segment,
    SegmentMap,
    SegmentView,
)
from .fragmentation import free_space
from .sites import SiteResolver


def segment_map(
    snapshot: AllocatorSnapshot,
    device: int,
    resolver: SiteResolver | None = None,
    max_segments: int | None = None,
) -> SegmentMap:
    segs = snapshot.device_segments(device)
    space = free_space(segs)
    ordered = sorted(segs, key=lambda s: (-s.get("total_size", 0), s.get("address", 0)))
    shown = ordered if max_segments is None else ordered[:max_segments]
    rest = ordered[len(shown) :]
    labels: dict[int, str] = {}
    return SegmentMap(
        device=device,
        space=space,
        segments=tuple(_view(s, resolver, labels) for s in shown),
        omitted=len(rest),
        omitted_bytes=sum(s.get("total_size", 0) for s in rest),
        tracking=snapshot.tracking,
    )


def _view(seg: Segment, resolver: SiteResolver | None, labels: dict[int, str]) -> SegmentView:
    base = seg.get("address", 0)
    blocks = sorted(seg.get("blocks", ()), key=lambda b: b["address"])
    live = any(b["state"] != "inactive" for b in blocks)
    views: list[BlockView] = []
    for b in blocks:
        state = b["state"]
        if state == ACTIVE:
            kind: BlockKind = "allocated"
        elif state == "inactive":
            kind = "piece" if live or seg.get("is_expandable", False) else "cached"
        else:  # active_pending_free / active_awaiting_free
            kind = "pending"
        site = ""
        if resolver is not None and kind == "allocated" and b.get("frames"):
            s = resolver.site(b["frames"])  # shared Site objects: label each once
            site = labels.get(id(s), "")
            if not site:
                site = labels[id(s)] = s.label + (f" `{s.text}`" if s.text else "")
        views.append(
            BlockView(b["address"] - base, b["size"], b.get("requested_size", 0), kind, site)
        )
    return SegmentView(
        address=base,
        size=seg.get("total_size", 0),
        pool=seg.get("segment_type", "large"),
        stream=int(seg.get("stream", 0) or 0),
        expandable=bool(seg.get("is_expandable", False)),
        blocks=tuple(views),
    )
