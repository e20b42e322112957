"""What the namespace walk makes of each type: the classifier, and what it knows of torch.

:class:`Classifier` decides once per type what the walk does with its objects (:data:`SKIP`
them, record a :data:`TENSOR`, look into a :data:`MODULE`'s parameters, buffers and
submodules, an :data:`OPTIMIZER`'s state, a sequence's items (:data:`SEQ`), a mapping's
keys and values (:data:`MAP`), an :data:`OBJECT`'s ``__dict__``) and keeps the decision
in a dict the walk's loop reads directly. :class:`TorchTensors` is what the walk needs of
torch: its classes, which tensors count, and the storages of a tensor. torch is never
imported here: the caller passes the module the user imported.
"""

from __future__ import annotations

import types
from collections import deque
from collections.abc import Callable
from operator import attrgetter
from typing import Any

# Kinds of objects, decided once per type.
SKIP, TENSOR, MODULE, OPTIMIZER, SEQ, MAP, OBJECT = range(7)
TRAVERSABLE = frozenset({MODULE, OPTIMIZER, SEQ, MAP, OBJECT})

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


class Classifier:
    """The per-type decision, cached: ``kind(type(obj))`` is one dict lookup after the
    first object of a type. The walker owns the cache (``_kinds``); its hot loop reads it
    directly and calls :meth:`kind` only for a type it has not seen."""

    t: TorchTensors
    _kinds: dict[type, int]

    def kind(self, tp: type) -> int:
        k = self._kinds.get(tp)
        if k is None:
            k = self._classify(tp)
            self._kinds[tp] = k
        return k

    def _classify(self, tp: type) -> int:
        t = self.t
        if tp in ATOMIC or issubclass(tp, _SKIP_TYPES):
            return SKIP
        if issubclass(tp, t.Tensor):
            return TENSOR
        if issubclass(tp, t.Module):
            return MODULE
        if issubclass(tp, t.Optimizer):
            return OPTIMIZER
        if issubclass(tp, dict):
            return MAP
        if issubclass(tp, (list, tuple, set, frozenset, deque)):
            return SEQ
        package = (getattr(tp, "__module__", "") or "").partition(".")[0]
        if package in SKIP_PACKAGES:
            return SKIP
        if hasattr(tp, "__dict__") and "__dict__" in dir(tp):
            return OBJECT
        return SKIP
