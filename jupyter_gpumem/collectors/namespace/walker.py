"""Which names hold GPU tensors: a bounded walk from roots (the user's variables, ``Out``,
the kept traceback's frames) to tensor storages.

It follows what users keep memory in: tensors, ``nn.Module`` parameters, buffers and
gradients, optimizer state, lists/tuples/dicts/sets and plain objects a few levels deep,
and the autograd graph a tensor keeps alive (``grad_fn``, ``next_functions`` and the saved
tensors each node exposes as ``_saved_*``: the classic ``total = total + loss`` leak keeps
every step's activations). It returns plain :class:`~jupyter_gpumem.model.Reference`
records; matching them with the allocator's blocks is ``analysis/who.py``'s job.

Bounded: each object is walked once, at most ``Limits.max_objects`` objects and
``max_graph_nodes`` autograd nodes, ``max_depth`` levels, and ``time_budget`` seconds; a
walk that stops early says why (``Walk.truncated``). Attribute access that raises, odd
``__getattr__``s and huge containers never break it. torch is never imported here: the
caller passes the module the user imported.

The walk is in :class:`NamespaceWalker`, made of three parts with a contract each: the
classifier (``kinds.py``: what each type is, decided once), the reachability pre-pass
(``reach.py``: roots from which no tensor is reachable are not walked) and the bulk path
(``bulk.py``: long lists of plain tensors recorded with C loops). Paths are spelled in
``paths.py``; what a walk starts from, its limits and what it returns are in ``walk.py``.
The parts are a pipeline: this module imports them, never the reverse.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from ...model import Reference, Via
from .bulk import BulkPath
from .kinds import (
    ATOMIC,
    MAP,
    MODULE,
    OBJECT,
    SEQ,
    SKIP,
    TENSOR,
    Classifier,
    TorchTensors,
)
from .paths import Path, spell
from .reach import ReachabilityPrepass
from .walk import Limits, Root, Walk

_FIXED_VIAS = ("output history", "traceback")


@contextmanager
def collection_paused() -> Iterator[None]:
    """Pause Python's automatic garbage collection while we read (a namespace walk, an
    allocator snapshot and its analysis make tens of thousands of small containers, and
    with torch loaded the collections they trigger cost ~10 ms a ``who``; one of the
    oldest generation scans a million objects, ~100 ms). It changes nothing the program
    computes: the collections are deferred to the next allocation after the pause, not
    skipped, and the collector is switched back on only if it was on (nested pauses and
    a user's own ``gc.disable()`` are left as they are)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# A list of at least this many tensors is read with C loops (_plain_tensors).
_BULK = 16


class NamespaceWalker(Classifier, ReachabilityPrepass, BulkPath):
    """Walks roots to the tensors they hold: :meth:`walk`."""

    def __init__(self, tensors: TorchTensors, limits: Limits | None = None) -> None:
        self.t = tensors
        self.limits = limits or Limits()
        self._kinds: dict[type, int] = {}
        self._saved_names: dict[type, tuple[str, ...]] = {}
        self._blocks: Sequence[tuple[int, Mapping[int, Mapping[str, Any]]]] = ()

    # -- the walk -----------------------------------------------------------------------
    def walk(
        self,
        roots: Iterable[Root],
        blocks: Sequence[tuple[int, Mapping[int, Mapping[str, Any]]]] = (),
    ) -> Walk:
        """The references from ``roots``. ``blocks``: per device, the allocator's live
        blocks by address (from a snapshot taken just before): a storage that starts a
        block takes its device and size from it (the block's ``requested_size``, which
        is the storage's size) instead of asking torch (two calls a tensor); any other
        storage is asked as without them. The references are the same either way."""
        out = Walk()
        start = time.perf_counter()
        deadline = start + self.limits.time_budget
        seen: set[int] = set()
        keep: list[Any] = []  # holds autograd node wrappers so their ids stay unique
        self._blocks = blocks
        try:
            with collection_paused():  # ~1 small tuple per object
                for order, root in enumerate(roots):
                    if self._out_of_budget(out, deadline):
                        break
                    if self._tensor_free(root.obj, out):
                        continue
                    self._walk_root(root, order, out, seen, keep, deadline)
        finally:
            self._blocks = ()
        out.elapsed = time.perf_counter() - start
        return out

    def _out_of_budget(self, out: Walk, deadline: float) -> bool:
        if out.visited >= self.limits.max_objects:
            _once(out, f"stopped after {self.limits.max_objects} objects")
            return True
        if time.perf_counter() > deadline:
            _once(out, f"stopped after {self.limits.time_budget:g} s")
            return True
        return False

    def _walk_root(
        self, root: Root, order: int, out: Walk, seen: set[int], keep: list[Any], deadline: float
    ) -> None:
        # The hot loop: locals only, and paths kept as (parent, how, key) tuples that are
        # spelled out only for the objects that turn out to be tensors.
        max_depth = self.limits.max_depth
        kinds = self._kinds
        classify = self.kind
        atomic = ATOMIC
        fixed_via = root.via
        stack: list[tuple[Any, Path, int, Via]] = [
            (root.obj, root.path or root.owner, 0, root.via or "tensor")
        ]
        pop, push = stack.pop, stack.append
        visited = out.visited
        try:
            while stack:
                obj, path, depth, via = pop()
                visited += 1
                if not visited & 1023:
                    out.visited = visited
                    if self._out_of_budget(out, deadline):
                        return
                tp = type(obj)
                kind = kinds.get(tp)
                if kind is None:
                    kind = classify(tp)
                if kind == SKIP:
                    continue
                if kind == TENSOR:
                    out.visited = visited
                    self._tensor(obj, path, via, root.owner, order, out, seen, keep, deadline)
                    continue
                oid = id(obj)
                if oid in seen:
                    continue
                seen.add(oid)
                if depth >= max_depth:
                    _once(out, f"did not look deeper than {max_depth} levels")
                    continue
                d = depth + 1
                try:
                    if kind == SEQ:
                        # How the owner holds it: the first hop decides (acts[3] is "in a
                        # container", trainer.cache['a'] an "object attribute"), unless a
                        # special hop (parameters, optimizer state, ...) came first.
                        child_via = fixed_via or (via if via != "tensor" else "container")
                        how = "[]" if isinstance(obj, (list, tuple, deque)) else "{}"
                        if (
                            how == "[]"
                            and len(obj) >= _BULK
                            and visited + len(obj) < self.limits.max_objects
                            and self._plain_tensors(obj, path, child_via, root.owner, order, out)
                        ):
                            visited += len(obj)
                            out.visited = visited
                            if self._out_of_budget(out, deadline):
                                return
                            continue
                        for i, item in enumerate(obj):
                            if type(item) not in atomic:
                                push((item, (path, how, i), d, child_via))
                    elif kind == MAP:
                        child_via = fixed_via or (via if via != "tensor" else "container")
                        for k, v in obj.items():
                            if type(v) not in atomic:
                                push((v, (path, "[k]", k), d, child_via))
                            if type(k) not in atomic:
                                push((k, (path, ".keys()", None), d, child_via))
                    elif kind == OBJECT:
                        child_via = fixed_via or (via if via != "tensor" else "attribute")
                        for name, v in vars(obj).items():
                            if type(v) not in atomic:
                                push((v, (path, ".", name), d, child_via))
                    elif kind == MODULE:
                        self._module(obj, path, d, fixed_via, stack)
                    else:  # OPTIMIZER
                        self._optimizer(obj, path, d, fixed_via, stack)
                except Exception:
                    out.errors += 1  # a container or attribute that raises: skip it
        finally:
            out.visited = max(out.visited, visited)

    def _module(self, m: Any, path: Path, d: int, fixed: str | None, stack: list) -> None:
        attrs = vars(m)
        for name, p in (attrs.get("_parameters") or {}).items():
            if p is not None:
                stack.append((p, (path, ".", name), d, fixed or "parameters"))
        for name, b in (attrs.get("_buffers") or {}).items():
            if b is not None:
                stack.append((b, (path, ".", name), d, fixed or "buffers"))
        for name, child in (attrs.get("_modules") or {}).items():
            if child is not None:
                stack.append((child, (path, ".", name), d, fixed))
        for name, v in attrs.items():
            # Plain attributes (cached masks, stored activations); not torch's own bookkeeping.
            if name.startswith("_") or type(v) in ATOMIC:
                continue
            stack.append((v, (path, ".", name), d, fixed or "attribute"))

    def _optimizer(self, opt: Any, path: Path, d: int, fixed: str | None, stack: list) -> None:
        state = getattr(opt, "state", None) or {}
        for i, (param, st) in enumerate(state.items()):
            here = (path, ".state", i)
            if isinstance(st, dict):
                for k, v in st.items():
                    if type(v) not in ATOMIC:
                        stack.append((v, (here, "[k]", k), d, fixed or "optimizer state"))
            stack.append((param, (here, ".", "param"), d, fixed or "optimizer params"))
        for g, group in enumerate(getattr(opt, "param_groups", None) or ()):
            params = group.get("params", ()) if isinstance(group, dict) else ()
            here = (path, ".param_groups", g)
            for i, p in enumerate(params):
                stack.append((p, (here, "[]", i), d, fixed or "optimizer params"))

    def _tensor(
        self,
        t: Any,
        path: Path,
        via: Via,
        owner: str,
        order: int,
        out: Walk,
        seen: set[int],
        keep: list[Any],
        deadline: float,
        nodes: list[Any] | None = None,
    ) -> None:
        """Record a tensor's storages; then its gradient and the autograd graph it keeps.
        Inside a graph walk (``nodes`` given) its ``grad_fn`` joins that walk."""
        tensors = self.t
        try:
            if tensors.include(t):
                try:  # a dense tensor, inline (10k tensors cost one call each less)
                    st = t.untyped_storage()
                    address = st.data_ptr()
                    hit = None
                    for known, blocks in self._blocks:
                        b = blocks.get(address)
                        if b is not None and "requested_size" in b:
                            hit = known, b["requested_size"]
                            break
                    if hit is not None:
                        device, nbytes = hit
                    else:
                        nbytes = st.nbytes()
                        device = t.get_device() if address and nbytes else -1
                    if address and nbytes:
                        out.refs.append(
                            Reference(
                                max(0, device),
                                address,
                                nbytes,
                                owner,
                                via,
                                spell(path),
                                order,
                            )
                        )
                except Exception:  # sparse: two or three storages
                    where = spell(path)
                    for device, address, nbytes in tensors.storages(t):
                        out.refs.append(
                            Reference(device, address, nbytes, owner, via, where, order)
                        )
            oid = id(t)
            if oid in seen:
                return
            seen.add(oid)
            grad = t.grad if t.is_leaf else None
            if grad is not None:
                gvia = via if via in _FIXED_VIAS or nodes is not None else "gradients"
                self._tensor(
                    grad, (path, ".", "grad"), gvia, owner, order, out, seen, keep, deadline
                )
            fn = t.grad_fn
        except Exception:
            out.errors += 1
            return
        if fn is None:
            return
        if nodes is not None:
            nodes.append(fn)
            return
        gvia = via if via in _FIXED_VIAS else "autograd graph"
        self._graph(fn, spell(path) + ".grad_fn", gvia, owner, order, out, seen, keep, deadline)

    def _graph(
        self,
        fn: Any,
        path: str,
        via: Via,
        owner: str,
        order: int,
        out: Walk,
        seen: set[int],
        keep: list[Any],
        deadline: float,
    ) -> None:
        nodes = [fn]
        while nodes:
            node = nodes.pop()
            nid = id(node)
            if nid in seen:
                continue
            seen.add(nid)
            keep.append(node)
            out.graph_nodes += 1
            if out.graph_nodes > self.limits.max_graph_nodes:
                _once(out, f"stopped after {self.limits.max_graph_nodes} autograd nodes")
                return
            if out.graph_nodes % 256 == 0 and time.perf_counter() > deadline:
                _once(out, f"stopped after {self.limits.time_budget:g} s")
                return
            where = f"{path}…{type(node).__name__}"
            for attr, saved in self._saved(node):
                self._tensor(
                    saved, f"{where}.{attr}", via, owner, order, out, seen, keep, deadline, nodes
                )
            try:
                nxt = node.next_functions
            except Exception:
                nxt = ()
            for child, _ in nxt:
                if child is None:
                    continue
                variable = getattr(child, "variable", None)  # AccumulateGrad: a leaf
                if variable is not None:
                    self._tensor(
                        variable,
                        f"{where}…leaf",
                        via,
                        owner,
                        order,
                        out,
                        seen,
                        keep,
                        deadline,
                        nodes,
                    )
                nodes.append(child)

    def _saved(self, node: Any) -> Iterator[tuple[str, Any]]:
        """(attribute, tensor) for each tensor an autograd node saved for backward."""
        tp = type(node)
        names = self._saved_names.get(tp)
        if names is None:
            try:
                names = tuple(n for n in dir(node) if n.startswith("_saved_"))
            except Exception:
                names = ()
            self._saved_names[tp] = names
        for n in names:
            try:
                v = getattr(node, n)
            except Exception:  # freed after backward(), or not a tensor we can unpack
                continue
            for t in self._tensors_in(v):
                yield n, t
        if self.t.BackwardCFunction and isinstance(node, self.t.BackwardCFunction):
            # custom autograd.Function: ctx.save_for_backward(...) and ctx.<attr> = tensor
            try:
                for t in self._tensors_in(node.saved_tensors):
                    yield "saved_tensors", t
            except Exception:
                pass
            try:
                for name, v in vars(node).items():
                    for t in self._tensors_in(v):
                        yield name, t
            except Exception:
                pass

    def _tensors_in(self, v: Any) -> Iterator[Any]:
        if isinstance(v, self.t.Tensor):
            yield v
        elif isinstance(v, (tuple, list)):
            for item in v:
                if isinstance(item, self.t.Tensor):
                    yield item


def _once(out: Walk, reason: str) -> None:
    if reason not in out.truncated:
        out.truncated.append(reason)
