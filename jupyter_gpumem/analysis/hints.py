"""Short plain-language explanations when a cell's numbers call for one."""

from __future__ import annotations

from ..model import CellReport, DeviceCellReport
from ..units import format_bytes as fb

_MiB = 1 << 20
_GiB = 1 << 30


def hints_for(r: CellReport) -> tuple[str, ...]:
    out: list[str] = []
    for d in r.devices:
        out.extend(_device_hints(r, d))
    if r.traceback is not None and r.traceback.bytes:
        top = r.traceback.holdings[0]
        out.append(
            f"The kept traceback holds {fb(r.traceback.bytes)} of GPU memory ({top.name} in "
            f"{top.frame}: {fb(top.bytes)}): IPython keeps the failed cell's frames until the "
            "next error. `%gpumem release-traceback` drops them."
        )
    elif r.failed and r.traceback is None and any((d.allocated_delta or 0) > 0 for d in r.devices):
        out.append(
            "The cell failed while tensors were alive: IPython keeps the traceback "
            "(sys.last_traceback), and its frames keep their tensors until the next error. "
            "Run a cell that succeeds, or `del` them by name."
        )
    return tuple(out)


def _device_hints(r: CellReport, d: DeviceCellReport) -> list[str]:
    dev = (
        f"cuda:{d.index}"
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
                f": the context and libraries took {fb(ctx)} outside PyTorch's counters."
                if ctx
                else "."
            )
        )
    explained = {p.device for p in r.postmortems}
    for o in r.ooms:
        if o.device == d.index and o.device not in explained:
            out.append(
                f"Out of memory on {dev}: an allocation of {fb(o.requested)} failed with "
                f"{fb(o.free)} free (allowed: {fb(o.allowed)}). Free tensors with `del`, then "
                "`%gpumem empty-cache`; or use a smaller batch."
            )
    if a is None:
        return out
    alloc, res = d.allocated_delta or 0, d.reserved_delta or 0
    if res >= 64 * _MiB and res - max(alloc, 0) >= res // 2:
        out.append(
            f"Reserved grew by {fb(res)} but allocated only by {fb(max(alloc, 0))}: PyTorch keeps "
            "freed blocks cached for reuse, and nvidia-smi counts them. `%gpumem empty-cache` "
            "returns them to the driver (other processes can then use them)."
        )
    above = d.peak_above_start
    if above is not None and above - max(alloc, 0) >= 256 * _MiB and above >= 2 * max(alloc, 1):
        out.append(
            f"Temporaries peaked {fb(above)} above the cell's start, {fb(above - max(alloc, 0))} "
            "more than it kept: that peak, not the end state, decides whether a cell fits."
        )
    if (d.alloc_retries or 0) > 0:
        out.append(
            f"The allocator ran short {d.alloc_retries} time(s), flushed its cache and retried "
            "cudaMalloc (slow): memory is nearly full or fragmented. "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True often helps."
        )
    if a.reserved and a.inactive_split >= 256 * _MiB and a.inactive_split * 4 >= a.reserved:
        out.append(
            f"{fb(a.inactive_split)} of the cache is free pieces of split blocks, which "
            "empty_cache can't return (fragmentation). expandable_segments:True avoids it."
        )
    if r.after.caching is False and (d.outside_torch_delta or 0) > 0:
        out.append(
            f"Caching is off: {fb(d.outside_torch_delta)} was allocated straight from cudaMalloc, "
            "invisible to PyTorch's counters; the device-level figures show it."
        )
    outside = d.after.outside_torch
    used = d.after.process_used
    if outside is not None and used and outside >= _GiB and outside * 2 >= used:
        out.append(
            f"Most of this process's GPU memory ({fb(outside)} of {fb(used)}) is outside PyTorch's "
            "allocator: the CUDA context, cuBLAS/cuDNN workspaces, other libraries, or "
            "allocations made while caching was off."
        )
    return out
