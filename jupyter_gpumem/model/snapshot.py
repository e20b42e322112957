"""The allocator's own snapshot (``torch.cuda.memory._snapshot``), typed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

# Kept in PyTorch's own shape (dicts), typed here: converting tens of thousands of blocks
# into objects would cost more than the snapshot itself, and recorded snapshots (JSON,
# memory_viz pickles) then feed the analyses unchanged.


class Frame(TypedDict):
    filename: str
    line: int
    name: str


class Block(TypedDict):
    address: int
    size: int  # what the allocator counts (rounded)
    requested_size: int  # what the program asked for
    state: str  # "active_allocated", "active_pending_free" / "active_awaiting_free", "inactive"
    frames: list[Frame]  # innermost first; empty when nothing was recorded


class Segment(TypedDict, total=False):
    device: int
    address: int
    total_size: int
    allocated_size: int
    active_size: int
    requested_size: int
    stream: int
    segment_type: str  # "small" (2 MiB segments for <= 1 MiB blocks) or "large"
    is_expandable: bool
    blocks: list[Block]


@dataclass(frozen=True, slots=True)
class AllocatorSnapshot:
    """Every segment the caching allocator holds, with its blocks, at one instant."""

    time: float
    segments: Sequence[Segment]
    tracking: bool  # allocation sites were being recorded (blocks may carry frames)
    settings: dict[str, Any] = field(default_factory=dict)  # allocator_settings

    def device_segments(self, device: int) -> list[Segment]:
        return [s for s in self.segments if s.get("device", 0) == device]


ACTIVE = "active_allocated"
