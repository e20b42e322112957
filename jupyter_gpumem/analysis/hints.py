"""Short plain-language explanations when a cell's numbers call for one.

Two hints depend on PyTorch's ``expandable_segments`` setting (allocation retries, free
pieces of split blocks): with it off they suggest it, with it on they say what helps
instead. The setting is taken, first found first, from the ``settings`` the caller passes
(the ``allocator_settings`` of a snapshot), from the cell's post-mortem of that device
(which read the snapshot taken after the failure), and else from the environment
variables PyTorch reads (``PYTORCH_CUDA_ALLOC_CONF``, ``PYTORCH_ALLOC_CONF``,
``PYTORCH_HIP_ALLOC_CONF``; on when any of them sets ``expandable_segments:True``),
read once per call and only when one of those hints is due. Nothing here calls torch:
the hints run after every full report, and must not create a CUDA context.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..model import CellReport, DeviceCellReport
from ..units import GiB, MiB, cuda_label, format_bytes

# PyTorch's names for its allocator settings, in the order releases have read them.
CONF_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")


def expandable_in_conf(conf: str) -> bool | None:
    """What an allocator settings string says of expandable_segments (the last mention,
    as PyTorch's parser keeps it; spaces ignored as it ignores them); None: nothing."""
    said: bool | None = None
    for item in conf.replace(" ", "").split(","):
        key, _, value = item.partition(":")
        if key == "expandable_segments":
            said = value == "True"  # PyTorch accepts True or False, nothing else
    return said


def expandable_from_environ(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for expandable segments. Only what was set before
    PyTorch first allocated counts for the allocator, which reads it once: a caller that
    knows the allocator's own setting passes it to :func:`hints_for` instead."""
    return any(expandable_in_conf(environ.get(name) or "") for name in CONF_VARIABLES)


class _Setting:
    """expandable_segments per device, looked up only when a hint needs it."""

    def __init__(self, r: CellReport, settings: Mapping[str, Any] | None) -> None:
        self._r = r
        self._settings = settings
        self._environ: bool | None = None

    def on(self, device: int) -> bool:
        if self._settings is not None and "expandable_segments" in self._settings:
            return bool(self._settings["expandable_segments"])
        for p in self._r.postmortems:
            if p.device == device and p.expandable_segments is not None:
                return p.expandable_segments
        if self._environ is None:
            self._environ = expandable_from_environ()
        return self._environ


def hints_for(r: CellReport, settings: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The report's hints. ``settings``: PyTorch's allocator settings when the caller
    knows them (``allocator_settings``); without them the post-mortem's or the
    environment's word on expandable_segments is used (see the module's docstring)."""
    out: list[str] = []
    if r.devices:
        setting = _Setting(r, settings)
        for d in r.devices:
            out.extend(_device_hints(r, d, setting))
    if r.traceback is not None and r.traceback.bytes:
        top = r.traceback.holdings[0]
        out.append(
            f"The kept traceback holds {format_bytes(r.traceback.bytes)} of GPU memory "
            f"({top.name} in {top.frame}: {format_bytes(top.bytes)}): IPython keeps the failed "
            "cell's frames until the next error. `%gpumem release-traceback` drops them."
        )
    elif r.failed and r.traceback is None and any((d.allocated_delta or 0) > 0 for d in r.devices):
        out.append(
            "The cell failed while tensors were alive: IPython keeps the traceback "
            "(sys.last_traceback), and its frames keep their tensors until the next error. "
            "Run a cell that succeeds, or `del` them by name."
        )
    return tuple(out)


def _device_hints(r: CellReport, d: DeviceCellReport, setting: _Setting) -> list[str]:
    dev = (
        cuda_label(d.index)
        if d.after.backend in ("cuda", "rocm", "nvml")
        else f"{d.after.backend}:{d.index}"
    )
    out: list[str] = []
    a = d.after.allocator
    if not d.before.initialized and d.after.initialized:
        ctx = d.outside_torch_delta
        out.append(
            f"This cell started CUDA on {dev}"
            + (
                f": the context and libraries took {format_bytes(ctx)} outside PyTorch's counters."
                if ctx
                else "."
            )
        )
    explained = {p.device for p in r.postmortems}
    for o in r.ooms:
        if o.device == d.index and o.device not in explained:
            out.append(
                f"Out of memory on {dev}: an allocation of {format_bytes(o.requested)} failed with "
                f"{format_bytes(o.free)} free (allowed: {format_bytes(o.allowed)}). Free tensors "
                "with `del`, then `%gpumem empty-cache`; or use a smaller batch."
            )
    if a is None:
        return out
    alloc, res = d.allocated_delta or 0, d.reserved_delta or 0
    if res >= 64 * MiB and res - max(alloc, 0) >= res // 2:
        out.append(
            f"Reserved grew by {format_bytes(res)} but allocated only by "
            f"{format_bytes(max(alloc, 0))}: PyTorch keeps freed blocks cached for reuse, and "
            "nvidia-smi counts them. `%gpumem empty-cache` returns them to the driver (other "
            "processes can then use them)."
        )
    above = d.peak_above_start
    if above is not None and above - max(alloc, 0) >= 256 * MiB and above >= 2 * max(alloc, 1):
        out.append(
            f"Temporaries peaked {format_bytes(above)} above the cell's start, "
            f"{format_bytes(above - max(alloc, 0))} more than it kept: that peak, not the end "
            "state, decides whether a cell fits."
        )
    if (d.alloc_retries or 0) > 0:
        if not setting.on(d.index):
            out.append(
                f"The allocator ran short {d.alloc_retries} time(s), flushed its cache and "
                "retried cudaMalloc (slow): memory is nearly full or fragmented. "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True often helps."
            )
        else:
            limit = d.after.limit
            cap = ""
            if limit:
                cap = f", lift the cap of {format_bytes(limit.bytes)} (`%gpumem limit off`)"
            out.append(
                f"The allocator ran short {d.alloc_retries} time(s), released its cached "
                "memory and retried (slow). expandable_segments is already on, which avoids "
                "most fragmentation: memory is nearly full. Free tensors you no longer need "
                f"(`del`){cap}, or use a smaller batch."
            )
    if a.reserved and a.inactive_split >= 256 * MiB and a.inactive_split * 4 >= a.reserved:
        if not setting.on(d.index):
            out.append(
                f"{format_bytes(a.inactive_split)} of the cache is free pieces of split blocks, "
                "which empty_cache can't return (fragmentation). expandable_segments:True "
                "avoids it."
            )
        else:
            # PyTorch counts inactive_split only for blocks of ordinary segments, and uses
            # no expandable segments for private pools (CUDA graphs, MemPool).
            out.append(
                f"{format_bytes(a.inactive_split)} of the cache is free pieces of split blocks, "
                "which empty_cache can't return (fragmentation). expandable_segments is on, and "
                "PyTorch counts no expandable segment in this figure, so these pieces are in "
                "ordinary segments: made before it was turned on (a kernel started with it "
                "set makes every segment expandable) or for CUDA graphs and memory pools, "
                "which don't use expandable segments. `%gpumem segments` shows them."
            )
    if r.after.caching is False and (d.outside_torch_delta or 0) > 0:
        out.append(
            f"Caching is off: {format_bytes(d.outside_torch_delta)} was allocated straight from "
            "cudaMalloc, invisible to PyTorch's counters; the device-level figures show it."
        )
    outside = d.after.outside_torch
    used = d.after.process_used
    if outside is not None and used and outside >= GiB and outside * 2 >= used:
        out.append(
            f"Most of this process's GPU memory ({format_bytes(outside)} of {format_bytes(used)}) "
            "is outside PyTorch's allocator: the CUDA context, cuBLAS/cuDNN workspaces, other "
            "libraries, or allocations made while caching was off."
        )
    return out
