"""Raw allocator and driver figures turned into records: the one conversion each.

Pure functions of what a backend read (PyTorch's stats dicts, ``cudaMemGetInfo``, NVML's
figures): :func:`stats_from_nested` and :func:`stats_from_flat` make
:class:`~jupyter_gpumem.model.AllocatorStats`, :func:`make_device_sample` a
:class:`~jupyter_gpumem.model.DeviceSample`, and :class:`Reading` is what a backend hands
the collector. The real backend (``allocator.py``) and the recorded ones
(``jupyter_gpumem.testing``) all build their records here, so a figure means the same
whichever source read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..model import (
    AllocatorStats,
    BackendName,
    DeviceSample,
    Limit,
    ProcessMemory,
    State,
)
from .host import process_name
from .nvml import NvmlDevice


def stats_from_nested(s: Mapping[str, Any]) -> AllocatorStats:
    """From ``torch._C._cuda_memoryStats(device)`` (nested dicts of ints). Runs twice a
    measured cell: each sub-dict is looked up once (half the time of a lookup per field)."""
    ab, rb = s["allocated_bytes"]["all"], s["reserved_bytes"]["all"]
    isb = s["inactive_split_bytes"]["all"]
    get = s.get
    # positional, in the record's field order (keywords cost a third more here)
    return AllocatorStats(
        ab["current"],  # allocated
        rb["current"],  # reserved
        s["active_bytes"]["all"]["current"],  # active
        s["requested_bytes"]["all"]["current"],  # requested
        isb["current"],  # inactive_split
        ab["peak"],  # peak_allocated
        rb["peak"],  # peak_reserved
        get("num_device_alloc", 0),  # device_allocs
        get("num_device_free", 0),  # device_frees
        get("num_alloc_retries", 0),  # alloc_retries
        get("num_ooms", 0),  # ooms
        s["segment"]["all"]["current"],  # segments
        s["allocation"]["all"]["current"],  # blocks
        isb["peak"],  # peak_inactive_split
    )


def stats_from_flat(s: Mapping[str, Any]) -> AllocatorStats:
    """From ``torch.cuda.memory_stats(device)`` / ``torch.accelerator.memory_stats``."""

    def g(key: str) -> int:
        return int(s.get(key, 0))

    return AllocatorStats(
        allocated=g("allocated_bytes.all.current"),
        reserved=g("reserved_bytes.all.current"),
        active=g("active_bytes.all.current"),
        requested=g("requested_bytes.all.current"),
        inactive_split=g("inactive_split_bytes.all.current"),
        peak_allocated=g("allocated_bytes.all.peak"),
        peak_reserved=g("reserved_bytes.all.peak"),
        device_allocs=g("num_device_alloc"),
        device_frees=g("num_device_free"),
        alloc_retries=g("num_alloc_retries"),
        ooms=g("num_ooms"),
        segments=g("segment.all.current"),
        blocks=g("allocation.all.current"),
        peak_inactive_split=g("inactive_split_bytes.all.peak"),
    )


def make_device_sample(
    *,
    index: int,
    name: str,
    backend: BackendName,
    initialized: bool,
    stats: AllocatorStats | None,
    nvml: NvmlDevice | None,
    mem_get_info: tuple[int, int] | None,
    fraction: float | None,
    error: str | None = None,
) -> DeviceSample:
    """The one conversion from raw readings to a :class:`DeviceSample`.

    Where this process has a context, total and usage come from ``cudaMemGetInfo``, as
    PyTorch sees them (10 us, no NVML needed); NVML's ``used`` is ~0.6 GB higher on an H200
    because it also counts memory the driver reserves, so the two are never mixed within
    one device's figures. Devices without a context have NVML's figures only. This
    process's usage always comes from NVML. A cap is ``fraction * cudaMemGetInfo total``,
    as the allocator computes it.
    """
    total = device_used = process_used = None
    children: tuple[ProcessMemory, ...] = ()
    if nvml is not None:
        process_used = nvml.process_used
        children = tuple(ProcessMemory(pid, process_name(pid), used) for pid, used in nvml.children)
        name = name or nvml.name
    if mem_get_info is not None:
        free, total = mem_get_info
        device_used = total - free
    elif nvml is not None:
        total, device_used = nvml.total, nvml.used
    limit = None
    if fraction is not None and fraction < 1.0 and total is not None:
        limit = Limit(fraction=fraction, bytes=int(fraction * total))
    return DeviceSample(
        index=index,
        name=name,
        backend=backend,
        initialized=initialized,
        allocator=stats,
        total=total,
        device_used=device_used,
        process_used=process_used,
        limit=limit,
        error=error,
        children=children,
    )


@dataclass(slots=True)
class Reading:
    """What a backend reads; the collector adds the clock and host figures."""

    state: State
    message: str
    torch_version: str | None
    caching: bool | None
    devices: tuple[DeviceSample, ...]
