"""``%gpumem free NAME...``: let go of everything that keeps the named objects' GPU memory
alive, then measure what came back (``jupyter_gpumem.free``, the panel's *Free*).

1. Each place that keeps objects alive (the user's names, the output history, the kept
   traceback; from the front end's :class:`~.attribution.Workspace`) is walked alone, so
   each one's reach is known; hooks and closures on other objects are found from the named
   objects' referrers (``collectors/holders.py``), libraries' own lists by their types
   (``collectors/teardown.py``).
2. ``analysis/free_plan.py`` decides what is let go and what that should give back.
3. Unless a dry run: each reference is let go, then ``gc.collect()`` (reference cycles:
   accelerate's wrapped ``forward``, a Trainer's callbacks) and ``empty_cache()``, as the
   user asked; the driver's free memory (``cudaMemGetInfo``) is read before and after.
4. Blocks that were expected to go and did not are traced to what still holds them.

Reads and changes the namespace: call only on the shell thread while no cell runs.
"""

from __future__ import annotations

import gc
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

from ..analysis.free_plan import HolderWalk, Key, nothing_to_free, plan, unknown_name
from ..collectors.holders import Found, keepers
from ..collectors.namespace import Place, Root, collection_paused
from ..collectors.snapshot import read_snapshot
from ..collectors.teardown import (
    is_accelerator,
    is_vllm_engine,
    prepared,
    shared_by_accelerate,
    vllm_state_roots,
    vllm_teardown,
)
from ..collectors.torch_build import cuda_ready, imported_torch
from ..errors import ActionRefused
from ..model.free import FreeReport, Holder
from .attribution import Workspace, why_nothing

if TYPE_CHECKING:
    from ..collectors import Collector
    from .who import Who

Todo = list[Callable[[], None]]


class Step(NamedTuple):
    drop: Callable[[], None]
    detach: Callable[[], None] | None


class Frees:
    """The free service of one session."""

    def __init__(self, workspace: Workspace, collector: Collector, who: Who) -> None:
        self.workspace = workspace
        self.collector = collector
        self.who = who

    def free(self, names: Sequence[str], dry: bool = False) -> FreeReport:
        """Plan, and unless ``dry``, let go and measure. Raises ActionRefused with a
        sentence when there is nothing to do."""
        start = time.perf_counter()
        names = list(dict.fromkeys(n.strip() for n in names if n.strip()))
        if not names:
            raise ActionRefused("name what to free: %gpumem free NAME [NAME ...]")
        # A source of its own (recorded data) plans and plays it on its records.
        recorded = self.who.source.free(names, dry)
        if recorded is not None:
            return replace(recorded, elapsed=time.perf_counter() - start)
        for n in names:
            if self.workspace.place(n) is None:
                raise ActionRefused(_unknown(n, self.workspace))
        t = imported_torch()
        why = why_nothing(t)
        if why is not None:
            raise ActionRefused(why)
        if not cuda_ready(t):
            raise ActionRefused(
                "CUDA is not initialised in this kernel: PyTorch holds no GPU memory"
            )
        with collection_paused():
            report, freed, todo, alive = self._prepare(t, names)
        if dry:
            return replace(report, elapsed=time.perf_counter() - start)
        before = self.collector.measure(with_process=False, full=False)
        for step in todo:
            step()
        del step  # the last step's closure holds its place's object
        todo.clear()
        gc.collect()
        t.cuda.empty_cache()
        after = self.collector.measure(with_process=False, full=False)
        snap = read_snapshot(t)
        devices = []
        remaining: dict[int, set[int]] = {}
        for d in report.devices:
            b, a = before.device(d.device), after.device(d.device)
            live = set(snap.live_blocks(d.device)) if snap is not None else set()
            left = {addr for dev, addr in freed if dev == d.device} & live
            remaining[d.device] = left
            blocks = snap.live_blocks(d.device) if snap is not None else {}
            devices.append(
                replace(
                    d,
                    freed=_delta(b, a, "allocated"),
                    returned=_returned(b, a),
                    still_held=sum(blocks[x]["size"] for x in left),
                )
            )
        still = self._still(t, remaining, alive) if any(remaining.values()) else ()
        return replace(
            report,
            devices=tuple(devices),
            done=True,
            still=tuple(still),
            elapsed=time.perf_counter() - start,
        )

    # -- the plan -------------------------------------------------------------------------
    def _prepare(
        self, t: Any, names: list[str]
    ) -> tuple[FreeReport, set[Key], Todo, list[weakref.ref]]:
        ws = self.workspace
        targets: list[Place] = []
        for n in names:
            p = ws.place(n)
            if p is None:
                raise ActionRefused(_unknown(n, ws))
            targets.append(p)
        snap = read_snapshot(t)
        blocks = [(d, snap.live_blocks(d)) for d in snap.devices()] if snap is not None else []
        walker = self.who.walker(t)

        def walk(roots: Sequence[Root]) -> tuple:
            return tuple(walker.walk(roots, blocks).refs)

        places = {p.owner: p for p in ws.places(t.optim.Optimizer)}
        for p in targets:
            places[p.owner] = p  # Out[7] given by the user, or a name walked as itself
        target_ids = {id(p.obj): p.owner for p in targets if p.obj is not None}
        holders: list[HolderWalk] = []
        todo: Todo = []
        steps: dict[str, Step] = {}
        notes: list[str] = []
        for owner, p in places.items():
            obj = p.obj
            if obj is not None and is_accelerator(obj):
                for hold in prepared(obj, owner):
                    holders.append(
                        HolderWalk(
                            hold.label,
                            "library",
                            walk([Root(hold.label, hold.obj)]),
                            type_name=type(hold.obj).__name__,
                            code=hold.code,
                            why=hold.why,
                        )
                    )
                    steps[hold.label] = Step(hold.remove, None)
                skip = shared_by_accelerate(obj)
                roots = [
                    Root(owner, v, path=f"{owner}.{k}")
                    for k, v in vars(obj).items()
                    if id(v) not in skip
                ]
                refs = walk(roots)
            else:
                refs = walk(p.roots)
            holders.append(
                HolderWalk(
                    owner,
                    p.kind,  # type: ignore[arg-type]
                    refs,
                    type_name=type(obj).__name__ if obj is not None else "",
                    is_tensor=isinstance(obj, t.Tensor),
                    same_as=target_ids.get(id(obj), "") if owner not in names else "",
                    library=(type(obj).__module__ or "") if obj is not None else "",
                )
            )
            steps[owner] = _let_go(ws, p, obj, t)
            if owner in names and obj is not None and is_vllm_engine(obj):
                # vLLM's teardown also lets go of its module-level distributed state
                hold = vllm_teardown(obj, owner)
                label = "vllm.distributed.parallel_state"
                holders.append(
                    HolderWalk(
                        label,
                        "library",
                        walk(vllm_state_roots()),
                        why=hold.why,
                        code=hold.code,
                        goes_with=owner,
                    )
                )
                steps[label] = Step(hold.remove, None)
                notes.append(f"{owner}: {hold.why} ({hold.code})")
        holders += self._hooks(targets, places, holders, steps)
        report, freed = plan(names, holders, snap, notes)
        if report.held == 0 and not any(h.kind == "library" for h in holders) and not notes:
            raise ActionRefused(nothing_to_free(names))
        # the order: libraries and hooks first, then graphs, then the names themselves
        order = {"teardown": 0, "unhook": 0, "detach": 1, "release": 2, "forget": 3, "delete": 4}
        for lg in sorted(report.let_go, key=lambda x: order[x.action]):
            step = steps.get(lg.holder)
            if step is None:
                continue
            fn = step.detach if lg.action == "detach" else step.drop
            if fn is not None:
                todo.append(fn)
        alive = [_weak(p.obj) for p in targets]
        return report, freed, todo, [w for w in alive if w is not None]

    def _hooks(
        self,
        targets: list[Place],
        places: dict[str, Place],
        holders: list[HolderWalk],
        steps: dict[str, Step],
    ) -> list[HolderWalk]:
        """Hooks on other modules and functions in the namespace whose closures hold a
        named object."""
        ns = self.workspace.namespace()
        module_names = {id(p.obj): o for o, p in places.items() if p.obj is not None}
        by_owner = {h.owner: h for h in holders}
        out: list[HolderWalk] = []
        found: set[str] = set()
        for p in targets:
            if p.obj is None or p.owner not in by_owner:
                continue
            refs = by_owner[p.owner].refs
            for f in keepers(p.obj, {id(ns): "namespace"}, module_names, max_depth=6):
                if f.kind == "hook" and f.remove is not None and f.label not in steps:
                    out.append(HolderWalk(f.label, "hook", refs, code=f"del {f.label}", why=f.why))
                    steps[f.label] = Step(f.remove, None)
            for name, value in list(ns.items()):
                closure = getattr(value, "__closure__", None)
                # a function is a place of its own, but the walk does not look into
                # closures: the one that closes over the named object is a holder
                if closure and name not in found and _closes_over(closure, p.obj):
                    found.add(name)
                    out.append(
                        HolderWalk(
                            name,
                            "name",
                            refs,
                            type_name="function",
                            why=f"a function whose closure holds {p.owner}",
                        )
                    )
                    steps[name] = _let_go(
                        self.workspace, Place(name, "name", (Root(name, value),)), value, None
                    )
        return out

    # -- after ----------------------------------------------------------------------------
    def _still(
        self, t: Any, remaining: dict[int, set[int]], alive: list[weakref.ref]
    ) -> list[Holder]:
        """What still holds the blocks that were expected to go."""
        out: list[Holder] = []
        snap = read_snapshot(t)
        blocks = [(d, snap.live_blocks(d)) for d in snap.devices()] if snap is not None else []
        sizes = {(d, a): b["size"] for d, live in blocks for a, b in live.items()}
        left = {(d, a) for d, addrs in remaining.items() for a in addrs}
        walker = self.who.walker(t)
        named: set[Key] = set()
        for p in self.workspace.places(t.optim.Optimizer):
            refs = walker.walk(p.roots, blocks).refs
            keys = {(r.device, r.address) for r in refs} & left
            if keys:
                named |= keys
                ex = max((r for r in refs if (r.device, r.address) in keys), key=lambda r: r.nbytes)
                out.append(
                    Holder(
                        p.owner,
                        sum(sizes.get(k, 0) for k in keys),
                        ex.path,
                        "still reaches it",
                        f"del {p.owner}",
                    )
                )
        rest = left - named
        if not rest:
            return out
        found: list[Found] = []
        ns = self.workspace.namespace()
        for w in alive:
            obj = w()
            if obj is not None:
                found += keepers(obj, {id(ns): "namespace"})
        if not found:
            for obj in _tensors_on(t, rest):
                found += keepers(obj, {id(ns): "namespace"})
                if len(found) >= 5:
                    break
        nbytes = sum(sizes.get(k, 0) for k in rest)
        if found:
            for f in found[:5]:
                if f.kind in ("skip", "name"):
                    continue
                out.append(Holder(f.label, nbytes, "", f.why))
        if len(out) == 0 or not found:
            out.append(
                Holder(
                    "no Python object",
                    nbytes,
                    "",
                    "no object Python tracks holds it: a C/C++ extension, a CUDA graph's "
                    "pool, or a stream still using it; only a restart is sure to free it",
                )
            )
        return out


def _let_go(ws: Workspace, p: Place, obj: Any, t: Any) -> Step:
    """The steps that let ``p`` go: drop the reference, or (a tensor kept for its value)
    drop its autograd graph in place."""

    def drop() -> None:
        ws.let_go(p)

    if t is None or not isinstance(obj, t.Tensor):
        return Step(drop, None)
    ns: Any = ws.namespace()
    tensor: Any = obj

    def detach() -> None:
        try:
            tensor.detach_()
        except RuntimeError:  # a view: bind the name to a detached alias, same storage
            if ns.get(p.owner) is tensor:
                ns[p.owner] = tensor.detach()

    return Step(drop, detach)


def _closes_over(closure: tuple, obj: Any) -> bool:
    for cell in closure:
        try:
            if cell.cell_contents is obj:
                return True
        except ValueError:  # an empty cell
            continue
    return False


def _weak(obj: Any) -> weakref.ref | None:
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


def _tensors_on(t: Any, keys: set[Key]) -> list[Any]:
    """Python tensors whose storage is one of ``keys`` (largest blocks first, a few)."""
    out = []
    addresses = {a for _, a in keys}
    with warnings.catch_warnings():  # isinstance on deprecated torch objects warns
        warnings.simplefilter("ignore")
        objects = [o for o in gc.get_objects() if isinstance(o, t.Tensor)]
    for o in objects:
        if isinstance(o, t.Tensor):
            try:
                if o.is_cuda and o.untyped_storage().data_ptr() in addresses:
                    out.append(o)
            except Exception:
                continue
            if len(out) >= 5:
                break
    return out


def _delta(b: Any, a: Any, field: str) -> int | None:
    if b is None or a is None or b.allocator is None or a.allocator is None:
        return None
    return int(getattr(b.allocator, field) - getattr(a.allocator, field))


def _returned(b: Any, a: Any) -> int | None:
    """Driver-level bytes back: the device's used memory (cudaMemGetInfo) before - after."""
    if b is None or a is None or b.device_used is None or a.device_used is None:
        return None
    return int(b.device_used - a.device_used)


def _unknown(name: str, ws: Workspace) -> str:
    return unknown_name(name, [k for k, _ in ws.variables()])


__all__ = ["Frees"]
