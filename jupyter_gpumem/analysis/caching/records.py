"""What goes into the caching allocator's model and what comes out of it: the requests
(:class:`Alloc`, :class:`Free`), the segments and blocks as ``torch.cuda.memory_snapshot()``
lists them, a request it could not serve (:class:`OutOfMemoryRecord`, raised as
:class:`ModelOutOfMemory`), and a replay's result (:class:`Prediction`). Plain records,
read by the dry run (``collectors/dry_run``, ``core/dry_run.py``), its breakdown
(``analysis/dry_breakdown.py``) and the tests."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import NamedTuple

from .config import Pool


class Alloc(NamedTuple):
    """A request for ``size`` bytes on ``stream``; ``key`` names it for its :class:`Free`."""

    key: Hashable
    size: int
    stream: int = 0


class Free(NamedTuple):
    """The block allocated under ``key`` is free (``free_completed``)."""

    key: Hashable


@dataclass(frozen=True, slots=True)
class BlockRecord:
    """One block of a segment, as ``torch.cuda.memory_snapshot()`` lists it."""

    size: int
    requested: int  # of its last allocation (PyTorch keeps it after the free)
    allocated: bool


@dataclass(frozen=True, slots=True)
class SegmentRecord:
    """A segment (for an expandable segment: one mapped range) and its blocks in order."""

    address: int  # synthetic (falling) unless ``segment_addresses`` gave real ones
    size: int
    pool: Pool
    stream: int
    expandable: bool
    blocks: tuple[BlockRecord, ...]


@dataclass(frozen=True, slots=True)
class OutOfMemoryRecord:
    """A request the allocator could not serve, even after releasing its cache."""

    request: int  # index in the requests replayed (0-based); -1 outside replay
    requested: int  # bytes asked for
    allocation_size: int  # what a new segment would have needed
    allocated: int  # at the failure
    reserved: int  # at the failure, after the release
    cap: int | None


class ModelOutOfMemory(Exception):
    """Raised by :meth:`CachingAllocatorModel.malloc` where PyTorch raises
    ``OutOfMemoryError``; ``record`` holds the numbers."""

    def __init__(self, record: OutOfMemoryRecord) -> None:
        super().__init__(
            f"model out of memory: tried to allocate {record.allocation_size} bytes, "
            f"{record.reserved} reserved, cap {record.cap}"
        )
        self.record = record

    @property
    def requested(self) -> int:
        return self.record.requested

    @property
    def reserved(self) -> int:
        return self.record.reserved

    @property
    def cap(self) -> int | None:
        return self.record.cap


@dataclass(frozen=True, slots=True)
class Prediction:
    """What replaying a sequence of requests through the model gives."""

    peak_allocated: int
    peak_reserved: int
    peak_requested: int
    allocated: int  # at the end
    reserved: int
    requested: int
    peak_allocated_at: int  # the request (0-based) that first reached the peak; -1: none
    peak_reserved_at: int
    device_allocs: int  # cudaMalloc calls (expandable: mappings), as num_device_alloc
    device_frees: int  # cudaFree calls (expandable: unmappings), as num_device_free
    alloc_retries: int  # as num_alloc_retries
    inactive_split: int  # free blocks of split segments, at the end
    inactive_split_bytes: int
    segment_allocations: tuple[int, ...]  # the size of each cudaMalloc (or mapping), in order
    segments: tuple[SegmentRecord, ...]  # at the end, by address
    ooms: tuple[OutOfMemoryRecord, ...] = field(default=())
