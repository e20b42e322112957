"""The allocator's own snapshot (``torch.cuda.memory._snapshot``), typed; where its free
bytes are and the map of its segments."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypedDict

from .render import ShowsItself

# Kept in PyTorch's own shape (dicts), typed here: converting tens of thousands of blocks
# into objects would cost more than the snapshot itself, and recorded snapshots (JSON,
# memory_viz pickles) then feed the analyses unchanged.


# A block's state: live, freed but still in use by a stream (torch's two spellings of
# "pending"), or free in the cache.
BlockState = Literal["active_allocated", "active_pending_free", "active_awaiting_free", "inactive"]
# A segment's pool: "small" (2 MiB segments for blocks <= 1 MiB) or "large".
Pool = Literal["small", "large"]


class Frame(TypedDict):
    filename: str
    line: int
    name: str


class Block(TypedDict):
    address: int
    size: int  # what the allocator counts (rounded)
    requested_size: int  # what the program asked for
    state: BlockState
    frames: list[Frame]  # innermost first; empty when nothing was recorded


class Segment(TypedDict, total=False):
    device: int
    address: int
    total_size: int
    allocated_size: int
    active_size: int
    requested_size: int
    stream: int
    segment_type: Pool
    is_expandable: bool
    blocks: list[Block]


@dataclass(frozen=True, slots=True)
class AllocatorSnapshot:
    """Every segment the caching allocator holds, with its blocks, at one instant."""

    time: float
    segments: Sequence[Segment]
    tracking: bool  # allocation sites were being recorded (blocks may carry frames)
    settings: dict[str, Any] = field(default_factory=dict)  # allocator_settings
    # live_blocks' answers, made once per device (the namespace walk and the matching
    # both look blocks up by address)
    _live: dict[int, dict[int, Block]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def device_segments(self, device: int) -> list[Segment]:
        return [s for s in self.segments if s.get("device", 0) == device]

    def devices(self) -> list[int]:
        return sorted({s.get("device", 0) for s in self.segments})

    def live_blocks(self, device: int) -> dict[int, Block]:
        """The allocated blocks of ``device`` by address (made once: do not modify)."""
        blocks = self._live.get(device)
        if blocks is None:
            blocks = self._live[device] = {
                b["address"]: b
                for s in self.segments
                if s.get("device", 0) == device
                for b in s.get("blocks", ())
                if b["state"] == ACTIVE
            }
        return blocks


ACTIVE = "active_allocated"


# -- where the free bytes are, and the map of segments (analysis/fragmentation.py and
# analysis/segments.py derive them from a snapshot) ---------------------------------------
@dataclass(frozen=True, slots=True)
class FreeSpace:
    """Where the free bytes of one device's cache are."""

    segments: int
    reserved: int
    allocated: int
    releasable: int  # whole free segments
    pieces: int  # free runs inside segments that also hold live blocks
    pieces_bytes: int
    largest_free_block: int  # the largest free run anywhere in the cache
    largest_piece: int  # the largest free run in a segment that also holds live blocks
    expandable: bool  # some segment is an expandable one

    @property
    def cached_free(self) -> int:
        return self.reserved - self.allocated

    @property
    def fragmentation(self) -> float:
        """Share of the cache's free bytes that sit in pieces empty_cache can't return."""
        free = self.cached_free
        return self.pieces_bytes / free if free > 0 else 0.0


BlockKind = Literal["allocated", "pending", "piece", "cached"]


class BlockView(NamedTuple):
    """One block (a named tuple: a map has tens of thousands)."""

    offset: int  # from the segment's start
    size: int
    requested: int
    kind: BlockKind
    site: str  # "In[7] line 3 `x = ...`" with tracking, else ""


@dataclass(frozen=True, slots=True)
class SegmentView:
    address: int
    size: int
    pool: Pool
    stream: int
    expandable: bool
    blocks: tuple[BlockView, ...]

    @property
    def live(self) -> int:
        return sum(b.size for b in self.blocks if b.kind in ("allocated", "pending"))

    @property
    def free_pieces(self) -> list[BlockView]:
        return [b for b in self.blocks if b.kind == "piece"]


@dataclass(frozen=True, slots=True)
class SegmentMap(ShowsItself):
    device: int
    space: FreeSpace
    segments: tuple[SegmentView, ...]  # largest first
    omitted: int  # segments not included (limit)
    omitted_bytes: int
    tracking: bool
    # Whose allocator it is, when not this process's: "rank 1 (pid 4242 on gpu-node)"
    owner: str = ""

    @property
    def blocks(self) -> int:
        return sum(len(s.blocks) for s in self.segments)
