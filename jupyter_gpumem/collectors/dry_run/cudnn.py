"""The workspace cuDNN gives a convolution, asked of cuDNN's own heuristics (its backend
API, through ctypes), as PyTorch asks them with ``torch.backends.cudnn.benchmark`` off
(``run_single_conv`` in aten/src/ATen/native/cudnn/Conv_v8.cpp): the engine configs of the
heuristics' instant mode, less those PyTorch filters out (inputs converted down; tensor
cores for float32 without TF32; nondeterministic ones when deterministic), the first whose
execution plan builds runs, and its plan's workspace is what PyTorch takes from its
caching allocator around the call; when none builds, the fallback list's.

Asking needs no device memory, but a cuDNN handle, which needs a CUDA context: the sizer
asks only where the process has one on that device already (the user's earlier cells, or
the context PyTorch's autograd makes when a dry run records a backward) and never makes
one. Each distinct call is asked once (about a millisecond). :func:`sizer` is the entry;
the plain records come from ``collectors/dry_run/conv.py``. torch is asked only whether
the context exists."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any

from ..torch_build import cuda_ready
from .conv_call import ConvCall, TensorDesc

# cudnn_graph.h (cuDNN 9)
_POINTWISE, _CONVOLUTION, _ENGINE, _ENGINECFG, _ENGINEHEUR, _PLAN = 0, 1, 2, 3, 4, 5
_OP = {"forward": 10, "backward filter": 11, "backward data": 12}
_OPGRAPH, _TENSOR = 15, 17
T_HANDLE, T_DATA_TYPE, T_BOOLEAN, T_INT64, T_FLOAT, T_DOUBLE = 0, 1, 2, 3, 4, 5
T_CONV_MODE, T_HEUR_MODE, T_NUMERICAL_NOTE, T_DESCRIPTOR = 7, 8, 11, 15
A_CONV = {
    "comp": 100,
    "mode": 101,
    "dilations": 102,
    "strides": 103,
    "post": 104,
    "pre": 105,
    "dims": 106,
}
A_HEUR_MODE, A_HEUR_GRAPH, A_HEUR_RESULTS = 200, 201, 202
A_CFG_ENGINE = 300
A_PLAN_HANDLE, A_PLAN_CONFIG, A_PLAN_WORKSPACE = 400, 401, 402
# the op's attributes: alpha, beta, conv desc, then x/w/y by role (cudnn_graph.h)
A_OP = {
    "forward": {"alpha": 700, "beta": 701, "conv": 702, "w": 703, "x": 704, "y": 705},
    "backward data": {"alpha": 706, "beta": 707, "conv": 708, "w": 709, "x": 710, "y": 711},
    "backward filter": {"alpha": 712, "beta": 713, "conv": 714, "w": 715, "x": 716, "y": 717},
}
A_GRAPH_HANDLE, A_GRAPH_OPS = 800, 801
A_TENSOR = {
    "alignment": 900,
    "data_type": 901,
    "dims": 902,
    "strides": 903,
    "uid": 906,
    "virtual": 907,
}
A_ENGINE_NOTES = 1303
HEUR_INSTANT, HEUR_FALLBACK = 0, 2
NOTE_TENSOR_CORE, NOTE_DOWN_CONVERT, NOTE_NONDETERMINISTIC = 0, 1, 4
_LIBRARIES = ("libcudnn.so.9", "libcudnn_graph.so.9", "libcudnn.so")


class CudnnError(RuntimeError):
    pass


def _load() -> Any:
    """cuDNN's library, the one torch loaded where it did (else from nvidia.cudnn)."""
    last: Exception | None = None
    for name in _LIBRARIES:
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            last = e
    try:
        import nvidia.cudnn

        folder = os.path.join(next(iter(nvidia.cudnn.__path__)), "lib")
        return ctypes.CDLL(os.path.join(folder, "libcudnn.so.9"))
    except Exception as e:  # no cuDNN here
        raise CudnnError(f"cuDNN's library was not found ({last or e})") from None


class Backend:
    """cuDNN's backend API: descriptors made, set, finalized and read."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        vp, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.cudnnBackendCreateDescriptor.argtypes = [ctypes.c_int, ctypes.POINTER(vp)]
        lib.cudnnBackendSetAttribute.argtypes = [vp, ctypes.c_int, ctypes.c_int, i64, vp]
        lib.cudnnBackendGetAttribute.argtypes = [
            vp, ctypes.c_int, ctypes.c_int, i64, ctypes.POINTER(i64), vp,
        ]  # fmt: skip
        lib.cudnnBackendFinalize.argtypes = [vp]
        lib.cudnnBackendDestroyDescriptor.argtypes = [vp]
        lib.cudnnCreate.argtypes = [ctypes.POINTER(vp)]
        self.made: list[int] = []

    def create(self, kind: int) -> ctypes.c_void_p:
        d = ctypes.c_void_p()
        self._check(self.lib.cudnnBackendCreateDescriptor(kind, ctypes.byref(d)), "create")
        self.made.append(d.value or 0)
        return d

    def set(self, d: Any, name: int, kind: int, values: Any, count: int = 1) -> None:
        """Set attribute ``name`` to ``values``, a ctypes object (a scalar or an array of
        ``count`` elements), passed by its address."""
        status = self.lib.cudnnBackendSetAttribute(d, name, kind, count, ctypes.addressof(values))
        self._check(status, f"set attribute {name}")

    def ints(self, d: Any, name: int, values: tuple[int, ...]) -> None:
        arr = (ctypes.c_int64 * len(values))(*values)
        self.set(d, name, T_INT64, arr, len(values))

    def enum(self, d: Any, name: int, kind: int, value: int) -> None:
        self.set(d, name, kind, ctypes.c_int32(value))

    def descs(self, d: Any, name: int, values: list[Any]) -> None:
        arr = (ctypes.c_void_p * len(values))(*[v.value for v in values])
        self.set(d, name, T_DESCRIPTOR, arr, len(values))

    def finalize(self, d: Any) -> int:
        return int(self.lib.cudnnBackendFinalize(d))

    def get_int(self, d: Any, name: int) -> int:
        out, n = ctypes.c_int64(), ctypes.c_int64()
        status = self.lib.cudnnBackendGetAttribute(
            d, name, T_INT64, 1, ctypes.byref(n), ctypes.addressof(out)
        )
        self._check(status, f"get attribute {name}")
        return int(out.value)

    def destroy_all(self) -> None:
        for d in self.made:
            self.lib.cudnnBackendDestroyDescriptor(ctypes.c_void_p(d))
        self.made = []

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise CudnnError(f"cuDNN status {status} at {what}")


class Heuristics:
    """One cuDNN handle on the current device, and the workspace of each convolution asked,
    remembered."""

    def __init__(self) -> None:
        self.api = Backend(_load())
        self.handle = ctypes.c_void_p()
        self.api._check(self.api.lib.cudnnCreate(ctypes.byref(self.handle)), "cudnnCreate")
        self.version = int(self.api.lib.cudnnGetVersion())
        self.sizes: dict[ConvCall, int | None] = {}

    def workspace(self, call: ConvCall) -> int | None:
        """Bytes of the workspace of the plan PyTorch would run; None when no plan builds."""
        if call not in self.sizes:
            try:
                self.sizes[call] = self._ask(call)
            finally:
                self.api.destroy_all()
        return self.sizes[call]

    def _tensor(self, t: TensorDesc, uid: str, data_type: int) -> Any:
        api = self.api
        d = api.create(_TENSOR)
        api.enum(d, A_TENSOR["data_type"], T_DATA_TYPE, data_type)
        api.ints(d, A_TENSOR["dims"], t.dims)
        api.ints(d, A_TENSOR["strides"], t.strides)
        api.ints(d, A_TENSOR["uid"], (ord(uid),))
        api.ints(d, A_TENSOR["alignment"], (t.alignment,))
        api.set(d, A_TENSOR["virtual"], T_BOOLEAN, ctypes.c_bool(False))
        api._check(api.finalize(d), "tensor")
        return d

    def _graph(self, call: ConvCall) -> Any:
        api = self.api
        conv = api.create(_CONVOLUTION)
        k = len(call.stride)
        api.enum(conv, A_CONV["comp"], T_DATA_TYPE, call.compute_type)
        api.enum(conv, A_CONV["mode"], T_CONV_MODE, 1)  # CUDNN_CROSS_CORRELATION
        api.ints(conv, A_CONV["dims"], (k,))
        api.ints(conv, A_CONV["dilations"], call.dilation)
        api.ints(conv, A_CONV["strides"], call.stride)
        api.ints(conv, A_CONV["pre"], call.padding)
        api.ints(conv, A_CONV["post"], call.padding)
        api._check(api.finalize(conv), "convolution descriptor")
        names = A_OP[call.op]
        op = api.create(_OP[call.op])
        api.descs(op, names["x"], [self._tensor(call.x, "x", call.data_type)])
        api.descs(op, names["w"], [self._tensor(call.w, "w", call.data_type)])
        api.descs(op, names["y"], [self._tensor(call.y, "y", call.data_type)])
        api.descs(op, names["conv"], [conv])
        if call.compute_type == 1:
            alpha, beta, kind = ctypes.c_double(1.0), ctypes.c_double(0.0), T_DOUBLE
        else:
            alpha, beta, kind = ctypes.c_float(1.0), ctypes.c_float(0.0), T_FLOAT  # type: ignore[assignment]
        api.set(op, names["alpha"], kind, alpha)
        api.set(op, names["beta"], kind, beta)
        api._check(api.finalize(op), "operation")
        graph = api.create(_OPGRAPH)
        api.set(graph, A_GRAPH_HANDLE, T_HANDLE, self.handle)
        api.descs(graph, A_GRAPH_OPS, [op])
        api._check(api.finalize(graph), "operation graph")
        return graph

    def _configs(self, graph: Any, mode: int) -> list[Any]:
        api = self.api
        heur = api.create(_ENGINEHEUR)
        api.descs(heur, A_HEUR_GRAPH, [graph])
        api.enum(heur, A_HEUR_MODE, T_HEUR_MODE, mode)
        if api.finalize(heur) != 0:
            return []
        count = ctypes.c_int64()
        get = api.lib.cudnnBackendGetAttribute
        get(heur, A_HEUR_RESULTS, T_DESCRIPTOR, 0, ctypes.byref(count), None)
        configs = [api.create(_ENGINECFG) for _ in range(count.value)]
        if not configs:
            return []
        arr = (ctypes.c_void_p * len(configs))(*[c.value for c in configs])
        got = ctypes.c_int64()
        status = get(
            heur,
            A_HEUR_RESULTS,
            T_DESCRIPTOR,
            len(configs),
            ctypes.byref(got),
            ctypes.addressof(arr),
        )
        api._check(status, "heuristics' results")
        return configs[: got.value]

    def _notes(self, config: Any) -> set[int]:
        api = self.api
        engine = api.create(_ENGINE)
        n = ctypes.c_int64()
        arr = (ctypes.c_void_p * 1)(engine.value)
        get = api.lib.cudnnBackendGetAttribute
        if get(config, A_CFG_ENGINE, T_DESCRIPTOR, 1, ctypes.byref(n), ctypes.addressof(arr)):
            return set()
        notes = (ctypes.c_int32 * 16)()
        if get(
            engine, A_ENGINE_NOTES, T_NUMERICAL_NOTE, 16, ctypes.byref(n), ctypes.addressof(notes)
        ):
            return set()
        return {int(notes[i]) for i in range(n.value)}

    def _keep(self, call: ConvCall, config: Any) -> bool:
        """PyTorch's ``filterEngineConfigs``."""
        notes = self._notes(config)
        if call.deterministic and NOTE_NONDETERMINISTIC in notes:
            return False
        if NOTE_DOWN_CONVERT in notes:
            return False
        return not (call.data_type == 0 and not call.allow_tf32 and NOTE_TENSOR_CORE in notes)

    def _ask(self, call: ConvCall) -> int | None:
        graph = self._graph(call)
        mode = 1 if os.environ.get("TORCH_CUDNN_USE_HEURISTIC_MODE_B") else HEUR_INSTANT
        for source in (mode, HEUR_FALLBACK):
            for config in self._configs(graph, source):
                if not self._keep(call, config):
                    continue
                plan = self.api.create(_PLAN)
                self.api.set(plan, A_PLAN_HANDLE, T_HANDLE, self.handle)
                self.api.descs(plan, A_PLAN_CONFIG, [config])
                if self.api.finalize(plan) != 0:
                    continue  # PyTorch goes on to the next config too
                return self.api.get_int(plan, A_PLAN_WORKSPACE)
        return None


_HEURISTICS: dict[int, Heuristics | CudnnError] = {}


def sizer(t: Any, device: int) -> tuple[Callable[[ConvCall], int | None] | None, str]:
    """The workspace of each call on ``device``, and where the figures come from; (None,
    why) where cuDNN cannot be asked without making a CUDA context, or at all."""
    try:
        current = int(t.cuda.current_device()) if cuda_ready(t) else 0
        if device != current:
            return None, f"cuDNN is asked on the current device only (device {current})"
        if not t._C._cuda_hasPrimaryContext(device):
            return None, (
                "no CUDA context in this process to ask cuDNN in (a dry run makes none; "
                "after a cell that used the GPU, or in a training step, there is one)"
            )
    except Exception as e:
        return None, f"cannot tell whether CUDA runs here ({e})"
    found = _HEURISTICS.get(device)
    if found is None:
        try:
            found = _HEURISTICS[device] = Heuristics()
        except (CudnnError, OSError, AttributeError) as e:
            found = _HEURISTICS[device] = CudnnError(str(e))
    if isinstance(found, CudnnError):
        return None, f"cuDNN could not be asked: {found}"
    v = found.version
    version = f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    return found.workspace, f"asked of cuDNN {version}'s heuristics on this GPU"
