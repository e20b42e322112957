"""A model of PyTorch's CUDA caching allocator: allocation requests in, the allocator's
segments, blocks and counters out, with no GPU and no torch.

It follows ``DeviceCachingAllocator`` in ``c10/cuda/CUDACachingAllocator.cpp`` and the
option parsing of ``AcceleratorAllocatorConfig`` rule by rule; each method's docstring
names the function it mirrors. Fed the requests a program made (:func:`requests_from_trace`
reads them from the allocator's own history), it predicts peak allocated and peak
reserved, every cudaMalloc (or, with expandable segments, every mapping) and its size, and
the segments left at the end. The traces in ``tests/fixtures/allocator_traces.json``
(H200, torch 2.11.0+cu130) replay to PyTorch's numbers, byte for byte.

What it leaves out, and why:

- **Addresses of new segments.** cudaMalloc chooses them, and a trace holds them only for
  segments already made. They matter: among free blocks of equal size the allocator takes
  the lowest address. The model places each new segment (and each expandable segment's
  address range) just below the previous one, as the CUDA driver mostly does; inside a
  segment, offsets are exact. On the fixture's traces this gives every number exactly;
  rising addresses instead reuse the other of two equal blocks at times, which moves
  GPT-2's peak allocated by 768 KiB. Where many blocks share a size ties are frequent:
  on a random workload recorded with ``roundup_power2_divisions:4`` the model's peak
  reserved came out 136 MiB (2.9%) high. ``segment_addresses`` replaces the synthetic
  addresses (given the recorded ones, the model hands out every block at the address
  PyTorch did, in every configuration tried).
- **Cross-stream uses** (``record_stream``): a block freed while another stream still
  uses it returns to the pool when its events complete. Requests say when a block is
  free, so a trace's ``free_completed`` (not ``free_requested``) is the free to feed.
- **Memory outside the cap.** ``AllocatorConfig.cap`` stands for
  ``set_per_process_memory_fraction`` (the allocator's ``allowed_memory_maximum``); the
  GPU's own free memory, which makes cudaMalloc fail without a cap, is not modelled:
  without a cap the model never runs out.
- **garbage_collection_threshold** (acts only with a cap), CUDA graph private pools,
  free-memory callbacks, IPC, and expandable segments turned on or off mid-run.

This module is the model's entry: :func:`replay`, :func:`requests_from_trace`, and the
public names of the parts, each in its own module: the settings, constants and size rules
in ``config`` (a new ``PYTORCH_CUDA_ALLOC_CONF`` key goes there), the requests and
results in ``records``, the allocator's rules in ``model`` (a new rule goes
there, in the method that mirrors PyTorch's function), its blocks and free lists in
``blocks``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from ..allocator_rules import allocation_size, round_size
from .config import AllocatorConfig
from .model import CachingAllocatorModel
from .records import (
    Alloc,
    BlockRecord,
    Free,
    ModelOutOfMemory,
    OutOfMemoryRecord,
    Prediction,
    SegmentRecord,
)

__all__ = [
    "Alloc",
    "AllocatorConfig",
    "BlockRecord",
    "CachingAllocatorModel",
    "Free",
    "ModelOutOfMemory",
    "OutOfMemoryRecord",
    "Prediction",
    "SegmentRecord",
    "allocation_size",
    "replay",
    "requests_from_trace",
    "round_size",
]


def replay(
    requests: Iterable[Alloc | Free],
    config: AllocatorConfig | None = None,
    segment_addresses: Iterable[int] | None = None,
) -> Prediction:
    """Run ``requests`` through a fresh :class:`CachingAllocatorModel`. A request that
    runs out of memory is recorded in ``ooms`` and skipped, as a program that catches
    ``OutOfMemoryError`` goes on; a later :class:`Free` of its key is ignored."""
    model = CachingAllocatorModel(config, segment_addresses)
    ooms: list[OutOfMemoryRecord] = []
    failed: set[Hashable] = set()
    peak_allocated_at = peak_reserved_at = -1
    peak_allocated = peak_reserved = 0
    malloc, free = model.malloc, model.free
    for index, r in enumerate(requests):
        if type(r) is Alloc:
            try:
                malloc(r.key, r.size, r.stream)
            except ModelOutOfMemory as oom:
                ooms.append(replace(oom.record, request=index))
                failed.add(r.key)
                continue
            if model.peak_allocated > peak_allocated:
                peak_allocated = model.peak_allocated
                peak_allocated_at = index
            if model.peak_reserved > peak_reserved:
                peak_reserved = model.peak_reserved
                peak_reserved_at = index
        elif r.key in failed:
            failed.discard(r.key)
        else:
            free(r.key)
    return Prediction(
        peak_allocated=model.peak_allocated,
        peak_reserved=model.peak_reserved,
        peak_requested=model.peak_requested,
        allocated=model.allocated,
        reserved=model.reserved,
        requested=model.requested,
        peak_allocated_at=peak_allocated_at,
        peak_reserved_at=peak_reserved_at,
        device_allocs=model.device_allocs,
        device_frees=model.device_frees,
        alloc_retries=model.alloc_retries,
        inactive_split=model.inactive_split,
        inactive_split_bytes=model.inactive_split_bytes,
        segment_allocations=tuple(model.segment_allocations),
        segments=model.segments(),
        ooms=tuple(ooms),
    )


def requests_from_trace(entries: Iterable[Mapping[str, Any]]) -> list[Alloc | Free]:
    """The requests in an allocator history (``torch.cuda.memory._snapshot()``'s
    ``device_traces[i]``, entries with ``action``, ``addr``, ``size``, ``stream``).

    ``alloc`` becomes an :class:`Alloc` of its requested size; ``free_completed`` (the
    block is back in the cache) a :class:`Free` of the allocation at that address, which
    the next ``alloc`` there may reuse; ``oom`` an :class:`Alloc` that the model should
    refuse too (its size is already rounded; rounding again keeps it). Frees of addresses
    allocated before the history began are dropped: their blocks are unknown."""
    out: list[Alloc | Free] = []
    live: dict[int, int] = {}
    n = 0
    for e in entries:
        action = e["action"]
        if action == "alloc":
            n += 1
            live[int(e["addr"])] = n
            out.append(Alloc(n, int(e["size"]), int(e.get("stream", 0))))
        elif action == "free_completed":
            key = live.pop(int(e["addr"]), None)
            if key is not None:
                out.append(Free(key))
        elif action == "oom":
            n += 1
            out.append(Alloc(n, int(e["size"]), int(e.get("stream", 0))))
    return out
