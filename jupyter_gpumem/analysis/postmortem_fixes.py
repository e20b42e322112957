"""The fixes an out-of-memory post-mortem offers, each judged and worded against the room.

For :func:`~jupyter_gpumem.analysis.postmortem.explain_oom`: :func:`fixes` lists every fix
the records support (release the kept traceback, delete what the failed cell bound,
fragmentation, the cap, output history, autograd graphs, other variables, memory nobody
reaches, other processes, empty-cache, a smaller step), each with its verdict from
:meth:`~jupyter_gpumem.analysis.postmortem_room.Room.judge`, in the order shown.

The first steps come first, so every later fix is worded against what is still missing
after them (:class:`_Baseline`): when the first steps alone make room for the need known
so far, the last of them says so and later fixes read "not needed once the first steps
are done" (extra room); otherwise the last first step names the remainder, each later fix
says whether it covers it, and a shortfall is the remainder less what the fix adds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..model import Fix, FixKind, ProcessMemory
from ..units import format_bytes
from .postmortem_room import KEEP_DATA_VIAS, FirstSteps, Need, Owners, Room, size_of
from .who import UNREACHABLE, DeviceHoldings

# Among fixes of equal verdict: the cause first, then what frees memory nobody needs
# (a leaked graph, old outputs), then lifting a cap the user set to try a smaller GPU,
# then other processes, and last deleting the user's own data.
PRIORITY: dict[FixKind, int] = {
    "traceback": 0,
    "fragmentation": 0,
    "graph": 2,
    "output_history": 3,
    "cap": 4,
    "other_process": 5,
    "delete": 6,
    "empty_cache": 8,
    "smaller": 9,
}
_VERDICT_ORDER = {True: 0, None: 1, False: 2}


def fixes(
    room: Room,
    held: DeviceHoldings | None,
    owners: Owners,
    first: FirstSteps,
    other_processes: Sequence[ProcessMemory],
    expandable_on: bool,
) -> list[Fix]:
    """Every fix for the failure, judged against the room, in the order shown: the first
    steps, then advice last, and between them by verdict (fits, maybe, no), then
    :data:`PRIORITY`, then the most bytes freed. ``expandable_on``: the allocator's
    expandable segments are known to be on."""
    base_ok, base_short = room.judge()  # the first steps alone
    base = _Baseline(
        need=room.need,
        request=room.request,
        first=first.present,
        covered=base_ok is not False,
        missing=base_short or 0,
    )
    out = _first_steps(held, first, base)
    space = room.space
    if space.pieces_bytes + space.releasable >= room.request > space.largest_free_block:
        out.append(_fragmentation(room, expandable_on, base))
    if room.cap is not None:
        out.append(_cap(room, room.cap, base))
    if held is not None:
        out += _holder_fixes(held, owners, set(first.names), room, base)
    others = sum(b for _, _, b in other_processes)
    if others:
        out.append(_other_processes(room, other_processes, others, base))
    if not room.need.remote:  # the kernel cannot empty another process's cache
        out.append(_empty_cache(room))
    out.append(_smaller(room.need))
    out.sort(
        key=lambda f: (
            not f.first_step,
            f.kind == "smaller",  # advice, not a measured fix: last
            _VERDICT_ORDER[f.fits],
            PRIORITY[f.kind],
            -(f.frees or 0),
        )
    )
    return out


def _first_steps(held: DeviceHoldings | None, first: FirstSteps, base: _Baseline) -> list[Fix]:
    """Release the kept traceback, delete what the failed cell bound: before any retry;
    the last of them says where they leave the cell."""
    out: list[Fix] = []
    if first.traceback:
        size = size_of(held, first.traceback)
        out.append(
            Fix(
                "traceback",
                f"first, before any retry: `%gpumem release-traceback` frees "
                f"{format_bytes(size)} of this run's own tensors that the kept traceback's "
                "frames still hold (re-running the cell allocates them again)",
                size,
                None,
                "%gpumem release-traceback",
                first_step=True,
            )
        )
    if first.names:
        size = size_of(held, first.bound)
        names = ", ".join(first.names)
        out.append(
            Fix(
                "delete",
                f"first, before any retry: `del {names}` frees {format_bytes(size)} that the "
                "failed cell bound (re-running it allocates them again while these are still "
                "held)",
                size,
                None,
                f"del {names}",
                first_step=True,
                free_names=tuple(first.names),
            )
        )
    if out:
        out[-1] = replace(out[-1], text=out[-1].text + _after_first_steps(base))
    return out


def _fragmentation(room: Room, expandable_on: bool, base: _Baseline) -> Fix:
    """The request fits in no free block while enough is free in pieces."""
    space, request = room.space, room.request
    ok, short = room.judge(expandable=True)
    if expandable_on:
        # PyTorch unmaps the free pages of expandable segments before it raises, and
        # ignores max_split_size for splitting while they are on (``should_split``).
        text = (
            f"largest free block {format_bytes(space.largest_free_block)} < "
            f"{format_bytes(request)} requested while {format_bytes(space.pieces_bytes)} is "
            f"free in {space.pieces} pieces: fragmentation, "
            "although expandable_segments is on (PyTorch unmapped the free pages of its "
            "segments before raising): what is left lies in pages shared with live blocks "
            "or in segments made without it (before it was turned on, CUDA graphs' pools); "
            "freeing the live blocks around them helps, max_split_size_mb does not (it "
            "does not stop splitting while expandable segments are on); `%gpumem "
            "segments` shows where they are"
        )
        return Fix("fragmentation", text, space.pieces_bytes, None)
    text = (
        f"largest free block {format_bytes(space.largest_free_block)} < "
        f"{format_bytes(request)} requested while {format_bytes(space.pieces_bytes)} is "
        f"free in {space.pieces} pieces: fragmentation; set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the first CUDA call (restart "
        "the kernel with it)" + _verdict(ok, short, base)
    )
    return Fix(
        "fragmentation",
        text,
        space.pieces_bytes,
        ok,
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        shortfall=short,
    )


def _cap(room: Room, cap: int, base: _Baseline) -> Fix:
    """Lift the cap on PyTorch (``cap``, the room's)."""
    uncapped = room.space.reserved + room.free
    ok, short = room.judge(limit=uncapped, capped=False)
    remote = room.need.remote
    how = (
        "a larger `torch.cuda.set_per_process_memory_fraction` in the worker, or none"
        if remote
        else "`%gpumem limit off` or a larger cap"
    )
    return Fix(
        "cap",
        f"the cap of {format_bytes(cap)} stops it; without it PyTorch could use "
        f"{format_bytes(uncapped)} here: {how}" + _verdict(ok, short, base),
        None,
        ok,
        "" if remote else "%gpumem limit off",
        shortfall=short,
    )


def _other_processes(
    room: Room, other_processes: Sequence[ProcessMemory], others: int, base: _Baseline
) -> Fix:
    """What other processes hold on the device (``others`` bytes in all)."""
    names = ", ".join(f"PID {p} {n} {format_bytes(b)}" for p, n, b in other_processes[:3])
    widened = room.space.reserved + room.free + others
    ok, short = room.judge(
        limit=widened if room.cap is None else min(room.cap, widened),
        device_free=room.free + others,
    )
    return Fix(
        "other_process",
        f"other processes hold {format_bytes(others)} on this device ({names})"
        + _verdict(ok, short, base),
        others,
        ok,
        shortfall=short,
    )


def _empty_cache(room: Room) -> Fix:
    """Empty-cache never makes the request fit: PyTorch did it before raising."""
    releasable = room.space.releasable
    if releasable:
        return Fix(
            "empty_cache",
            f"empty-cache returns {format_bytes(releasable)}; PyTorch does "
            "that itself before raising, so it won't make this request fit",
            releasable,
            False,
            "%gpumem empty-cache",
        )
    return Fix(
        "empty_cache",
        "empty-cache returns nothing: PyTorch already released its "
        "unused cached segments before raising",
        0,
        False,
        "%gpumem empty-cache",
    )


def _smaller(need: Need) -> Fix:
    """Advice: a smaller step, with the scan to run when the hint names one."""
    smaller = (
        "a smaller batch, activation checkpointing or lower precision (bfloat16) shrinks "
        "what each step needs"
    )
    # The hint has its own line; the fix repeats only a scan command to run.
    suggest = need.hint if need.hint.startswith("`%%gpumem --scan") else ""
    return Fix("smaller", f"{suggest}; {smaller}" if suggest else smaller, None, None)


def _holder_fixes(
    held: DeviceHoldings,
    owners: Owners,
    own: set[str],
    room: Room,
    base: _Baseline,
) -> list[Fix]:
    """Free what holders keep: the output history, autograd graphs, the largest five
    variables (not the first steps' names), and memory no walked reference reaches."""
    out: list[Fix] = []
    history = _output_history(held, owners, room, base)
    if history is not None:
        out.append(history)
    deletable = []
    for owner, (addrs, vias) in owners.items():
        if owner.startswith("traceback:") or vias == {"output history"} or owner in own:
            continue
        graph = [a for a in addrs if held.owners[a].via == "autograd graph"]
        if graph:
            size = size_of(held, graph)
            ok, short = room.judge(size, freed=graph)
            out.append(
                Fix(
                    "graph",
                    f"`{owner} = {owner}.detach()` frees {format_bytes(size)}: the autograd "
                    f"graph `{owner}` keeps (accumulate `loss.item()`, not `loss`)"
                    + _verdict(ok, short, base),
                    size,
                    ok,
                    f"{owner} = {owner}.detach()",
                    shortfall=short,
                )
            )
        if vias & set(KEEP_DATA_VIAS) or graph:
            deletable.append((owner, addrs))
    deletable.sort(key=lambda oa: -size_of(held, oa[1]))
    for owner, addrs in deletable[:5]:
        size = size_of(held, addrs)
        ok, short = room.judge(size, freed=addrs)
        out.append(
            Fix(
                "delete",
                f"`del {owner}` frees {format_bytes(size)}" + _verdict(ok, short, base),
                size,
                ok,
                f"del {owner}",
                shortfall=short,
                free_names=(owner,),
            )
        )
    unreachable = _unreachable(held, room, base)
    if unreachable is not None:
        out.append(unreachable)
    return out


def _output_history(
    held: DeviceHoldings, owners: Owners, room: Room, base: _Baseline
) -> Fix | None:
    """``%reset -f out``, when the output history alone keeps some blocks."""
    history = [
        a for o, (addrs, vias) in owners.items() if vias == {"output history"} for a in addrs
    ]
    if not history:
        return None
    size = size_of(held, history)
    names = ", ".join(sorted(o for o, (_, v) in owners.items() if v == {"output history"})[:3])
    ok, short = room.judge(size, freed=history)
    return Fix(
        "output_history",
        f"`%reset -f out` frees {format_bytes(size)} that the output history ({names}) keeps"
        + _verdict(ok, short, base),
        size,
        ok,
        "%reset -f out",
        shortfall=short,
    )


def _unreachable(held: DeviceHoldings, room: Room, base: _Baseline) -> Fix | None:
    """Memory no reference of the namespace walk reaches, when freeing it would help
    (only after a walk: without one every block would look unreachable)."""
    unreachable = [a for a in held.blocks if a not in held.owners]
    if not unreachable or not held.walked:
        return None
    size = size_of(held, unreachable)
    ok, short = room.judge(size, freed=unreachable)
    if ok is False:
        return None
    if base.covered:
        tail = _verdict(ok, short, base)
    elif base.first and base.missing:
        tail = (
            f": finding and freeing it would cover the {format_bytes(base.missing)} still "
            "missing after the first steps"
        )
    else:
        tail = ": finding and freeing it would be enough for what the cell needed so far"
    return Fix(
        "delete",
        f"{format_bytes(size)} is {UNREACHABLE} (held by objects this walk does "
        "not open, or kept by C++)" + tail,
        size,
        None,
    )


@dataclass(frozen=True, slots=True)
class _Baseline:
    """Where the first steps alone leave the cell: what later fixes are worded against."""

    need: Need
    request: int
    first: bool  # there are first steps
    covered: bool  # after them the need known so far fits (the request in one block too)
    missing: int  # bytes of that need still missing after them (0: none)

    @property
    def known(self) -> str:
        """The need known so far, in words: "the 9.79 GiB the cell needed so far"."""
        if self.need.full is not None:
            return f"the {format_bytes(self.need.full)} the whole cell needs"
        return f"the {format_bytes(self.need.so_far)} {self.need.who} needed so far"


def _after_first_steps(base: _Baseline) -> str:
    """The plain line the last first step ends with."""
    if base.covered:
        return f"; the first steps alone make room for {base.known}: re-run after them"
    if base.missing:
        return (
            f"; after the first steps {format_bytes(base.missing)} of {base.known} is still "
            "missing: the fixes below are judged against that"
        )
    return (
        f"; after the first steps there is room for {base.known}, but the "
        f"{format_bytes(base.request)} request still fits in no free block (fragmentation)"
    )


def _verdict(ok: bool | None, short: int | None, base: _Baseline) -> str:
    """A fix's verdict in words, against where the first steps leave the cell."""
    need = base.need
    if base.covered and ok is not False:
        more = "" if need.full is not None else " if it needs more after the point where it failed"
        if base.first:
            return (
                f": not needed once the first steps are done (they make room for "
                f"{base.known}); extra room{more}"
            )
        return f": not needed, there is room for {base.known} already; extra room{more}"
    remainder = base.first and base.missing > 0
    if ok is True:
        if remainder:
            return (
                f": enough for the whole cell: covers the {format_bytes(base.missing)} still "
                f"missing after the first steps (it needs {format_bytes(need.full)})"
            )
        return f": enough for the whole cell (it needs {format_bytes(need.full)})"
    if ok is None:
        if remainder:
            return (
                f": covers the {format_bytes(base.missing)} still missing after the first steps "
                f"(of the {format_bytes(need.so_far)} {need.who} needed so far; maybe: it may "
                "need more after the point where it failed)"
            )
        return (
            f": covers the {format_bytes(need.so_far)} {need.who} needed so far (maybe: it may "
            "need more after the point where it failed)"
        )
    if short is not None:
        if remainder:
            return (
                f": not enough, {format_bytes(base.missing)} of {base.known} is still missing "
                f"after the first steps and this would leave it {format_bytes(short)} short"
            )
        whole = need.full if need.full is not None else need.so_far
        return (
            f": not enough, {need.who} needs {format_bytes(whole)} and would still be "
            f"{format_bytes(short)} short"
        )
    return ": not enough (the request still would not fit in one block)"
