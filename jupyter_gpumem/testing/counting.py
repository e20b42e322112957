"""Test-only backend: an allocator that the test's own code drives, byte by byte.

For tests of the plumbing between processes (worker reports over the kernel's channel or a
``torch.distributed`` store) on machines without a GPU: a worker calls :func:`allocate`
and :func:`free`, and every reading gives exactly those figures, with the peak the
allocator would keep. The figures follow the caching allocator's rules where the tests
rely on them: reserved grows with allocations and is kept after frees, the peak counter
is process-wide and only :meth:`CountingBackend.reset_peaks` resets it, a forked child
starts from zero (a CUDA allocator cannot be inherited through ``fork``).

Plugged in by import path: ``JUPYTER_GPUMEM_BACKEND=jupyter_gpumem.testing.counting:backend``.
The GPU tests check the same reports against PyTorch's real allocator.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from ..collectors.allocator import Reading, make_device_sample
from ..model import AllocatorStats, Replay

TOTAL = 80 * 2**30


@dataclass
class _Device:
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    device_allocs: int = 0
    ooms: int = 0


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
    set, else the device's total), count an OOM and raise MemoryError."""
    state = _mine()
    if cap is None:
        cap = int(state.fractions.get(device, 1.0) * TOTAL)
    d = state.devices.setdefault(device, _Device())
    if d.allocated + nbytes > cap:
        d.ooms += 1
        for cb in _state.observers:
            cb(device, nbytes, cap, cap - d.allocated)
        raise MemoryError(f"counting backend: out of memory on device {device}")
    d.allocated += nbytes
    if d.allocated > d.reserved:
        d.reserved = d.allocated
        d.device_allocs += 1
    d.peak_allocated = max(d.peak_allocated, d.allocated)
    d.peak_reserved = max(d.peak_reserved, d.reserved)


def free(nbytes: int, device: int = 0) -> None:
    d = _mine().devices[device]
    if nbytes > d.allocated:
        raise ValueError("counting backend: freeing more than is allocated")
    d.allocated -= nbytes


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
                inactive_split=0,
                peak_allocated=d.peak_allocated,
                peak_reserved=d.peak_reserved,
                device_allocs=d.device_allocs,
                device_frees=0,
                alloc_retries=0,
                ooms=d.ooms,
                segments=1 if d.reserved else 0,
                blocks=0,
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
            d.reserved = d.allocated

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
