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
what stays allocated).

Where each part lives: :func:`explain_oom` (here) puts the post-mortem together;
``postmortem_room.py`` measures the room and judges a fix against the need;
``postmortem_fixes.py`` lists the fixes and words their verdicts. This module also reads
what a cell's code says about its need (the names it binds, its obvious size variables).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import replace

from ..model import (
    FreeSpace,
    OomEvent,
    PostMortem,
    ProcessMemory,
    Segment,
    WhoRow,
    WorkerReport,
)
from .fragmentation import free_space
from .postmortem_fixes import fixes as judged_fixes
from .postmortem_room import (
    DeviceAfter,
    DeviceFigures,
    Need,
    by_owner,
    first_steps,
    measure_room,
)
from .who import DeviceHoldings

__all__ = [
    "Need",
    "bound_names",
    "explain_oom",
    "scan_suggestion",
    "size_variables",
    "worker_postmortem",
]


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
    after: DeviceFigures,
    segments: Sequence[Segment],
    held: DeviceHoldings | None,
    other_processes: Sequence[ProcessMemory] = (),
    settings: dict | None = None,
    n_rows: int = 5,
    need: Need | None = None,
) -> PostMortem:
    """The post-mortem of one device's out-of-memory error: the device's figures after
    it (``after``: its total, what all processes use, this one beyond PyTorch; a
    DeviceSample has them), who holds the memory (``held``, None when not read: then no
    holder fixes and no first steps), and the fixes judged against ``need`` (default: the
    failed request alone). ``settings``: the snapshot's ``allocator_settings``;
    ``n_rows``: the owners and lines shown."""
    segs = list(segments)
    space = free_space(segs)
    need = need if need is not None else Need(so_far=oom.requested)
    owners = by_owner(held) if held is not None else {}
    first = first_steps(held, owners, need)
    room = measure_room(oom, after, segs, space, first, need)
    expandable = _expandable_segments(space, settings)
    fixes = judged_fixes(room, held, owners, first, other_processes, bool(expandable))
    owner_rows: tuple[WhoRow, ...] = ()
    lines: tuple[WhoRow, ...] = ()
    if held is not None:
        owner_rows = held.report("variable", n_rows).rows
        if held.tracking:
            lines = held.report("line", n_rows).rows
    return PostMortem(
        device=oom.device,
        requested=oom.requested,
        free=room.free,
        total=room.total,
        cap=room.cap,
        reserved=space.reserved,
        allocated=space.allocated,
        cached_free=space.cached_free,
        releasable=space.releasable,
        free_pieces=space.pieces,
        free_pieces_bytes=space.pieces_bytes,
        largest_free_block=space.largest_free_block,
        outside_torch=after.outside_torch,
        other_processes=tuple(other_processes),
        owners=owner_rows,
        lines=lines,
        fixes=tuple(fixes),
        need=need.so_far,
        need_full=need.full,
        room=room.room,
        hint=need.hint,
        expandable_segments=expandable,
    )


def _expandable_segments(space: FreeSpace, settings: dict | None) -> bool | None:
    """The setting as far as this failure shows it: the snapshot's allocator_settings, or
    a segment that is an expandable one; None when neither says."""
    known: bool | None = space.expandable or None
    if settings is not None and "expandable_segments" in settings:
        known = bool(settings["expandable_segments"]) or space.expandable
    return known


def worker_postmortem(w: WorkerReport) -> PostMortem | None:
    """The post-mortem of a worker process's OOM, from its own snapshot taken at the
    failure (``collectors/workers/oom.py``): the same analysis as the kernel's cells, fed
    what a worker has. No namespace, traceback or output history (the worker's are out of
    reach), no empty-cache (the kernel cannot empty another process's cache, and PyTorch
    did before raising); the fixes are judged from its allocator's state against what
    the rank needed: everything it held when it failed plus the request."""
    o = w.oom_snapshot
    if o is None:
        return None
    segs = list(o.segments)
    space = free_space(segs)
    used = o.process_used if o.process_used is not None else o.device_used
    outside = None if used is None else used - space.reserved
    after = DeviceAfter(o.total, o.device_used, outside)
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
