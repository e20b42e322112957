"""Why an allocation failed, and which fix would make it fit.

Inputs are plain records: the allocator's OOM event, the device figures after the
failure, the snapshot taken after the exception (never inside the OOM observer: the
allocator holds its lock there), who holds the live blocks, and other processes on the
device. Each fix is checked with :func:`~.fragmentation.would_fit` against the failed
request; fixes that make it fit come first (``PRIORITY`` orders those of equal effect).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..model import (
    DeviceSample,
    Fix,
    FixKind,
    OomEvent,
    PostMortem,
    Segment,
    WhoRow,
)
from ..units import format_bytes as fb
from .fragmentation import free_space, would_fit
from .who import UNREACHABLE, DeviceHoldings

# Among fixes that make the request fit: the cause first, then what frees memory nobody
# needs (a kept traceback, a leaked graph, old outputs), then lifting a cap the user set to
# try a smaller GPU, then other processes, and last deleting the user's own data.
PRIORITY: dict[FixKind, int] = {
    "fragmentation": 0,
    "traceback": 1,
    "graph": 2,
    "output_history": 3,
    "cap": 4,
    "other_process": 5,
    "delete": 6,
    "empty_cache": 8,
    "smaller": 9,
}
_KEEP_DATA_VIAS = ("tensor", "container", "attribute", "parameters", "buffers", "gradients",
                   "optimizer state", "optimizer params")  # fmt: skip


def explain_oom(
    oom: OomEvent,
    after: DeviceSample,
    segments: Sequence[Segment],
    held: DeviceHoldings | None,
    other_processes: Sequence[tuple[int, str, int]] = (),
    settings: dict | None = None,
    n_rows: int = 5,
) -> PostMortem:
    segs = list(segments)
    space = free_space(segs)
    request = oom.requested
    total = after.total
    cap = oom.allowed if total is None or oom.allowed < total else None
    # Free device memory now (the failed op's temporaries are gone; its frames are kept).
    free = (total - after.device_used) if total is not None and after.device_used is not None \
        else oom.free  # fmt: skip
    outside = after.outside_torch

    def fits(freed: Sequence[int] = (), device_free: int = free, cap_: int | None = cap,
             expandable: bool = False) -> bool:  # fmt: skip
        return would_fit(segs, request, device_free, cap_, freed, expandable)

    fixes: list[Fix] = []
    expandable_on = bool((settings or {}).get("expandable_segments")) or space.expandable
    if space.pieces_bytes + space.releasable >= request > space.largest_free_block:
        ok = fits(expandable=True)
        if expandable_on:
            text = (
                f"largest free block {fb(space.largest_free_block)} < {fb(request)} requested "
                f"while {fb(space.pieces_bytes)} is free in {space.pieces} pieces: fragmentation, "
                "although expandable_segments is on; max_split_size_mb keeps large blocks "
                "from being split"
            )
            fixes.append(Fix("fragmentation", text, space.pieces_bytes, None,
                             "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512"))  # fmt: skip
        else:
            text = (
                f"largest free block {fb(space.largest_free_block)} < {fb(request)} requested "
                f"while {fb(space.pieces_bytes)} is free in {space.pieces} pieces: "
                "fragmentation; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the "
                "first CUDA call (restart the kernel with it)"
            )
            fixes.append(Fix("fragmentation", text, space.pieces_bytes, ok,
                             "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"))  # fmt: skip
    if cap is not None:
        ok = fits(cap_=None)
        room = "the device has room for it" if ok else f"but only {fb(free)} is free on the device"
        fixes.append(
            Fix(
                "cap",
                f"the cap of {fb(cap)} stops it; {room}: `%gpumem limit off` or a larger cap",
                None,
                ok,
                "%gpumem limit off",
            )
        )
    if held is not None:
        fixes += _holder_fixes(held, fits)
    others = sum(b for _, _, b in other_processes)
    if others:
        names = ", ".join(f"PID {p} {n} {fb(b)}" for p, n, b in other_processes[:3])
        fixes.append(
            Fix(
                "other_process",
                f"other processes hold {fb(others)} on this device ({names})",
                others,
                fits(device_free=free + others),
            )
        )
    if space.releasable:
        fixes.append(
            Fix(
                "empty_cache",
                f"empty-cache returns {fb(space.releasable)}; PyTorch does "
                "that itself before raising, so it won't make this request fit",
                space.releasable,
                False,
                "%gpumem empty-cache",
            )
        )
    else:
        fixes.append(
            Fix("empty_cache", "empty-cache returns nothing: PyTorch already released its "
                "unused cached segments before raising", 0, False, "%gpumem empty-cache")
        )  # fmt: skip
    fixes.append(
        Fix(
            "smaller",
            "a smaller batch, activation checkpointing or lower precision "
            "(bfloat16) shrinks what each step needs",
            None,
            None,
        )
    )
    fixes.sort(key=lambda f: (f.fits is not True, PRIORITY[f.kind], -(f.frees or 0)))
    owners: tuple[WhoRow, ...] = ()
    lines: tuple[WhoRow, ...] = ()
    if held is not None:
        owners = held.report("variable", n_rows).rows
        if held.tracking:
            lines = held.report("line", n_rows).rows
    return PostMortem(
        device=oom.device,
        requested=request,
        free=free,
        total=total,
        cap=cap,
        reserved=space.reserved,
        allocated=space.allocated,
        cached_free=space.cached_free,
        releasable=space.releasable,
        free_pieces=space.pieces,
        free_pieces_bytes=space.pieces_bytes,
        largest_free_block=space.largest_free_block,
        outside_torch=outside,
        other_processes=tuple(other_processes),
        owners=owners,
        lines=lines,
        fixes=tuple(fixes),
    )


def _holder_fixes(held: DeviceHoldings, fits: Callable[..., bool]) -> list[Fix]:
    by_owner: dict[str, list[int]] = {}
    vias: dict[str, set[str]] = {}
    for address, ref in held.owners.items():
        by_owner.setdefault(ref.owner, []).append(address)
        vias.setdefault(ref.owner, set()).add(ref.via)
    out: list[Fix] = []
    tb = [a for o, addrs in by_owner.items() if o.startswith("traceback:") for a in addrs]
    if tb:
        size = _size(held, tb)
        out.append(
            Fix(
                "traceback",
                f"`%gpumem release-traceback` frees {fb(size)} that the kept "
                "traceback's frames hold" + _enough(fits(tb)),
                size,
                fits(tb),
                "%gpumem release-traceback",
            )
        )
    history = [a for o, addrs in by_owner.items()
               if vias[o] == {"output history"} for a in addrs]  # fmt: skip
    if history:
        size = _size(held, history)
        names = ", ".join(sorted(o for o in by_owner if vias[o] == {"output history"})[:3])
        out.append(
            Fix(
                "output_history",
                f"`%reset -f out` frees {fb(size)} that the output history "
                f"({names}) keeps" + _enough(fits(history)),
                size,
                fits(history),
                "%reset -f out",
            )
        )
    deletable = []
    for owner, addrs in by_owner.items():
        if owner.startswith("traceback:") or vias[owner] == {"output history"}:
            continue
        graph = [a for a in addrs if held.owners[a].via == "autograd graph"]
        if graph:
            size = _size(held, graph)
            out.append(
                Fix("graph", f"`{owner} = {owner}.detach()` frees {fb(size)}: the autograd "
                    f"graph `{owner}` keeps (accumulate `loss.item()`, not `loss`)"
                    + _enough(fits(graph)), size, fits(graph), f"{owner} = {owner}.detach()")
            )  # fmt: skip
        if vias[owner] & set(_KEEP_DATA_VIAS) or graph:
            deletable.append((owner, addrs))
    deletable.sort(key=lambda oa: -_size(held, oa[1]))
    for owner, addrs in deletable[:5]:
        size = _size(held, addrs)
        ok = fits(addrs)
        out.append(Fix("delete", f"`del {owner}` frees {fb(size)}" + _enough(ok), size, ok,
                       f"del {owner}"))  # fmt: skip
    unreachable = [a for a in held.blocks if a not in held.owners]
    if unreachable and held.walked:
        size = _size(held, unreachable)
        if size and fits(unreachable):
            out.append(
                Fix(
                    "delete",
                    f"{fb(size)} is {UNREACHABLE} (held by objects this walk does "
                    "not open, or kept by C++): finding and freeing it would be enough",
                    size,
                    None,
                )
            )
    return out


def _size(held: DeviceHoldings, addresses: Sequence[int]) -> int:
    return sum(held.blocks[a]["size"] for a in addresses)


def _enough(ok: bool) -> str:
    return ": enough" if ok else ": not enough"
