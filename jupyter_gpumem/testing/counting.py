"""Test-only backend: an allocator that the test's own code drives, byte by byte.

For tests of the plumbing between processes (worker reports over the kernel's channel or a
``torch.distributed`` store) on machines without a GPU: a worker calls :func:`allocate`
and :func:`free`, and every reading gives exactly those figures, with the peak the
allocator would keep. The figures follow the caching allocator's rules where the tests
rely on them: reserved grows with allocations and is kept after frees, the peak counter
is process-wide and only :meth:`CountingBackend.reset_peaks` resets it, a forked child
starts from zero (a CUDA allocator cannot be inherited through ``fork``).

It also keeps the segments and blocks behind those figures, as the caching allocator
does for large blocks: a request is served from the best-fitting free block (split, the
rest stays a free block of the same segment), else from a new segment of its exact size
(one ``cudaMalloc``); a freed block merges with its free neighbours; past the cap the
fully free segments are released first (PyTorch's ``release_cached_blocks``), and only
then the OOM observers are called and MemoryError raised. :func:`snapshot` returns them
as ``torch.cuda.memory._snapshot()`` does (no frames: nothing records stacks here).

Plugged in by import path: ``JUPYTER_GPUMEM_BACKEND=jupyter_gpumem.testing.counting:backend``.
The GPU tests check the same reports against PyTorch's real allocator.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..analysis.allocator_rules import SMALL_SIZE
from ..collectors.readings import Reading, make_device_sample
from ..model import AllocatorStats, Replay
from ..units import GiB, MiB

TOTAL = 80 * GiB
_BASE = 0x7F0000000000  # device d's segments start at _BASE + d << 40
_ALIGN = 2 * MiB  # segments start 2 MiB apart, as cudaMalloc's do


@dataclass
class _Block:
    address: int
    size: int
    active: bool


@dataclass
class _Segment:
    address: int
    size: int
    blocks: list[_Block]


@dataclass
class _Device:
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    device_allocs: int = 0
    ooms: int = 0
    segments: list[_Segment] = field(default_factory=list)
    next_address: int = 0


@dataclass
class _State:
    pid: int = field(default_factory=os.getpid)
    devices: dict[int, _Device] = field(default_factory=dict)
    observers: list[Callable[[int, int, int, int], None]] = field(default_factory=list)
    # caps set by set_limit (set_per_process_memory_fraction): device -> fraction of TOTAL
    fractions: dict[int, float] = field(default_factory=dict)


_state = _State()


def _mine() -> _State:
    global _state
    if _state.pid != os.getpid():  # forked: a new process has no allocator yet
        _state = _State()
    return _state


def allocate(nbytes: int, device: int = 0, cap: int | None = None) -> None:
    """Allocate ``nbytes`` on ``device``; past ``cap`` (default: the cap :meth:`set_limit`
    set, else the device's total), count an OOM, call the OOM observers as PyTorch does
    (device, requested, allowed, free) and raise MemoryError."""
    state = _mine()
    if cap is None:
        cap = int(state.fractions.get(device, 1.0) * TOTAL)
    d = state.devices.setdefault(device, _Device(next_address=_BASE + (device << 40)))
    fit = min(
        ((seg, b) for seg in d.segments for b in seg.blocks if not b.active and b.size >= nbytes),
        key=lambda sb: sb[1].size,
        default=None,
    )
    if fit is not None:
        seg, b = fit
        if b.size > nbytes:  # split: the rest stays free in the same segment
            i = seg.blocks.index(b)
            seg.blocks.insert(i + 1, _Block(b.address + nbytes, b.size - nbytes, False))
            b.size = nbytes
        b.active = True
    else:
        if d.reserved + nbytes > cap:
            _release_free_segments(d)
        if d.reserved + nbytes > cap:
            d.ooms += 1
            for cb in list(_state.observers):
                cb(device, nbytes, cap, cap - d.allocated)
            raise MemoryError(f"counting backend: out of memory on device {device}")
        d.segments.append(_Segment(d.next_address, nbytes, [_Block(d.next_address, nbytes, True)]))
        d.next_address += -(-max(nbytes, 1) // _ALIGN) * _ALIGN
        d.reserved += nbytes
        d.device_allocs += 1
    d.allocated += nbytes
    d.peak_allocated = max(d.peak_allocated, d.allocated)
    d.peak_reserved = max(d.peak_reserved, d.reserved)


def free(nbytes: int, device: int = 0) -> None:
    """Free ``nbytes``: the latest live block of exactly that size, else the latest live
    blocks from their ends (a block partly freed is split, as if it had been two)."""
    d = _mine().devices[device]
    if nbytes > d.allocated:
        raise ValueError("counting backend: freeing more than is allocated")
    live = [(seg, b) for seg in d.segments for b in seg.blocks if b.active]
    exact = [sb for sb in live if sb[1].size == nbytes]
    remaining = nbytes
    for seg, b in exact[-1:] or reversed(live):
        if remaining <= 0:
            break
        if b.size <= remaining:
            b.active = False
            remaining -= b.size
        else:  # the block's tail is freed
            b.size -= remaining
            i = seg.blocks.index(b)
            seg.blocks.insert(i + 1, _Block(b.address + b.size, remaining, False))
            remaining = 0
    for seg in d.segments:
        _merge(seg)
    d.allocated -= nbytes


def _merge(seg: _Segment) -> None:
    """Free neighbours become one free block (the allocator's coalescing)."""
    out: list[_Block] = []
    for b in seg.blocks:
        if out and not b.active and not out[-1].active:
            out[-1].size += b.size
        else:
            out.append(b)
    seg.blocks = out


def _release_free_segments(d: _Device) -> None:
    keep = [seg for seg in d.segments if any(b.active for b in seg.blocks)]
    d.segments = keep
    d.reserved = sum(seg.size for seg in keep)


def snapshot() -> dict[str, Any]:
    """This process's segments and blocks, as ``torch.cuda.memory._snapshot()`` returns
    them (its ``segments``, empty ``device_traces``, ``allocator_settings``)."""
    segments: list[dict[str, Any]] = []
    for i, d in sorted(_mine().devices.items()):
        for seg in d.segments:
            blocks: list[dict[str, Any]] = [
                {
                    "address": b.address,
                    "size": b.size,
                    "requested_size": b.size if b.active else 0,
                    "state": "active_allocated" if b.active else "inactive",
                    "frames": [],
                }
                for b in seg.blocks
            ]
            active = sum(b.size for b in seg.blocks if b.active)
            segments.append(
                {
                    "device": i,
                    "address": seg.address,
                    "total_size": seg.size,
                    "allocated_size": active,
                    "active_size": active,
                    "requested_size": active,
                    "stream": 0,
                    "segment_type": "small" if seg.size <= SMALL_SIZE else "large",
                    "is_expandable": False,
                    "blocks": blocks,
                }
            )
    return {
        "segments": segments,
        "device_traces": [[] for _ in range(8)],
        "allocator_settings": {"expandable_segments": False},
    }


class CountingBackend:
    def read(self, with_process: bool = True, full: bool = True) -> Reading:
        devices = []
        state = _mine()
        for i, d in sorted(state.devices.items()):
            stats = AllocatorStats(
                allocated=d.allocated,
                reserved=d.reserved,
                active=d.allocated,
                requested=d.allocated,
                inactive_split=sum(
                    b.size
                    for seg in d.segments
                    if any(x.active for x in seg.blocks)
                    for b in seg.blocks
                    if not b.active
                ),
                peak_allocated=d.peak_allocated,
                peak_reserved=d.peak_reserved,
                device_allocs=d.device_allocs,
                device_frees=0,
                alloc_retries=0,
                ooms=d.ooms,
                segments=len(d.segments),
                blocks=sum(b.active for seg in d.segments for b in seg.blocks),
            )
            devices.append(
                make_device_sample(
                    index=i,
                    name="Counting GPU",
                    backend="cuda",
                    initialized=True,
                    stats=stats,
                    nvml=None,
                    mem_get_info=(TOTAL - d.reserved, TOTAL),
                    fraction=state.fractions.get(i),
                )
            )
        if not devices:
            return Reading("not_initialized", "", "counting", True, ())
        return Reading("ok", "", "counting", True, tuple(devices))

    def initialized_devices(self) -> list[int]:
        return sorted(_mine().devices)

    def device_count(self) -> int:
        return 8

    def reset_peaks(self, devices: list[int] | None = None) -> None:
        for i, d in _mine().devices.items():
            if devices is None or i in devices:
                d.peak_allocated, d.peak_reserved = d.allocated, d.reserved

    def attach_oom_observer(self, callback: Callable[[int, int, int, int], None]) -> bool:
        if callback not in _mine().observers:
            _state.observers.append(callback)
        return False  # its state may be reset (forked workers, tests): asked every time

    def cuda_ready(self) -> bool:
        return bool(_mine().devices)

    def empty_cache(self) -> None:
        for d in _mine().devices.values():
            _release_free_segments(d)

    def raw_snapshot(self) -> dict[str, Any] | None:
        """The allocator's snapshot, as ``torch.cuda.memory._snapshot()`` returns it."""
        return snapshot()

    def caching_supported(self) -> str | None:
        return None

    def set_caching(self, enabled: bool) -> bool:
        return enabled

    def set_limit(self, device: int, fraction: float) -> None:
        """A cap of ``fraction`` of the device's total, as PyTorch's: readings show it and
        :func:`allocate` stops there (1.0 removes it)."""
        if fraction >= 1.0:
            _mine().fractions.pop(device, None)
        else:
            _mine().fractions[device] = fraction

    def total_for_limit(self, device: int) -> int:
        return TOTAL

    def actionable(self) -> str | None:
        return None

    def replay(self) -> Replay | None:
        return None  # the test's own figures, counted here


def backend() -> CountingBackend:
    return CountingBackend()
