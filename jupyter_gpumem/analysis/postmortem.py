"""Why an allocation failed, and which fix would make the cell fit.

Inputs are plain records: the allocator's OOM event, the device figures after the
failure, the snapshot taken after the exception (never inside the OOM observer: the
allocator holds its lock there), who holds the live blocks, other processes on the
device, and what the failed cell needs (:class:`Need`).

Every fix is judged against the cell's *need*, not the failed request alone: what the
cell had allocated above its start when it failed, plus the request (and, when a scan of
the cell says, what the whole cell needs). Memory the failed run holds itself (the kept
traceback's frames, names the failed cell bound) is not a fix: re-running the cell
allocates it again, while the old copy is still held. Releasing it is a *first step*
before any retry. A fix then "fits" only when, after it and the first steps, the whole
need fits under the device's free memory and the cap; "maybe" when it covers the need so
far (the cell may need more after the point where it failed); otherwise "no", with the
shortfall. ``would_fit`` also checks the failed request block by block (fragmentation).

The first steps come first, so every later fix is worded against what is still missing
after them: the need less the *room* (what PyTorch can use on the device, within the cap,
once the first steps are done: free memory plus its own cache plus what they free, less
what stays allocated). When the first steps alone make room for the need known so far,
the last of them says so, and later fixes read "not needed once the first steps are
done" (extra room); otherwise the last first step names the remainder, each later fix
says whether it covers it, and a shortfall is the remainder less what the fix adds.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ..model import (
    AllocatorStats,
    DeviceSample,
    Fix,
    FixKind,
    OomEvent,
    PostMortem,
    ProcessMemory,
    Segment,
    WhoRow,
    WorkerReport,
)
from ..units import format_bytes as fb
from .fragmentation import free_space, would_fit
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
_KEEP_DATA_VIAS = (
    "tensor",
    "container",
    "attribute",
    "parameters",
    "buffers",
    "gradients",
    "optimizer state",
    "optimizer params",
    "autograd graph",
)
_VERDICT_ORDER = {True: 0, None: 1, False: 2}


@dataclass(frozen=True, slots=True)
class Need:
    """What the failed cell needs, and what is known about it."""

    so_far: int  # allocated above the cell's start when it failed, plus the failed request
    full: int | None = None  # the whole cell, when a scan of it says
    bound: frozenset[str] = frozenset()  # names the failed cell binds: its own memory
    hint: str = ""  # the largest value that fits, or the scan to run
    # A worker process's failure (its own snapshot, taken at the failure): "the rank"
    # in the wording; everything it holds comes back when it restarts (nothing is kept),
    # and neither the kernel's magics nor empty_cache can reach it.
    who: str = "the cell"

    @property
    def remote(self) -> bool:
        return self.who != "the cell"


def bound_names(code: str) -> frozenset[str]:
    """Names a cell binds at its top level (assignments, for/with targets, imports,
    definitions): what they hold is the run's own, and a re-run makes it again."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return frozenset()
    names: set[str] = set()

    def targets(node: ast.AST) -> None:
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names.add(n.id)

    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for t in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
                targets(t)
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            targets(stmt.target)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    targets(item.optional_vars)
    return frozenset(names)


SIZE_NAME = re.compile(
    r"^(batch|batch_size|bs|bsz|micro_batch|micro_batch_size|per_device_batch_size|"
    r"seq_len|seq_length|seqlen|max_len|max_length|max_seq_len|block_size|n_ctx|"
    r"context_length|num_tokens|image_size|img_size|resolution)$"
)


def size_variables(code: str, namespace: dict) -> list[tuple[str, int, bool]]:
    """Obvious size variables a cell uses: (name, value, assigned in the cell itself)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    found: dict[str, tuple[int, bool]] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant):
            v = n.value.value
            for t in n.targets:
                if isinstance(t, ast.Name) and SIZE_NAME.match(t.id) and type(v) is int:
                    found[t.id] = (v, True)
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and SIZE_NAME.match(n.id) and n.id not in found:
            v = namespace.get(n.id)
            if type(v) is int and v > 0:
                found[n.id] = (v, False)
    return [(k, v, inside) for k, (v, inside) in found.items()]


def scan_suggestion(name: str, value: int, inside: bool, fit_in: str) -> str:
    """``%%gpumem --scan batch=16,32,48 --fit-in 12GiB`` for a failed ``batch`` of 64."""
    probes = sorted({max(1, value * k // 8) for k in (2, 4, 6)})
    if len(probes) < 2:
        probes = [max(1, value // 2), value]
    where = f" (move `{name} = {value}` out of it first)" if inside else ""
    return (
        f"`%%gpumem --scan {name}={','.join(map(str, probes))} --fit-in {fit_in}` on this "
        f"cell{where} finds the largest {name} that fits, verified"
    )


def explain_oom(
    oom: OomEvent,
    after: DeviceSample,
    segments: Sequence[Segment],
    held: DeviceHoldings | None,
    other_processes: Sequence[ProcessMemory] = (),
    settings: dict | None = None,
    n_rows: int = 5,
    need: Need | None = None,
) -> PostMortem:
    segs = list(segments)
    space = free_space(segs)
    request = oom.requested
    total = after.total
    cap = oom.allowed if total is None or oom.allowed < total else None
    # Free device memory now (the failed op's temporaries are gone; its frames are kept).
    free = (
        (total - after.device_used)
        if total is not None and after.device_used is not None
        else oom.free
    )
    outside = after.outside_torch
    need = need if need is not None else Need(so_far=request)
    # The setting as far as this failure shows it: the snapshot's allocator_settings, or a
    # segment that is an expandable one; None when neither says.
    expandable_known: bool | None = space.expandable or None
    if settings is not None and "expandable_segments" in settings:
        expandable_known = bool(settings["expandable_segments"]) or space.expandable
    expandable_on = bool(expandable_known)

    owners = _by_owner(held) if held is not None else {}
    tb = [a for o, (addrs, _) in owners.items() if o.startswith("traceback:") for a in addrs]
    own_names = sorted(
        o for o, (_, vias) in owners.items() if o in need.bound and vias & set(_KEEP_DATA_VIAS)
    )
    own = [a for o in own_names for a in owners[o][0]]
    first_bytes = _size(held, tb) + _size(held, own) if held is not None else 0
    # What PyTorch may hold on this device (free memory plus its own cache, within the
    # cap), and what stays held after the first steps: the room left for the cell.
    limit = space.reserved + free if cap is None else min(cap, space.reserved + free)
    kept = 0 if need.remote else space.allocated - first_bytes
    room = limit - kept
    first_addresses = [*tb, *own]

    def judge(
        frees: int = 0,
        limit_: int = limit,
        freed: Sequence[int] = (),
        expandable: bool = False,
        cap_: int | None = cap,
        device_free: int = free,
    ) -> tuple[bool | None, int | None]:
        """(fits, shortfall) after a fix that frees ``frees`` bytes (beyond the first
        steps) or moves the limit."""
        avail = limit_ - (kept - frees)
        block_ok = would_fit(
            segs, request, device_free, cap_, [*first_addresses, *freed], expandable
        )
        if need.full is not None:
            short = need.full - avail
            return (short <= 0 and block_ok), (short if short > 0 else None)
        short = need.so_far - avail
        if short > 0:
            return False, short
        return (None if block_ok else False), None

    # The first steps alone: what every later fix is worded against.
    base_ok, base_short = judge()
    base = _Baseline(
        need=need,
        request=request,
        first=bool(tb or own_names),
        covered=base_ok is not False,
        missing=base_short or 0,
    )

    fixes: list[Fix] = []
    if tb:
        size = _size(held, tb)
        fixes.append(
            Fix(
                "traceback",
                f"first, before any retry: `%gpumem release-traceback` frees "
                f"{fb(size)} of this run's own tensors that the kept traceback's frames still "
                "hold (re-running the cell allocates them again)",
                size,
                None,
                "%gpumem release-traceback",
                first_step=True,
            )
        )
    if own_names:
        size = _size(held, own)
        names = ", ".join(own_names)
        fixes.append(
            Fix(
                "delete",
                f"first, before any retry: `del {names}` frees {fb(size)} that the "
                "failed cell bound (re-running it allocates them again while these are still "
                "held)",
                size,
                None,
                f"del {names}",
                first_step=True,
            )
        )
    if fixes:
        fixes[-1] = replace(fixes[-1], text=fixes[-1].text + _after_first_steps(base))
    if space.pieces_bytes + space.releasable >= request > space.largest_free_block:
        ok, short = judge(expandable=True)
        if expandable_on:
            # PyTorch unmaps the free pages of expandable segments before it raises, and
            # ignores max_split_size for splitting while they are on (``should_split``).
            text = (
                f"largest free block {fb(space.largest_free_block)} < {fb(request)} requested "
                f"while {fb(space.pieces_bytes)} is free in {space.pieces} pieces: fragmentation, "
                "although expandable_segments is on (PyTorch unmapped the free pages of its "
                "segments before raising): what is left lies in pages shared with live blocks "
                "or in segments made without it (before it was turned on, CUDA graphs' pools); "
                "freeing the live blocks around them helps, max_split_size_mb does not (it "
                "does not stop splitting while expandable segments are on); `%gpumem "
                "segments` shows where they are"
            )
            fixes.append(Fix("fragmentation", text, space.pieces_bytes, None))
        else:
            text = (
                f"largest free block {fb(space.largest_free_block)} < {fb(request)} requested "
                f"while {fb(space.pieces_bytes)} is free in {space.pieces} pieces: "
                "fragmentation; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the "
                "first CUDA call (restart the kernel with it)" + _verdict(ok, short, base)
            )
            fixes.append(
                Fix(
                    "fragmentation",
                    text,
                    space.pieces_bytes,
                    ok,
                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                    shortfall=short,
                )
            )
    if cap is not None:
        uncapped = space.reserved + free
        ok, short = judge(limit_=uncapped, cap_=None)
        how = (
            "a larger `torch.cuda.set_per_process_memory_fraction` in the worker, or none"
            if need.remote
            else "`%gpumem limit off` or a larger cap"
        )
        fixes.append(
            Fix(
                "cap",
                f"the cap of {fb(cap)} stops it; without it PyTorch could use "
                f"{fb(uncapped)} here: {how}" + _verdict(ok, short, base),
                None,
                ok,
                "" if need.remote else "%gpumem limit off",
                shortfall=short,
            )
        )
    if held is not None:
        fixes += _holder_fixes(held, owners, set(own_names), judge, base)
    others = sum(b for _, _, b in other_processes)
    if others:
        names = ", ".join(f"PID {p} {n} {fb(b)}" for p, n, b in other_processes[:3])
        widened = space.reserved + free + others
        ok, short = judge(
            limit_=widened if cap is None else min(cap, widened), device_free=free + others
        )
        fixes.append(
            Fix(
                "other_process",
                f"other processes hold {fb(others)} on this device ({names})"
                + _verdict(ok, short, base),
                others,
                ok,
                shortfall=short,
            )
        )
    if need.remote:
        pass  # the kernel cannot empty another process's cache (PyTorch did before raising)
    elif space.releasable:
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
            Fix(
                "empty_cache",
                "empty-cache returns nothing: PyTorch already released its "
                "unused cached segments before raising",
                0,
                False,
                "%gpumem empty-cache",
            )
        )
    smaller = (
        "a smaller batch, activation checkpointing or lower precision (bfloat16) shrinks "
        "what each step needs"
    )
    # The hint has its own line; the fix repeats only a scan command to run.
    suggest = need.hint if need.hint.startswith("`%%gpumem --scan") else ""
    fixes.append(Fix("smaller", f"{suggest}; {smaller}" if suggest else smaller, None, None))
    fixes.sort(
        key=lambda f: (
            not f.first_step,
            f.kind == "smaller",  # advice, not a measured fix: last
            _VERDICT_ORDER[f.fits],
            PRIORITY[f.kind],
            -(f.frees or 0),
        )
    )
    owner_rows: tuple[WhoRow, ...] = ()
    lines: tuple[WhoRow, ...] = ()
    if held is not None:
        owner_rows = held.report("variable", n_rows).rows
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
        owners=owner_rows,
        lines=lines,
        fixes=tuple(fixes),
        need=need.so_far,
        need_full=need.full,
        room=room,
        hint=need.hint,
        expandable_segments=expandable_known,
    )


Judge = Callable[..., tuple[bool | None, int | None]]


def _by_owner(held: DeviceHoldings) -> dict[str, tuple[list[int], set[str]]]:
    out: dict[str, tuple[list[int], set[str]]] = {}
    for address, ref in held.owners.items():
        addrs, vias = out.setdefault(ref.owner, ([], set()))
        addrs.append(address)
        vias.add(ref.via)
    return out


def _holder_fixes(
    held: DeviceHoldings,
    owners: dict[str, tuple[list[int], set[str]]],
    own: set[str],
    judge: Judge,
    base: _Baseline,
) -> list[Fix]:
    out: list[Fix] = []
    history = [
        a for o, (addrs, vias) in owners.items() if vias == {"output history"} for a in addrs
    ]
    if history:
        size = _size(held, history)
        names = ", ".join(sorted(o for o, (_, v) in owners.items() if v == {"output history"})[:3])
        ok, short = judge(size, freed=history)
        out.append(
            Fix(
                "output_history",
                f"`%reset -f out` frees {fb(size)} that the output history ({names}) keeps"
                + _verdict(ok, short, base),
                size,
                ok,
                "%reset -f out",
                shortfall=short,
            )
        )
    deletable = []
    for owner, (addrs, vias) in owners.items():
        if owner.startswith("traceback:") or vias == {"output history"} or owner in own:
            continue
        graph = [a for a in addrs if held.owners[a].via == "autograd graph"]
        if graph:
            size = _size(held, graph)
            ok, short = judge(size, freed=graph)
            out.append(
                Fix(
                    "graph",
                    f"`{owner} = {owner}.detach()` frees {fb(size)}: the autograd "
                    f"graph `{owner}` keeps (accumulate `loss.item()`, not `loss`)"
                    + _verdict(ok, short, base),
                    size,
                    ok,
                    f"{owner} = {owner}.detach()",
                    shortfall=short,
                )
            )
        if vias & set(_KEEP_DATA_VIAS) or graph:
            deletable.append((owner, addrs))
    deletable.sort(key=lambda oa: -_size(held, oa[1]))
    for owner, addrs in deletable[:5]:
        size = _size(held, addrs)
        ok, short = judge(size, freed=addrs)
        out.append(
            Fix(
                "delete",
                f"`del {owner}` frees {fb(size)}" + _verdict(ok, short, base),
                size,
                ok,
                f"del {owner}",
                shortfall=short,
            )
        )
    unreachable = [a for a in held.blocks if a not in held.owners]
    if unreachable and held.walked:
        size = _size(held, unreachable)
        ok, short = judge(size, freed=unreachable)
        if ok is not False:
            if base.covered:
                tail = _verdict(ok, short, base)
            elif base.first and base.missing:
                tail = (
                    f": finding and freeing it would cover the {fb(base.missing)} still missing "
                    "after the first steps"
                )
            else:
                tail = ": finding and freeing it would be enough for what the cell needed so far"
            out.append(
                Fix(
                    "delete",
                    f"{fb(size)} is {UNREACHABLE} (held by objects this walk does "
                    "not open, or kept by C++)" + tail,
                    size,
                    None,
                )
            )
    return out


def _size(held: DeviceHoldings | None, addresses: Sequence[int]) -> int:
    if held is None:
        return 0
    return sum(held.blocks[a]["size"] for a in addresses)


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
            return f"the {fb(self.need.full)} the whole cell needs"
        return f"the {fb(self.need.so_far)} {self.need.who} needed so far"


def _after_first_steps(base: _Baseline) -> str:
    """The plain line the last first step ends with."""
    if base.covered:
        return f"; the first steps alone make room for {base.known}: re-run after them"
    if base.missing:
        return (
            f"; after the first steps {fb(base.missing)} of {base.known} is still missing: "
            "the fixes below are judged against that"
        )
    return (
        f"; after the first steps there is room for {base.known}, but the "
        f"{fb(base.request)} request still fits in no free block (fragmentation)"
    )


def _verdict(ok: bool | None, short: int | None, base: _Baseline) -> str:
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
                f": enough for the whole cell: covers the {fb(base.missing)} still missing "
                f"after the first steps (it needs {fb(need.full)})"
            )
        return f": enough for the whole cell (it needs {fb(need.full)})"
    if ok is None:
        if remainder:
            return (
                f": covers the {fb(base.missing)} still missing after the first steps (of the "
                f"{fb(need.so_far)} {need.who} needed so far; maybe: it may need more after the "
                "point where it failed)"
            )
        return (
            f": covers the {fb(need.so_far)} {need.who} needed so far (maybe: it may need "
            "more after the point where it failed)"
        )
    if short is not None:
        if remainder:
            return (
                f": not enough, {fb(base.missing)} of {base.known} is still missing after the "
                f"first steps and this would leave it {fb(short)} short"
            )
        whole = need.full if need.full is not None else need.so_far
        return f": not enough, {need.who} needs {fb(whole)} and would still be {fb(short)} short"
    return ": not enough (the request still would not fit in one block)"


def worker_postmortem(w: WorkerReport) -> PostMortem | None:
    """The post-mortem of a worker process's OOM, from its own snapshot taken at the
    failure (``collectors/worker_oom.py``): the same analysis as the kernel's cells, fed
    what a worker has. No namespace, traceback or output history (the worker's are out of
    reach), no empty-cache (the kernel cannot empty another process's cache, and PyTorch
    did before raising); the fixes are judged from its allocator's state against what
    the rank needed: everything it held when it failed plus the request."""
    o = w.oom_snapshot
    if o is None:
        return None
    segs = list(o.segments)
    space = free_space(segs)
    stats = AllocatorStats(
        allocated=space.allocated,
        reserved=space.reserved,
        active=space.allocated,
        requested=space.allocated,
        inactive_split=space.pieces_bytes,
        peak_allocated=space.allocated,
        peak_reserved=space.reserved,
        device_allocs=0,
        device_frees=0,
        alloc_retries=0,
        ooms=0,
        segments=space.segments,
        blocks=0,
    )
    after = DeviceSample(
        index=o.device,
        name="",
        backend="cuda",
        initialized=True,
        allocator=stats,
        total=o.total,
        device_used=o.device_used,
        process_used=o.process_used,
    )
    who = f"rank {w.rank}" if w.rank is not None else "the worker"
    need = Need(so_far=space.allocated + o.requested, who=who)
    settings = (
        {"expandable_segments": o.expandable_segments}
        if o.expandable_segments is not None
        else None
    )
    event = OomEvent(o.device, o.requested, o.allowed, o.free)
    pm = explain_oom(event, after, segs, None, (), settings, need=need)
    lines = tuple(
        WhoRow(site, "allocated here (the worker's recorded stacks)", size, blocks, kind="site")
        for site, size, blocks in o.lines
    )
    return replace(pm, lines=lines, time=0.0)
