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
"""

from __future__ import annotations

import gc
import time
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, itemgetter, methodcaller
from typing import Any

from ..model import Reference, Via

# Kinds of objects, decided once per type.
_SKIP, _TENSOR, _MODULE, _OPTIMIZER, _SEQ, _MAP, _OBJECT = range(7)
_TRAVERSABLE = frozenset({_MODULE, _OPTIMIZER, _SEQ, _MAP, _OBJECT})
_HAVE_GC = 1 << 14  # Py_TPFLAGS_HAVE_GC: the type lists its references (tp_traverse)

ATOMIC: frozenset[type] = frozenset(
    {
        int,
        float,
        complex,
        str,
        bytes,
        bytearray,
        bool,
        type(None),
        range,
        slice,
        memoryview,
        type(Ellipsis),
        type(NotImplemented),
    }
)

# Objects of these top-level packages are never walked into: they hold no user tensors, or
# hold the whole kernel (IPython's shell, its history), or are huge (numpy/pandas data).
SKIP_PACKAGES: frozenset[str] = frozenset(
    {
        "numpy",
        "pandas",
        "IPython",
        "ipykernel",
        "ipywidgets",
        "traitlets",
        "zmq",
        "tornado",
        "asyncio",
        "threading",
        "logging",
        "jupyter_client",
        "jupyter_core",
        "jupyter_gpumem",
        "matplotlib",
        "comm",
        "prompt_toolkit",
        "concurrent",
        "queue",
        "socket",
        "ssl",
        "io",
        "_io",
        "weakref",
        "abc",
        "typing",
        "enum",
        "re",
        "sre_constants",
    }
)

_FIXED_VIAS = ("output history", "traceback")

_SKIP_TYPES: tuple[type, ...] = (
    types.ModuleType,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.GeneratorType,
    types.CoroutineType,
    types.FrameType,
    types.TracebackType,
    types.CodeType,
    property,
    staticmethod,
    classmethod,
)


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


@dataclass(frozen=True, slots=True)
class Root:
    """Where a walk starts: a name and the object it is bound to."""

    owner: str  # how rows name it: "acts", "Out[7]", "traceback: f() h"
    obj: Any
    via: Via | None = None  # fixed for everything under it ("output history", "traceback")
    path: str | None = None  # the first path component (default: owner)


@dataclass(frozen=True, slots=True)
class Limits:
    max_objects: int = 200_000
    max_graph_nodes: int = 100_000
    max_depth: int = 12
    time_budget: float = 2.0  # seconds


@dataclass
class Walk:
    refs: list[Reference] = field(default_factory=list)
    visited: int = 0  # objects looked at
    graph_nodes: int = 0
    truncated: list[str] = field(default_factory=list)  # why the walk stopped early
    errors: int = 0  # objects whose attributes raised
    elapsed: float = 0.0


class TorchTensors:
    """What the walk needs to know about torch objects.

    ``include`` picks the tensors that count (default: on a CUDA/ROCm device); tests on
    machines without a GPU pass ``lambda t: True`` and get CPU tensors as device 0.
    """

    def __init__(self, torch: Any, include: Callable[[Any], bool] | None = None) -> None:
        self.torch = torch
        self.Tensor = torch.Tensor
        self.Module = torch.nn.Module
        self.Optimizer = torch.optim.Optimizer
        function = getattr(getattr(torch, "autograd", None), "function", None)
        self.BackwardCFunction = getattr(function, "BackwardCFunction", ())
        self.include = include if include is not None else _IS_CUDA
        self.cpu_as_device0 = include is not None

    def storages(self, t: Any) -> list[tuple[int, int, int]]:
        """(device, address, nbytes) of each storage a tensor uses (sparse ones have two or
        three); nothing for tensors without memory of their own (meta, fake, empty)."""
        try:
            s = t.untyped_storage()
        except Exception:
            return [x for part in _sparse_parts(t) for x in self.storages(part)]
        address, nbytes = s.data_ptr(), s.nbytes()
        if not address or not nbytes:
            return []
        index = t.get_device()
        return [(max(index, 0), address, nbytes)]


# On a CUDA/ROCm device (the caller's try catches a tensor whose attribute raises).
_IS_CUDA = attrgetter("is_cuda")
# A list of at least this many tensors is read with C loops (_plain_tensors).
_BULK = 16
_GRAD_FN, _GRAD = attrgetter("grad_fn"), attrgetter("grad")
_UNTYPED_STORAGE, _GET_DEVICE = methodcaller("untyped_storage"), methodcaller("get_device")
_DATA_PTR, _NBYTES = methodcaller("data_ptr"), methodcaller("nbytes")
_REQUESTED = itemgetter("requested_size")


def _sparse_parts(t: Any) -> list[Any]:
    for names in (
        ("_indices", "_values"),
        ("crow_indices", "col_indices", "values"),
        ("ccol_indices", "row_indices", "values"),
    ):
        try:
            return [getattr(t, n)() for n in names]
        except Exception:
            continue
    return []


class NamespaceWalker:
    def __init__(self, tensors: TorchTensors, limits: Limits | None = None) -> None:
        self.t = tensors
        self.limits = limits or Limits()
        self._kinds: dict[type, int] = {}
        self._saved_names: dict[type, tuple[str, ...]] = {}
        self._blocks: Sequence[tuple[int, Mapping[int, Mapping[str, Any]]]] = ()

    # -- classification -----------------------------------------------------------------
    def kind(self, tp: type) -> int:
        k = self._kinds.get(tp)
        if k is None:
            k = self._classify(tp)
            self._kinds[tp] = k
        return k

    def _classify(self, tp: type) -> int:
        t = self.t
        if tp in ATOMIC or issubclass(tp, _SKIP_TYPES):
            return _SKIP
        if issubclass(tp, t.Tensor):
            return _TENSOR
        if issubclass(tp, t.Module):
            return _MODULE
        if issubclass(tp, t.Optimizer):
            return _OPTIMIZER
        if issubclass(tp, dict):
            return _MAP
        if issubclass(tp, (list, tuple, set, frozenset, deque)):
            return _SEQ
        package = (getattr(tp, "__module__", "") or "").partition(".")[0]
        if package in SKIP_PACKAGES:
            return _SKIP
        if hasattr(tp, "__dict__") and "__dict__" in dir(tp):
            return _OBJECT
        return _SKIP

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

    def _known(self, addresses: list[int]) -> tuple[list[int], list[int]] | None:
        """Devices and sizes of storages that all start a known block of one device (a
        list of tensors made on one device, the common case), or None: then torch is
        asked."""
        for device, blocks in self._blocks:
            found: list[Any] = list(map(blocks.get, addresses))
            misses = found.count(None)
            if misses == 0:
                try:
                    return [device] * len(found), list(map(_REQUESTED, found))
                except (KeyError, TypeError):  # a recorded snapshot without the sizes
                    return None
            if misses < len(found):
                return None  # on several devices, or some not in a block: ask torch
        return None

    def _tensor_free(self, obj: Any, out: Walk) -> bool:
        """True when no tensor is reachable from ``obj`` within the walk's depth: then the
        walk below, which spells a path for every object, can be skipped.

        A level at a time through ``gc.get_referents`` (C), keeping what the walk would
        look into (containers, objects, modules, optimizers): a superset of the walk's
        edges (a dict's keys and values, a sequence's items, an object's ``__dict__`` and
        slots), so a tensor the walk would find is found here too; any doubt (a type
        without GC support, whose references can't be listed) says "not free". About 6x
        cheaper per object than the walk (no paths, no per-object Python in the common
        case). Shared objects are not told apart: the depth and the object cap bound the
        levels, and a structure past either is walked as before (which says so). Objects
        looked at here are not marked seen: they hold no tensors, so a later root loses
        nothing."""
        kind = self.kind
        get_referents, is_tracked = gc.get_referents, gc.is_tracked
        limits = self.limits
        level = [obj]
        looked = 0
        try:
            # Per level the work is done by C (map, set, get_referents) on whole lists;
            # Python touches each object only where a level mixes kinds and must be
            # filtered.
            for depth in range(limits.max_depth + 1):
                present = set(map(type, level))
                inner_types = set()
                for tp in present:
                    k = kind(tp)
                    if k == _TENSOR:
                        return False
                    if k in _TRAVERSABLE:
                        if not tp.__flags__ & _HAVE_GC:
                            return False  # its references can't be listed: walk it
                        inner_types.add(tp)
                if not inner_types:
                    return True
                if len(inner_types) < len(present):
                    if not any(tp.__flags__ & _HAVE_GC for tp in present - inner_types):
                        # The others are atomic (ints, strings): what the collector tracks
                        # is what we look into, less the containers it stopped tracking
                        # because they hold only atomic objects (no tensor). Twice as
                        # fast as filtering by type.
                        level = list(filter(is_tracked, level))
                    else:
                        # [o for o in level if type(o) in inner_types], in C
                        level = list(
                            compress(level, map(inner_types.__contains__, map(type, level)))
                        )
                looked += len(level)  # as the walk counts: what it looks into
                if depth == limits.max_depth or looked > limits.max_objects:
                    return False  # past a limit: the walk runs and says where it stopped
                level = get_referents(*level)
            return True
        finally:
            out.visited += looked

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
                if kind == _SKIP:
                    continue
                if kind == _TENSOR:
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
                    if kind == _SEQ:
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
                    elif kind == _MAP:
                        child_via = fixed_via or (via if via != "tensor" else "container")
                        for k, v in obj.items():
                            if type(v) not in atomic:
                                push((v, (path, "[k]", k), d, child_via))
                            if type(k) not in atomic:
                                push((k, (path, ".keys()", None), d, child_via))
                    elif kind == _OBJECT:
                        child_via = fixed_via or (via if via != "tensor" else "attribute")
                        for name, v in vars(obj).items():
                            if type(v) not in atomic:
                                push((v, (path, ".", name), d, child_via))
                    elif kind == _MODULE:
                        self._module(obj, path, d, fixed_via, stack)
                    else:  # _OPTIMIZER
                        self._optimizer(obj, path, d, fixed_via, stack)
                except Exception:
                    out.errors += 1  # a container or attribute that raises: skip it
        finally:
            out.visited = max(out.visited, visited)

    def _plain_tensors(
        self,
        items: Any,
        path: Path,
        via: Via,
        owner: str,
        order: int,
        out: Walk,
    ) -> bool:
        """A list of plain tensors (no gradient, no autograd graph: stored activations, a
        cache) recorded at once, with C loops (map, compress) in place of a Python step per
        tensor: the same references, in the order the walk would record them (it pops the
        last item first). Returns False, having recorded nothing, for anything else: the
        walk then takes the items one by one. The tensors are not marked seen: for a
        tensor, seen only spares a second look at its gradient and graph, which a plain
        tensor has not (every path to it is recorded either way)."""
        kinds = self._kinds
        for tp in set(map(type, items)):
            if kinds.get(tp) is None:
                self.kind(tp)
            if kinds[tp] != _TENSOR:
                return False
        n = len(items)
        try:
            if list(map(_GRAD_FN, items)).count(None) != n:
                return False  # a graph to walk
            # no grad_fn: every one is a leaf, whose .grad can be read without a warning
            if list(map(_GRAD, items)).count(None) != n:
                return False
            include = list(map(self.t.include, items))
            kept = list(compress(items, include))
            storages = list(map(_UNTYPED_STORAGE, kept))  # raises for sparse tensors
            addresses = list(map(_DATA_PTR, storages))
            known = self._known(addresses) if self._blocks else None
            if known is not None:
                devices, sizes = known
            else:
                sizes = list(map(_NBYTES, storages))
                devices = list(map(_GET_DEVICE, kept))
        except Exception:
            return False
        parent = spell(path)
        indices = list(compress(range(n), include))
        if not (all(addresses) and all(sizes)):  # storages without memory (meta, empty)
            has = [bool(a and b) for a, b in zip(addresses, sizes, strict=True)]
            indices, addresses, sizes, devices = (
                list(compress(column, has)) for column in (indices, addresses, sizes, devices)
            )
        if devices and min(devices) < 0:  # CPU tensors that count (tests): device 0
            devices = [max(0, d) for d in devices]
        # Reference records made by C loops (one Python step per tensor costs twice as
        # much; Reference._make is one too), in the walk's order: it pops the last first.
        paths = [f"{parent}[{i}]" for i in reversed(indices)]
        out.refs.extend(
            map(
                tuple.__new__,
                repeat(Reference),
                zip(
                    reversed(devices),
                    reversed(addresses),
                    reversed(sizes),
                    repeat(owner),
                    repeat(via),
                    paths,
                    repeat(order),
                ),
            )
        )
        return True

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


# A path from a root: its name, or (parent path, how, key), spelled out only when needed.
Path = Any


def spell(path: Path) -> str:
    """``acts[3]``, ``trainer.cache['a']``, ``opt.state[0]['exp_avg']``."""
    if type(path) is tuple and type(path[0]) is str:  # one hop from a root: most tensors
        parent, how, key = path
        if how == "[]":
            return f"{parent}[{key}]"
        if how == ".":
            return f"{parent}.{key}"
    parts: list[str] = []
    while isinstance(path, tuple):
        path, how, key = path
        if how == "[]" or how == ".state" or how == ".param_groups":
            parts.append(f"{how if how != '[]' else ''}[{key}]")
        elif how == "[k]":
            parts.append(f"[{_key(key)}]")
        elif how == ".":
            parts.append(f".{key}")
        elif how == "{}":
            parts.append("{…}")
        else:
            parts.append(how)
    parts.append(str(path))
    return "".join(reversed(parts))


def _key(k: Any) -> str:
    if isinstance(k, str):
        return repr(k) if len(k) <= 40 else repr(k[:37] + "...")
    if isinstance(k, (int, float, bool)) or k is None:
        return repr(k)
    return f"<{type(k).__name__}>"


def _once(out: Walk, reason: str) -> None:
    if reason not in out.truncated:
        out.truncated.append(reason)
