"""A dry run: the user's code under PyTorch's ``FakeTensorMode``, every storage it
allocates and frees recorded in order, no device memory used and no kernel run.

How it sees the memory: a ``TorchDispatchMode`` above the fake mode looks at each op's
outputs; a storage it has not seen is a new allocation (its exact bytes, device, stream and
thread), and a weak reference on the storage's Python object records its death (PyTorch
keeps one Python object per storage while the storage lives). Views and in-place ops
return storages already seen: they allocate nothing. Storages of the user's real tensors
(converted to fake copies by the fake mode) existed before the run: they are inputs, not
allocations. ``analysis/caching_allocator.py`` turns the events into the caching
allocator's peaks.

What the fake kernels don't allocate, the record adds: cuBLAS's workspace, which PyTorch
takes from its caching allocator the first time a handle (one per device and thread) meets
a stream (see :data:`WORKSPACE_TABLE`). Scratch memory an op takes and returns inside its
kernel (cuDNN's convolution workspace, sorts) is not seen; the notes say when such ops ran.

A value read to the host (``.item()``, ``if loss > 0``, ``GradScaler``'s check for
infinities) has none in a dry run: the run goes on as if it were 0 (``False``), and a note
names the line (:meth:`_State.host_read`). What it cannot go on without stops the run,
with one plain line saying what and where: an output whose shape depends on values
(``nonzero``, boolean masks), an op without a fake kernel (custom ops, extensions).
``collectors/fake_patches.py`` lists what the run changes in torch while it runs (and puts
back) so that it takes the real run's path: foreach optimizers, moving a module with
``.cuda()`` / ``.to()``, tensors made from data on the GPU, bfloat16 autocast.

The user's objects are left as they were: the fake mode never writes real tensors, and
what the run binds in the objects it was given (gradients of real parameters, optimizer
state, module attributes) is put back afterwards, as are the random generators, grad mode
and the default dtype. torch is imported inside functions only.

CUDA: torch itself is never started and PyTorch's allocator is never asked (the fake
mode's warm-up tensor is skipped, see :func:`_no_warmup_tensor`). The driver may still
create a context: ``torch.tensor(data, device="cuda")`` does under the fake mode (a device
guard; seen on an H200 with torch 2.11, ``benchmarks/probes/probe_context_ops.py``), which
``fake_patches`` avoids by building such tensors on the CPU first; a note says so when a
context appears anyway.

What the peak is made of (:class:`Seen`, read by ``analysis/dry_breakdown.py``): while the
run runs, and only then, the hooks ``%%gpumem --breakdown`` uses (``collectors/step.py``)
watch it, with positions that are indices into the run's events instead of the
allocator's counters: global module forward hooks (the innermost module running at each
allocation, ``Alloc.module``; where the forward pass begins and ends), optimizer step
hooks (the parameters' gradients before each step, the optimizer state after it) and
autograd's saved-tensor hooks (the storages saved for backward: activations; the first
unpack marks the backward pass, a callback queued on the engine its end). Each claim names
a storage by its allocation's key, so a storage is never confused with another. The pack
hook keeps a saved output as a detached alias (the tensor itself would make a reference
cycle, which would delay its free to the garbage collector and change the events), a saved
input as it is, and its version; the unpack hook raises autograd's own error for a tensor
modified in place since, as the hooks switch that check off. Modules are named by the
variable the cell (or the namespace before it) binds their root to, else by the root's
class. A cell that switches saved-tensor hooks off
(``torch.autograd.graph.disable_saved_tensors_hooks``) runs again without them: its
activations are then temporaries.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import Any, Literal, NamedTuple

MiB = 1 << 20

StopKind = Literal[
    "value read",  # .item(), bool(), int(), .tolist(): a value the dry run does not have
    "dynamic shape",  # nonzero, boolean masks, unique: a shape that depends on values
    "no fake kernel",  # an op (custom, extension) the fake mode can't run
    "no cuda build",  # a CPU-only torch asked for a CUDA dry run
    "syntax",  # the cell does not compile
    "error",  # anything else the code raised
]
AllocKind = Literal["tensor", "cublas workspace", "cublaslt workspace"]


@dataclass(frozen=True, slots=True)
class Alloc:
    """One storage the run allocated: ``nbytes`` exactly as requested (the allocator's
    model rounds). ``thread`` numbers threads in the order they first allocated (0: the
    one that called :func:`record`; autograd's device threads come later)."""

    key: int
    nbytes: int
    device: int
    stream: int
    thread: int
    op: str  # the op that made it: "aten.mm.default"
    kind: AllocKind = "tensor"
    # the innermost module whose forward was running (an index into Seen.modules; -1: none,
    # or a thread other than the run's)
    module: int = -1


@dataclass(frozen=True, slots=True)
class Free:
    key: int


Event = Alloc | Free

PhaseName = Literal["forward", "backward", "backward done", "optimizer step", "other"]


class PhaseMark(NamedTuple):
    """The phase that begins after ``events[:at]`` (``backward done``: the backward pass
    that began last is over, its saved tensors are let go)."""

    at: int
    phase: PhaseName


class Saved(NamedTuple):
    """Autograd saved the storage allocated under ``key`` for backward, after
    ``events[:at]``, while ``module`` (an index into :attr:`Seen.modules`, -1: none) ran."""

    key: int
    at: int
    module: int


# what a storage can be claimed as, first wins (as model.planning.CATEGORIES orders them)
CLAIMS: tuple[str, ...] = ("parameters", "buffers", "gradients", "optimizer state")
_RANK: dict[str, int] = {c: i for i, c in enumerate(CLAIMS)}


@dataclass(slots=True)
class Seen:
    """What the breakdown's hooks saw during a dry run, beside its events: plain records,
    with positions that are indices into the run's events."""

    marks: list[PhaseMark] = field(default_factory=list)
    # allocation key -> what it was seen as: parameters, buffers, gradients, optimizer state
    # (a storage seen as two is the first of :data:`CLAIMS`)
    claims: dict[int, str] = field(default_factory=dict)
    saved: list[Saved] = field(default_factory=list)  # activations, in the order saved
    modules: list[str] = field(default_factory=list)  # qualified names, "model.h.3.attn"


class Events(list[Event]):
    """A run's events (a list of :data:`Event`) that carry the run's :class:`Seen`, so
    that whoever is handed the events (``core/dry_run.predict``) has it too."""

    __slots__ = ("seen",)

    def __init__(self, events: Iterable[Event] = (), seen: Seen | None = None) -> None:
        super().__init__(events)
        self.seen = seen


@dataclass(frozen=True, slots=True)
class Stopped:
    """Why the run stopped before its end: ``where`` is the user's line (``In[7] line 3``
    or ``train.py:42``), ``inside`` the innermost line outside torch when it is another
    (a library's: ``modeling_bert.py:1020``)."""

    kind: StopKind
    op: str | None
    message: str
    where: str | None = None
    inside: str | None = None

    @property
    def line(self) -> str:
        """The stop as one plain line."""
        at = f" at {self.where}" if self.where else ""
        if self.inside and self.inside != self.where:
            at += f" (in {self.inside})"
        return f"{self.message}{at}"


@dataclass(frozen=True, slots=True)
class Workspaces:
    """cuBLAS's workspaces: ``cublas`` bytes at the first cuBLAS call of each (device,
    thread, stream), then ``cublaslt`` more at the first cuBLASLt call (0: Lt shares
    cuBLAS's). ``lifetime``: ``cached`` (kept until the process ends; torch 2.11 as
    measured) or ``per_call`` (taken and given back around each call)."""

    cublas: int
    cublaslt: int
    source: str
    lifetime: Literal["cached", "per_call"] = "cached"


# cuBLAS's workspace by compute capability (major), with where each figure comes from.
# PyTorch asks its caching allocator for it in CublasHandlePool.cpp: ``getChosenWorkspaceSize``
# (CUBLAS_WORKSPACE_CONFIG, default ":4096:2:16:8" = 4096 KiB x 2 + 16 KiB x 8) and, for
# cuBLASLt, ``getCUDABlasLtWorkspaceSize`` (CUBLASLT_WORKSPACE_SIZE, default 1024 KiB).
_LT_DEFAULT = 1024 * 1024
_OLD_DEFAULT = 4096 * 1024 * 2 + 16 * 1024 * 8  # 8,519,680 B
WORKSPACE_TABLE: dict[int, Workspaces] = {
    9: Workspaces(
        32 * MiB,
        _LT_DEFAULT,
        "Hopper (H100, H200): 32 MiB + 1 MiB measured on an H200 with torch 2.11 "
        "(tests/fixtures/allocator_traces.json, mlp_adamw); PyTorch's "
        "parseChosenWorkspaceSize gives 32 MiB to compute capability 9.x",
    ),
    10: Workspaces(
        32 * MiB,
        _LT_DEFAULT,
        "Blackwell (10.x): 32 MiB in PyTorch's parseChosenWorkspaceSize since pytorch#175344 "
        f"(Feb 2026), {_OLD_DEFAULT:,} B before it; not measured",
    ),
    12: Workspaces(
        32 * MiB,
        _LT_DEFAULT,
        "Blackwell (12.x): 32 MiB in PyTorch's parseChosenWorkspaceSize since pytorch#175344 "
        f"(Feb 2026), {_OLD_DEFAULT:,} B before it; not measured",
    ),
}
OTHER_CARDS = Workspaces(
    _OLD_DEFAULT,
    _LT_DEFAULT,
    'PyTorch\'s default CUBLAS_WORKSPACE_CONFIG ":4096:2:16:8" for compute capability '
    "below 9 (8,519,680 B, as torch.cuda.memory_snapshot shows on such cards); not measured here",
)


def parse_workspace_config(value: str) -> int | None:
    """Bytes of a ``CUBLAS_WORKSPACE_CONFIG`` (":SIZE_KiB:COUNT" pairs, added up as PyTorch
    does), or None when PyTorch would not parse it either (it then keeps its default)."""
    pairs = re.findall(r":([0-9]+):([0-9]+)", value)
    if not pairs:
        return None
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


def cuda_workspaces(
    capability: tuple[int, int] | None, env: Mapping[str, str] | None = None
) -> Workspaces:
    """The workspaces PyTorch takes on a card of this compute capability (None: unknown,
    the pre-Hopper default), after the environment's ``CUBLAS_WORKSPACE_CONFIG`` and
    ``CUBLASLT_WORKSPACE_SIZE`` (KiB)."""
    env = os.environ if env is None else env
    base = WORKSPACE_TABLE.get(capability[0], OTHER_CARDS) if capability else OTHER_CARDS
    cublas, lt, source = base.cublas, base.cublaslt, base.source
    if capability is None:
        source = "card not known without starting CUDA: " + source
    config = env.get("CUBLAS_WORKSPACE_CONFIG")
    if config:
        parsed = parse_workspace_config(config)
        if parsed is not None:
            cublas, source = parsed, f"CUBLAS_WORKSPACE_CONFIG={config}"
    lt_env = env.get("CUBLASLT_WORKSPACE_SIZE", "").strip()
    if lt_env.isdigit():
        lt = int(lt_env) * 1024
        source += f"; CUBLASLT_WORKSPACE_SIZE={lt_env} KiB"
    return Workspaces(cublas, lt, source, base.lifetime)


@dataclass(slots=True)
class FakeRun:
    """What a dry run saw: its allocations and frees in order, what it could not see
    (``notes``, one line each), and why it stopped early (``error``)."""

    device_type: str
    events: list[Event] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: Stopped | None = None
    seconds: float = 0.0
    ops: int = 0  # ops the run dispatched
    input_bytes: int = 0  # storages of the user's real tensors the run read or wrote
    cuda_initialized: bool = False  # whether the run started CUDA (it should not)
    libraries: frozenset[str] = frozenset()  # "cudnn", "nccl": what its ops would load
    seen: Seen | None = None  # what the breakdown's hooks saw (None: they did not run)

    @property
    def peak(self) -> int:
        """The largest sum of live bytes (exact sizes: no allocator rounding)."""
        live: dict[int, int] = {}
        now = peak = 0
        for e in self.events:
            if isinstance(e, Alloc):
                live[e.key] = e.nbytes
                now += e.nbytes
                peak = max(peak, now)
            else:
                now -= live.pop(e.key, 0)
        return peak

    def live_at_end(self) -> list[Alloc]:
        """The allocations still alive when the run ended (what it leaves behind)."""
        freed = {e.key for e in self.events if isinstance(e, Free)}
        return [e for e in self.events if isinstance(e, Alloc) and e.key not in freed]


# Ops that call cuBLAS (matmul, linear and attention's math path decompose into these).
_CUBLAS_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "addr"}
    | {"linalg_solve_triangular", "triangular_solve"}
)
# Ops that always go through cuBLASLt; addmm does when its bias is a vector (below).
_CUBLASLT_OPS = frozenset(
    {"_addmm_activation", "_scaled_mm", "_scaled_mm_v2", "_int_mm", "_scaled_grouped_mm"}
)
# Ops whose kernels take scratch memory the fake kernels don't show.
_SCRATCH_OPS = {
    "convolution": "cuDNN's workspace for convolutions (it depends on the algorithm picked)",
    "convolution_backward": "cuDNN's workspace for convolutions (it depends on the algorithm)",
    "_cudnn_rnn": "cuDNN's workspace for RNNs",
    "_scaled_dot_product_cudnn_attention": "cuDNN attention's workspace",
}
# ops that load cuDNN (its handle and kernels sit beside PyTorch: core/dry_run.LIBRARIES)
_CUDNN_OPS = frozenset(
    {"convolution", "convolution_backward", "_cudnn_rnn", "_scaled_dot_product_cudnn_attention"}
)
# torch's own namespaces; an op from any other is a custom op or an extension's
_OWN_NAMESPACES = frozenset(
    {"aten", "prims", "prim", "profiler", "debugprims", "higher_order", "fsdp"}
)
_COLLECTIVES = frozenset({"c10d", "_c10d_functional", "_c10d_functional_autograd", "_dtensor"})


def _addmm_uses_lt(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """PyTorch's ``isInputCompliesAddmmCudaLt`` (aten/src/ATen/native/cuda/Blas.cpp), in
    short: beta 1, a vector bias as long as the output's columns, no dimension of 1."""
    try:
        bias, mat1, mat2 = args[0], args[1], args[2]
        beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
        return bool(
            beta == 1
            and (bias.dim() == 1 or bias.squeeze().dim() == 1)
            and bias.shape[-1] == mat2.shape[1]
            and str(mat1.dtype) in ("torch.float32", "torch.float16", "torch.bfloat16")
            and min(mat1.shape[0], mat1.shape[1], mat2.shape[0], mat2.shape[1]) > 1
        )
    except Exception:
        return False


def _tensors(out: Any, tensor_type: type) -> Iterator[Any]:
    if isinstance(out, tensor_type):
        yield out
    elif isinstance(out, (tuple, list)):
        for o in out:
            yield from _tensors(o, tensor_type)


class _State:
    """The recorder's bookkeeping, shared by the dispatch mode and the weak references'
    callbacks (which run in whichever thread drops a storage's last reference)."""

    def __init__(self, t: Any, fake_mode: Any, device_type: str, workspaces: Any) -> None:
        self.t = t
        self.fake_mode = fake_mode
        self.device_type = device_type
        self.workspaces = workspaces  # Workspaces | Callable[[int], Workspaces] | None
        self.events: list[Event] = []
        self.notes: list[str] = []
        self.recording = True
        self.ops = 0
        self.next_key = 0
        self.live: dict[int, tuple[int | None, int, Any]] = {}  # id(storage) -> key, bytes, ref
        self.threads: dict[int, int] = {threading.get_ident(): 0}
        self.handles: set[tuple[int, int, int, str]] = set()  # (device, thread, stream, lib)
        # id -> (a real tensor, its .grad, its fake copy: kept, as the fake mode's memo of
        # copies holds them weakly and would make a new copy, a new storage, at each op)
        self.real: dict[int, tuple[Any, Any, Any]] = {}
        self.input_bytes = 0
        self.failed: tuple[Any, BaseException] | None = None  # (op, what it raised)
        self.kinds: dict[Any, str] = {}  # op -> "cublas" / "cublaslt" / "addmm" / ""
        self.noted: set[str] = set()
        self.module_now = -1  # the innermost module running in the run's thread (_Watch)
        self.libraries: set[str] = set()  # "cudnn", "nccl": loaded by the ops that ran
        self.scalar_read = t.ops.aten._local_scalar_dense.default
        from torch.utils._python_dispatch import is_traceable_wrapper_subclass_type

        self.is_wrapper = is_traceable_wrapper_subclass_type
        self.wrappers: dict[type, bool] = {}
        from torch._subclasses.fake_tensor import DataDependentOutputException

        self.data_dependent = DataDependentOutputException
        self.reads = 0  # values read to the host (.item(), bool(), `if tensor`)
        self.read_at: dict[str, int] = {}  # where, in the user's code -> how many times
        self.cell_names: Callable[[str], int | None] | None = None
        from torch._subclasses.fake_tensor import FakeTensor

        self.fake_type = FakeTensor
        cuda = getattr(t, "cuda", None)
        self.cuda_streams = device_type == "cuda" and cuda is not None

    # -- storages ----------------------------------------------------------------------
    def _freed(self, sid: int, key: int | None, ref: Any) -> None:
        entry = self.live.get(sid)
        if entry is None or entry[2] is not ref:
            return  # a storage resized in place: its older size was freed then
        del self.live[sid]
        if key is not None and self.recording:
            self.events.append(Free(key))

    def _watch(self, st: Any, key: int | None, nbytes: int) -> None:
        sid = id(st)
        ref = weakref.ref(st, partial(self._callback, sid, key))
        self.live[sid] = (key, nbytes, ref)

    def _callback(self, sid: int, key: int | None, ref: Any) -> None:
        self._freed(sid, key, ref)

    def thread(self) -> int:
        ident = threading.get_ident()
        n = self.threads.get(ident)
        if n is None:
            n = self.threads[ident] = len(self.threads)
        return n

    def stream(self, device: int) -> int:
        if not self.cuda_streams or not self.t.cuda.is_initialized():
            return 0  # no CUDA context, so no stream but the default one
        return int(self.t.cuda.current_stream(device).stream_id)

    def alloc(self, nbytes: int, device: int, op: str, kind: AllocKind) -> int:
        self.next_key += 1
        key = self.next_key
        thread = self.thread()
        module = self.module_now if thread == 0 else -1
        stream = self.stream(device)
        self.events.append(Alloc(key, nbytes, device, stream, thread, op, kind, module))
        return key

    # -- inputs ------------------------------------------------------------------------
    def see_inputs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        """Real tensors among the op's arguments: their fake copies' storages existed before
        the run (no allocation), and their gradients are put back at the end."""
        Tensor, fake_type = self.t.Tensor, self.fake_type
        for a in (*args, *kwargs.values()):
            if isinstance(a, Tensor):
                if not isinstance(a, fake_type):
                    self._real_input(a)
            elif isinstance(a, (list, tuple)):
                for x in a:
                    if isinstance(x, Tensor) and not isinstance(x, fake_type):
                        self._real_input(x)

    def _real_input(self, x: Any) -> None:
        if id(x) in self.real:
            return
        grad = x.grad if x.is_leaf and x.requires_grad else None
        try:
            fake = self.fake_mode.from_tensor(x)
            st = fake.untyped_storage()
        except Exception:  # sparse, nested, subclasses: the fake mode will say
            self.real[id(x)] = (x, grad, None)
            return
        self.real[id(x)] = (x, grad, fake)
        if id(st) not in self.live:
            n = st.nbytes()
            if fake.device.type == self.device_type:
                self.input_bytes += n
            self._watch(st, None, n)

    # -- outputs -----------------------------------------------------------------------
    def see_outputs(self, func: Any, out: Any, args: tuple[Any, ...], kwargs: Any) -> None:
        op = None
        for x in _tensors(out, self.t.Tensor):
            if x.device.type != self.device_type:
                continue
            try:
                st = x.untyped_storage()
            except Exception:  # no storage (sparse, nested): nothing this can count
                continue
            entry = self.live.get(id(st))
            n = st.nbytes()
            if entry is not None:
                if entry[1] == n:
                    continue
                # resized in place (resize_, set_, out= of the wrong size): a new block
                if entry[0] is not None:
                    self.events.append(Free(entry[0]))
            if n == 0:  # the allocator is not asked for nothing
                self._watch(st, None, 0)
                continue
            if op is None:
                op = str(func)
            key = self.alloc(n, x.device.index or 0, op, "tensor")
            self._watch(st, key, n)
        kind = self.kinds.get(func)
        if kind is None:
            kind = self.kinds[func] = self._kind(func)
        if kind:
            self._library(func, kind, out, args, kwargs)

    def _kind(self, func: Any) -> str:
        name = func._opname if hasattr(func, "_opname") else str(func)
        namespace = getattr(func, "namespace", "aten")
        if namespace in _COLLECTIVES:
            return "collective"
        if namespace not in _OWN_NAMESPACES:
            return "custom"
        if name == "addmm":
            return "addmm"
        if name in _CUBLASLT_OPS:
            return "cublaslt"
        if name in _CUBLAS_OPS:
            return "cublas"
        if name in _SCRATCH_OPS:
            return "scratch"
        return ""

    def _library(self, func: Any, kind: str, out: Any, args: Any, kwargs: Any) -> None:
        if kind == "custom":
            if not any(x.device.type == self.device_type for x in _tensors(out, self.t.Tensor)):
                return  # a query (a version, a flag): nothing on the device
            self.note(
                f"custom:{func}",
                f"{func} (a custom op) ran its fake kernel: scratch memory its real kernel "
                "takes is not seen",
            )
            return
        if kind == "collective":
            self.libraries.add("nccl")
            self.note(
                "collective",
                f"collectives ran ({func}): NCCL's own buffers are outside PyTorch's "
                "allocator, counted beside it",
            )
            return
        if kind == "scratch":
            name = func._opname
            if name in _CUDNN_OPS:
                self.libraries.add("cudnn")
            self.note(f"scratch:{name}", f"not seen: {_SCRATCH_OPS[name]} ({func})")
            return
        if self.workspaces is None:
            return
        device = next((x.device for x in _tensors(out, self.t.Tensor)), None)
        if device is None or device.type != self.device_type:
            return
        index = device.index or 0
        ws = self.workspaces(index) if callable(self.workspaces) else self.workspaces
        libs = ["cublas"]
        if kind == "cublaslt" or (kind == "addmm" and _addmm_uses_lt(args, kwargs)):
            libs.append("cublaslt")  # the Lt handle is cuBLAS's: its workspace comes first
        thread, stream = self.thread(), self.stream(index)
        op = str(func)
        for lib in libs:
            nbytes = ws.cublas if lib == "cublas" else ws.cublaslt
            handle = (index, thread, stream, lib)
            if nbytes <= 0 or (ws.lifetime == "cached" and handle in self.handles):
                continue
            self.handles.add(handle)
            key = self.alloc(nbytes, index, op, f"{lib} workspace")  # type: ignore[arg-type]
            if ws.lifetime == "per_call":
                self.events.append(Free(key))
            when = "around each call" if ws.lifetime == "per_call" else "once per thread and stream"
            self.note(
                f"ws:{lib}",
                f"{'cuBLASLt' if lib == 'cublaslt' else 'cuBLAS'} workspace of {nbytes:,} B "
                f"added {when}, first at {op} ({ws.source})",
            )

    def wrapped(self, types: Any) -> bool:
        """Whether an op's tensor types include a wrapper subclass other than FakeTensor."""
        for ty in types:
            if ty is not self.fake_type:
                found = self.wrappers.get(ty)
                if found is None:
                    found = self.wrappers[ty] = bool(self.is_wrapper(ty))
                if found:
                    return True
        return False

    def resized(self, st: Any, nbytes: int) -> None:
        """A storage resized in place (``untyped_storage().resize_``: FSDP2 frees and
        re-allocates its unsharded parameters so): its block is freed, a new one made."""
        if not self.recording:
            return
        sid = id(st)
        entry = self.live.get(sid)
        if entry is not None and entry[0] is not None:
            self.events.append(Free(entry[0]))
        key = None
        try:
            device = st.device
        except Exception:
            return
        if nbytes > 0 and device.type == self.device_type:
            key = self.alloc(nbytes, device.index or 0, "UntypedStorage.resize_", "tensor")
        self._watch(st, key, nbytes)

    def host_read(self, x: Any) -> Any:
        """A value read to the host (``.item()``, ``bool()``, ``if tensor``): a dry run has
        none, so it goes on with zero (``False``), and says where. A loop that reads values
        for ever is stopped after :data:`MAX_HOST_READS` of them."""
        self.reads += 1
        if self.reads > MAX_HOST_READS:
            raise RuntimeError(
                f"the run read {MAX_HOST_READS:,} values to the host (each taken as 0): a loop "
                "that waits on a value never ends in a dry run"
            )
        where = _here(self.t, self.cell_names) or "?"
        if where not in self.read_at and len(self.read_at) < 8:
            self.notes.append(
                f"a value read to the host at {where} (.item(), bool(), `if tensor`): a dry "
                "run has no values; it went on as if it were 0 (False), so what depends on "
                "that value may differ from the real run"
            )
        self.read_at[where] = self.read_at.get(where, 0) + 1
        dtype = x.dtype
        if dtype == self.t.bool:
            return False
        if dtype.is_complex:
            return 0j
        return 0.0 if dtype.is_floating_point else 0

    def note(self, key: str, line: str) -> None:
        if key not in self.noted:
            self.noted.add(key)
            self.notes.append(line)

    def restore_grads(self) -> None:
        for x, grad, _ in self.real.values():
            if x.is_leaf and x.requires_grad and x.grad is not grad:
                x.grad = grad
        self.real.clear()


_RECORDER: Any = None


def _recorder_class() -> Any:
    """The dispatch mode's class, made on first use (its base class is torch's)."""
    global _RECORDER
    if _RECORDER is None:
        from torch.utils._python_dispatch import TorchDispatchMode

        class Recorder(TorchDispatchMode):
            def __init__(self, state: _State) -> None:
                super().__init__()
                self.state = state

            def __torch_dispatch__(
                self,
                func: Any,
                types: Any,
                args: tuple[Any, ...] = (),
                kwargs: dict[str, Any] | None = None,
            ) -> Any:
                state = self.state
                kwargs = kwargs or {}
                if state.wrapped(types):
                    # a tensor subclass that wraps others (DTensor): its own ops run on its
                    # local tensors and come back here at their real, sharded sizes
                    return NotImplemented
                state.ops += 1
                if func is state.scalar_read and args and isinstance(args[0], state.fake_type):
                    try:  # a constant the fake mode knows (AdamW's step count) it answers
                        return func(*args, **kwargs)
                    except state.data_dependent:
                        return state.host_read(args[0])
                state.see_inputs(args, kwargs)
                try:
                    out = func(*args, **kwargs)
                except Exception as e:
                    state.failed = (func, e)
                    raise
                state.see_outputs(func, out, args, kwargs)
                return out

        _RECORDER = Recorder
    return _RECORDER


# -- what the peak is made of ---------------------------------------------------------

INPLACE_ERROR = (
    "one of the variables needed for gradient computation has been modified by an inplace "
    "operation: saved at version {saved}, now at version {now}. (a dry run watches saved "
    "tensors with saved_tensors_hooks, which switch off autograd's own check; this is that "
    "check.)"
)


class _Watch:
    """The breakdown's hooks for one run (``start`` ... ``stop``, then ``finish`` before the
    user's objects are put back): claims, phase marks and module names into a :class:`Seen`.

    Modules and optimizers are held by weak references only: holding one would keep its
    storages alive past the point where the cell drops it, and change the events.
    ``names``: the namespace's (name, object) pairs, where roots get their names."""

    def __init__(
        self, state: _State, t: Any, names: Callable[[], Iterable[tuple[str, Any]]] | None
    ) -> None:
        self.state = state
        self.t = t
        self.names = names
        self.seen = Seen()
        self.thread = threading.get_ident()
        self.active = False
        self.in_backward = False
        self.stack: list[int] = []  # the running modules' indices, innermost last
        self.index: dict[int, tuple[int, Any]] = {}  # id(module) -> (index, weak ref)
        self.looked: set[int] = set()  # ids of the namespace's modules already named
        # roots named by their class: (weak ref, [(index, path below the root)])
        self.unnamed: list[tuple[Any, list[tuple[int, str]]]] = []
        self.roots: dict[int, Any] = {}  # id -> weak ref: modules run at the top
        self.optimizers: dict[int, Any] = {}  # id -> weak ref
        self.disabled: list[str] = []  # messages of disable_saved_tensors_hooks in the run
        self._handles: list[Any] = []
        self._hooks: Any = None
        self._disable: Any = None  # torch's _saved_tensors_hooks_disable, while wrapped
        self._sequence_nr: Callable[[], int] = getattr(
            t._C._autograd, "_get_sequence_nr", lambda: 1 << 62
        )  # the next autograd node's number in this thread (without it: detach always)

    # -- claims ---------------------------------------------------------------------
    def claim(self, x: Any, category: str) -> None:
        if x is None:
            return
        try:
            st = x.untyped_storage()
        except Exception:  # no storage (sparse, nested, subclasses)
            return
        entry = self.state.live.get(id(st))
        if entry is None or entry[0] is None:
            return  # a storage from before the run (the user's real tensors)
        key = entry[0]
        old = self.seen.claims.get(key)
        if old is None or _RANK[category] < _RANK[old]:
            self.seen.claims[key] = category

    def claim_module(self, m: Any) -> None:
        try:
            for p in m.parameters():
                self.claim(p, "parameters")
                self.claim(p.grad, "gradients")
            for b in m.buffers():
                self.claim(b, "buffers")
        except Exception:
            pass

    def claim_optimizer(self, opt: Any, state: bool = True) -> None:
        try:
            for group in opt.param_groups:
                for p in group["params"]:
                    self.claim(p, "parameters")
                    self.claim(p.grad, "gradients")
            if state:
                Tensor = self.t.Tensor
                for per_param in opt.state.values():
                    if isinstance(per_param, dict):
                        for v in per_param.values():
                            if isinstance(v, Tensor):
                                self.claim(v, "optimizer state")
        except Exception:
            pass

    def mark(self, phase: PhaseName) -> None:
        self.seen.marks.append(PhaseMark(len(self.state.events), phase))

    # -- module names -----------------------------------------------------------------
    def _register(self, module: Any, name: str) -> list[tuple[int, str]]:
        """Index ``module`` and its submodules not yet indexed, under ``name``."""
        added: list[tuple[int, str]] = []
        try:
            members = list(module.named_modules())
        except Exception:
            members = [("", module)]
        modules, index = self.seen.modules, self.index
        for sub, child in members:
            entry = index.get(id(child))
            if entry is not None and entry[1]() is child:
                continue
            i = len(modules)
            modules.append(f"{name}.{sub}" if sub else name)
            index[id(child)] = (i, weakref.ref(child))
            added.append((i, sub))
        return added

    def _from_namespace(self) -> None:
        """Name the namespace's modules not named yet (their submodules with them)."""
        if self.names is None:
            return
        Module = self.t.nn.Module
        try:
            pairs = list(self.names())
        except Exception:
            return
        for name, obj in pairs:
            if id(obj) not in self.looked and isinstance(obj, Module):
                self.looked.add(id(obj))
                self._register(obj, name)

    def _new(self, module: Any) -> int:
        self._from_namespace()
        entry = self.index.get(id(module))
        if entry is not None and entry[1]() is module:
            return entry[0]
        added = self._register(module, type(module).__name__)
        if not self.stack and added:
            self.unnamed.append((weakref.ref(module), added))
        return self.index[id(module)][0]

    # -- hooks ------------------------------------------------------------------------
    def pre(self, module: Any, args: Any) -> None:
        if threading.get_ident() != self.thread:
            return  # DataParallel replicas, recomputation in backward threads
        entry = self.index.get(id(module))
        if entry is not None and entry[1]() is module:
            i = entry[0]
        else:
            try:
                i = self._new(module)
            except Exception:  # a module that can't be named (no weak references): none
                i = -1
        if not self.stack:
            if not self.in_backward:
                self.mark("forward")
            ref = self.roots.get(id(module))
            if ref is None or ref() is not module:
                with contextlib.suppress(TypeError):
                    self.roots[id(module)] = weakref.ref(module)
            self.claim_module(module)  # its parameters now (also after .to(), .half())
        self.stack.append(i)
        self.state.module_now = i

    def post(self, module: Any, args: Any, output: Any) -> None:
        if threading.get_ident() != self.thread or not self.stack:
            return
        stack = self.stack
        stack.pop()
        self.state.module_now = stack[-1] if stack else -1
        if not stack and not self.in_backward:
            self.mark("other")

    def opt_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.mark("optimizer step")
        ref = self.optimizers.get(id(opt))
        if ref is None or ref() is not opt:
            with contextlib.suppress(TypeError):
                self.optimizers[id(opt)] = weakref.ref(opt)
        self.claim_optimizer(opt, state=False)  # the gradients the backward pass made

    def opt_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.claim_optimizer(opt)  # and the state the step made
        self.mark("other")

    def pack(self, x: Any) -> Any:
        if self.active:
            try:
                entry = self.state.live.get(id(x.untyped_storage()))
                if entry is not None and entry[0] is not None:
                    here = threading.get_ident() == self.thread
                    module = self.state.module_now if here else -1
                    self.seen.saved.append(Saved(entry[0], len(self.state.events), module))
            except Exception:
                pass
        # A saved output (its grad_fn is the node saving it, the newest one of this thread)
        # would make a reference cycle: keep a detached alias of it. A saved input can be
        # kept as it is (a detach costs ~70 us under the fake mode; most saved are inputs).
        fn = x.grad_fn
        if fn is not None and fn._sequence_nr() >= self._sequence_nr() - 1:
            return (x.detach(), x._version)
        return (x, x._version)

    def unpack(self, packed: Any) -> Any:
        alias, version = packed
        if alias._version != version:
            raise RuntimeError(INPLACE_ERROR.format(saved=version, now=alias._version))
        if self.active and not self.in_backward:
            try:
                self.t.autograd.Variable._execution_engine.queue_callback(self._backward_done)
            except Exception:  # not inside a backward pass after all
                return alias
            self.in_backward = True
            self.mark("backward")
        return alias

    def _backward_done(self) -> None:
        self.in_backward = False
        if self.active:
            self.mark("backward done")

    def _disable_wrapper(self, message: Any, *args: Any, **kwargs: Any) -> Any:
        self.disabled.append(str(message))
        return self._disable(message, *args, **kwargs)

    def refused(self, e: BaseException) -> bool:
        """Whether ``e`` is the run switching saved-tensor hooks off while these were on."""
        text = str(e)
        return bool(self.disabled) and any(m and m in text for m in self.disabled)

    # -- start / stop -------------------------------------------------------------------
    def start(self) -> None:
        t = self.t
        modules = importlib.import_module("torch.nn.modules.module")
        optim = importlib.import_module("torch.optim.optimizer")
        self.active = True
        try:
            self._handles = [
                modules.register_module_forward_pre_hook(self.pre),
                modules.register_module_forward_hook(self.post, always_call=True),
                optim.register_optimizer_step_pre_hook(self.opt_pre),
                optim.register_optimizer_step_post_hook(self.opt_post),
            ]
            autograd_c = t._C._autograd
            self._disable = getattr(autograd_c, "_saved_tensors_hooks_disable", None)
            if self._disable is not None:
                autograd_c._saved_tensors_hooks_disable = self._disable_wrapper
            hooks = t.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
            hooks.__enter__()
            self._hooks = hooks
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Remove every hook (safe to call twice)."""
        self.active = False
        self.in_backward = False
        self.state.module_now = -1
        self.stack.clear()
        try:
            if self._hooks is not None:
                self._hooks.__exit__(None, None, None)
                self._hooks = None
        finally:
            for h in self._handles:
                h.remove()
            self._handles = []
            if self._disable is not None:
                self.t._C._autograd._saved_tensors_hooks_disable = self._disable
                self._disable = None

    def finish(self) -> Seen:
        """The claims at the end (what the run leaves: gradients, parameters and state of
        the modules and optimizers it ran or bound), the names roots were bound to."""
        for ref in list(self.roots.values()):
            m = ref()
            if m is not None:
                self.claim_module(m)
        for ref in list(self.optimizers.values()):
            opt = ref()
            if opt is not None:
                self.claim_optimizer(opt)
        bound: dict[int, str] = {}
        if self.names is not None:
            Module, Optimizer = self.t.nn.Module, self.t.optim.Optimizer
            try:
                pairs = list(self.names())
            except Exception:
                pairs = []
            for name, obj in pairs:
                if isinstance(obj, Module):
                    bound.setdefault(id(obj), name)
                    self.claim_module(obj)
                elif isinstance(obj, Optimizer):
                    self.claim_optimizer(obj)
        modules = self.seen.modules
        for ref, added in self.unnamed:
            m = ref()
            root = bound.get(id(m)) if m is not None else None
            if root:
                for i, sub in added:
                    modules[i] = f"{root}.{sub}" if sub else root
        self.roots.clear()
        self.optimizers.clear()
        self.index.clear()
        self.unnamed.clear()
        return self.seen


# -- the user's objects ---------------------------------------------------------------


class _Keep:
    """What the run could bind inside the objects it was given, put back afterwards:
    objects' attributes, the contents of dicts, lists and sets, every submodule's
    parameters, buffers and attributes, an optimizer's state and param groups. Tensors are
    not entered (the fake mode never writes real tensors); the walk goes ``depth`` levels
    into plain objects and containers and stops after ``limit`` of them, so a huge data set
    is not copied."""

    def __init__(
        self, t: Any, roots: Iterable[object], depth: int = 3, limit: int = 20_000
    ) -> None:
        self.saved: list[tuple[Any, Any]] = []
        self.requires_grad: list[tuple[Any, bool]] = []  # parameters of the modules
        seen: set[int] = set()
        Tensor, Module, Optimizer = t.Tensor, t.nn.Module, t.optim.Optimizer
        leaves = (Tensor, type, type(sys), str, bytes, int, float, complex, bool)
        stack: list[tuple[object, int]] = [(r, 0) for r in roots]
        while stack and len(self.saved) < limit:
            obj, level = stack.pop()
            if id(obj) in seen or isinstance(obj, leaves):
                continue
            seen.add(id(obj))
            children: Iterable[object] = ()
            if isinstance(obj, Module):
                for m in obj.modules():
                    seen.add(id(m))
                    own = (m._parameters, m._buffers, m._modules)
                    for d in (m.__dict__, *own):
                        self._save(d)
                    for p in m._parameters.values():
                        if p is not None:
                            self.requires_grad.append((p, bool(p.requires_grad)))
                    attrs = [v for v in m.__dict__.values() if not any(v is d for d in own)]
                    stack.extend((v, level + 1) for v in attrs if not isinstance(v, Module))
                continue
            if isinstance(obj, Optimizer):
                self._save(obj.__dict__)
                self._save(obj.state)
                for per_param in obj.state.values():
                    if isinstance(per_param, dict):
                        self._save(per_param)
                self._save(obj.param_groups)
                for group in obj.param_groups:
                    self._save(group)
                continue
            if isinstance(obj, (dict, list, set)):
                self._save(obj)
                children = obj.values() if isinstance(obj, dict) else obj
            elif isinstance(obj, tuple):
                children = obj
            else:
                d = getattr(obj, "__dict__", None)
                if isinstance(d, dict):
                    self._save(d)
                    children = d.values()
            if level < depth and not isinstance(obj, set):
                for n, c in enumerate(children):
                    if n >= limit:
                        break
                    stack.append((c, level + 1))

    def _save(self, container: Any) -> None:
        if isinstance(container, dict):
            self.saved.append((container, dict(container)))
        elif isinstance(container, list):
            self.saved.append((container, list(container)))
        elif isinstance(container, set):
            self.saved.append((container, set(container)))

    def restore(self) -> int:
        """Put back what changed; how many containers (and parameters) had changed."""
        changed = 0
        for p, requires_grad in self.requires_grad:
            if p.requires_grad != requires_grad:
                p.requires_grad_(requires_grad)
                changed += 1
        for target, saved in self.saved:
            if isinstance(target, dict):
                if len(target) == len(saved) and all(
                    k in target and target[k] is v for k, v in saved.items()
                ):
                    continue
                target.clear()
                target.update(saved)
            elif isinstance(target, list):
                if len(target) == len(saved) and all(
                    a is b for a, b in zip(target, saved, strict=True)
                ):
                    continue
                target[:] = saved
            else:
                if target == saved:
                    continue
                target.clear()
                target.update(saved)
            changed += 1
        return changed


# -- where and why it stopped ---------------------------------------------------------


def _torch_dir(t: Any) -> str:
    return os.path.dirname(t.__file__) + os.sep


def _own_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _library_dirs() -> tuple[str, ...]:
    import sysconfig

    dirs = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(sorted(os.path.abspath(d) + os.sep for d in dirs if d))


def _locate(
    tb: TracebackType | None, t: Any, cell_names: Callable[[str], int | None] | None
) -> tuple[str | None, str | None]:
    """(the user's line, the innermost line outside torch) of a traceback."""
    skip = (_torch_dir(t), _own_dir())
    libraries = _library_dirs()
    where = inside = None
    cell = None
    for frame, line in traceback.walk_tb(tb):
        filename = frame.f_code.co_filename
        absolute = os.path.abspath(filename)
        if absolute.startswith(skip) or filename.startswith("<frozen"):
            continue
        count = cell_names(filename) if cell_names is not None else None
        label = f"In[{count}] line {line}" if count is not None else None
        if label is None:
            label = f"{os.path.basename(filename)}:{line}"
        inside = label
        if count is not None:
            cell = label
        elif not absolute.startswith(libraries) or filename.startswith("<"):
            where = label
    return (cell or where or inside), inside


MAX_HOST_READS = 100_000  # a dry run's reads of values before it stops (see host_read)


def _here(t: Any, cell_names: Callable[[str], int | None] | None) -> str | None:
    """The user's line that is running now (as :func:`_locate` names it)."""
    skip = (_torch_dir(t), _own_dir())
    libraries = _library_dirs()
    frame = sys._getframe(1)
    inside = None
    while frame is not None:
        filename = frame.f_code.co_filename
        absolute = os.path.abspath(filename)
        if not (absolute.startswith(skip) or filename.startswith("<frozen")):
            count = cell_names(filename) if cell_names is not None else None
            if count is not None:
                return f"In[{count}] line {frame.f_lineno}"
            label = f"{os.path.basename(filename)}:{frame.f_lineno}"
            if inside is None:
                inside = label
            if not absolute.startswith(libraries) or filename.startswith("<"):
                return label
        frame = frame.f_back  # type: ignore[assignment]
    return inside


def _caused(e: BaseException | None, by: BaseException) -> bool:
    """Whether ``e`` is ``by`` or was raised while handling it."""
    for _ in range(8):
        if e is None:
            return False
        if e is by:
            return True
        e = e.__cause__ or e.__context__
    return False


def _describe(e: BaseException, op: Any, t: Any) -> tuple[StopKind, str | None, str]:
    from torch._subclasses import fake_tensor as ft

    func = getattr(e, "func", None) or op
    name = str(func) if func is not None else None
    if isinstance(e, ft.DataDependentOutputException):
        if name and "_local_scalar_dense" in name:
            text = (
                "a tensor's value is read (.item(), .tolist(), bool(), int(), float(), "
                f"`if tensor`: {name}): a dry run has no values"
            )
            return "value read", name, text
        return "value read", name, f"{name}'s output depends on the tensor's values"
    if isinstance(e, ft.DynamicOutputShapeException):
        text = (
            f"{name}'s output size depends on the tensor's values (nonzero, boolean masks, "
            "unique): a dry run can't size it"
        )
        return "dynamic shape", name, text
    if isinstance(e, ft.UnsupportedOperatorException) or "no fake impl registered" in str(e):
        if name and name.startswith(("aten.", "prims.")):
            text = f"{name} has no fake kernel in this torch: a dry run can't run it"
        else:
            text = (
                f"{name} has no fake kernel (a custom op or extension without "
                "torch.library.register_fake): a dry run can't run it"
            )
        return "no fake kernel", name, text
    first = next((s for s in str(e).splitlines() if s.strip()), "")
    if len(first) > 200:
        first = first[:199] + "…"
    text = f"{type(e).__name__}: {first}" if first else type(e).__name__
    if name:
        text += f" (in {name})"
    return "error", name, text


def _capability(t: Any, index: int) -> tuple[int, int] | None:
    """A card's compute capability without starting CUDA: torch's when CUDA is running,
    else the driver's through NVML; None when neither can tell."""
    try:
        if t.cuda.is_initialized():
            major, minor = t.cuda.get_device_capability(index)
            return int(major), int(minor)
    except Exception:
        return None
    try:
        from .nvml import Nvml

        nvml = Nvml()
        n = nvml.nvml_index(index)
        if n is None:
            return None
        major, minor = nvml._nvml.nvmlDeviceGetCudaComputeCapability(nvml._handle(n))
        return int(major), int(minor)
    except Exception:
        return None


class _Switches:
    """torch's global state a cell can change in a line: the random generators' states
    (``torch.manual_seed``), grad mode (``torch.set_grad_enabled``), the default dtype."""

    def __init__(self, t: Any) -> None:
        self.t = t
        self.rng = t.random.get_rng_state()
        # CUDA's generators only when CUDA runs: reading them would start it
        self.cuda_rng = t.cuda.get_rng_state_all() if t.cuda.is_initialized() else None
        self.grad = t.is_grad_enabled()
        self.dtype = t.get_default_dtype()

    def restore(self) -> None:
        t = self.t
        t.random.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            t.cuda.set_rng_state_all(self.cuda_rng)
        t.set_grad_enabled(self.grad)
        t.set_default_dtype(self.dtype)


@contextlib.contextmanager
def _no_warmup_tensor() -> Iterator[None]:
    """Without torch's warm-up: the fake mode makes one real ``torch.empty(1)`` on a GPU
    the first time it makes a fake tensor there (``init_gpu_context``, for pytorch#92627),
    which starts CUDA, creates a context and reserves a 2 MiB segment. Checked on an H200
    with torch 2.11: without it, forward, backward and an AdamW step of fake CUDA tensors
    run and CUDA stays uninitialised."""
    from torch._subclasses import fake_tensor

    module: Any = fake_tensor
    original = getattr(module, "init_gpu_context", None)
    if original is None:
        yield
        return
    module.init_gpu_context = _skip_warmup
    try:
        yield
    finally:
        module.init_gpu_context = original


def _skip_warmup(device: Any) -> None:
    return None


@contextlib.contextmanager
def _storage_resizes(t: Any, state: _State) -> Iterator[None]:
    """``UntypedStorage.resize_`` seen while the run records (it is no dispatched op)."""
    cls = t.UntypedStorage
    original = cls.resize_

    def resize_(self: Any, size: int) -> Any:
        out = original(self, size)
        if isinstance(size, int):
            try:
                state.resized(self, size)
            except Exception:
                pass
        return out

    cls.resize_ = resize_
    try:
        yield
    finally:
        cls.resize_ = original


def _contexts(t: Any) -> set[int]:
    """The devices that have a CUDA context (asked of the driver: creates none)."""
    has = getattr(t._C, "_cuda_hasPrimaryContext", None)
    if has is None or t.version.cuda is None:
        return set()
    try:
        return {i for i in range(t.cuda.device_count()) if has(i)}
    except Exception:
        return set()


# -- the entry points -----------------------------------------------------------------


def record(
    run: Callable[[], object],
    *,
    device_type: str = "cuda",
    workspaces: Workspaces | None = None,
    keep: Iterable[object] = (),
    cell_names: Callable[[str], int | None] | None = None,
    names: Callable[[], Iterable[tuple[str, Any]]] | None = None,
    breakdown: bool = True,
) -> FakeRun:
    """Run ``run()`` under ``FakeTensorMode`` and record every storage it allocates on
    ``device_type`` and when each dies.

    ``workspaces``: cuBLAS's (None: for CUDA, from :data:`WORKSPACE_TABLE` by the card's
    compute capability; none on other devices). ``keep``: the user's objects whose insides
    the run must leave as they were (what it binds in them is put back). ``cell_names``:
    a code file name to the number of the cell it is (IPython's), for ``In[7] line 3``.
    ``names``: the namespace's (name, object) pairs, asked when a module runs that has no
    name yet and at the end (root modules are named after the variable bound to them).
    ``breakdown``: watch the run with the breakdown's hooks (``seen``; the events carry it).
    The run's exceptions become ``error``; KeyboardInterrupt and SystemExit propagate after
    the objects are put back.
    """
    result = FakeRun(device_type)
    t: Any = importlib.import_module("torch")  # asked for by the user: a dry run needs it
    if device_type == "cuda" and t.version.cuda is None and t.version.hip is None:
        result.error = Stopped(
            "no cuda build",
            None,
            "a dry run for CUDA needs a CUDA build of torch (this one is "
            f"{t.__version__}, CPU only); a dry run for the CPU works: device_type='cpu'",
        )
        result.notes.append(result.error.line)
        return result
    from torch._subclasses.fake_tensor import FakeTensorMode

    cuda_before = bool(device_type == "cuda" and t.cuda.is_initialized())
    used_before = t.cuda.memory_allocated() if cuda_before else 0
    if workspaces is None and device_type == "cuda":
        found: dict[int, Workspaces] = {}

        def table(index: int) -> Workspaces:
            ws = found.get(index)
            if ws is None:
                ws = found[index] = cuda_workspaces(_capability(t, index))
            return ws

        spaces: Any = table
    else:
        spaces = workspaces
    contexts_before = _contexts(t) if device_type == "cuda" else set()
    keeper = _Keep(t, keep)
    switches = _Switches(t)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    state = _State(t, fake_mode, device_type, spaces)
    state.cell_names = cell_names
    recorder = _recorder_class()(state)
    watch = _Watch(state, t, names) if breakdown else None
    refused = False
    start = time.perf_counter()
    try:
        try:
            from .fake_patches import data_on_cpu, patched

            with (
                _no_warmup_tensor(),
                patched(t, device_type, lambda i: _capability(t, i)),
                _storage_resizes(t, state),
                fake_mode,
                recorder,
                data_on_cpu(t, device_type),
            ):
                if watch is not None:
                    watch.start()
                try:
                    value = run()
                    del value  # what the run returns dies with it, as a cell's unused value
                finally:
                    if watch is not None:
                        watch.stop()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:
            refused = watch is not None and watch.refused(e)
            failed = state.failed
            op = failed[0] if failed is not None and _caused(e, failed[1]) else None
            kind, op_name, message = _describe(e, op, t)
            where, inside = _locate(e.__traceback__, t, cell_names)
            result.error = Stopped(kind, op_name, message, where, inside)
            result.notes.append(result.error.line)
            del e, failed
    finally:
        result.seconds = time.perf_counter() - start
        state.recording = False
        if watch is not None:  # before the user's objects are put back
            result.seen = watch.finish()
        state.restore_grads()
        state.failed = None
        changed = keeper.restore()
        switches.restore()
        result.events = Events(state.events, result.seen)
        result.ops = state.ops
        result.input_bytes = state.input_bytes
        result.libraries = frozenset(state.libraries)
        result.notes[:0] = state.notes
        if changed:
            result.notes.append(
                f"the run changed {changed} of the objects it was given "
                "(attributes, optimizer state, containers): they were put back"
            )
    new_contexts = sorted(_contexts(t) - contexts_before) if device_type == "cuda" else []
    if new_contexts:
        result.notes.append(
            f"a CUDA context was created on device {', '.join(map(str, new_contexts))} by "
            "the fake kernels (the driver's own memory, outside PyTorch's allocator)"
        )
    if device_type == "cuda" and not cuda_before and t.cuda.is_initialized():
        result.cuda_initialized = True
        result.notes.append(
            "the run started CUDA: something in it asked the device itself (a stream, "
            "synchronize, device properties, a real tensor)"
        )
    elif cuda_before and t.cuda.memory_allocated() != used_before:
        result.notes.append(
            f"device memory allocated changed by {t.cuda.memory_allocated() - used_before:,} B "
            "during the run: something in it made real tensors"
        )
    if refused:  # the run switched saved-tensor hooks off: again, without the hooks
        again = record(
            run,
            device_type=device_type,
            workspaces=workspaces,
            keep=keep,
            cell_names=cell_names,
            names=names,
            breakdown=False,
        )
        again.notes.insert(
            0,
            "the cell switches saved-tensor hooks off (disable_saved_tensors_hooks): it ran "
            "again without the breakdown's hooks, so its activations count as temporaries",
        )
        return again
    return result


def run_cell_source(
    shell: Any,
    source: str,
    *,
    first_line: int = 1,
    device_type: str = "cuda",
    workspaces: Workspaces | None = None,
    breakdown: bool = True,
) -> FakeRun:
    """Dry-run a cell's source: compiled as IPython compiles cells (its transforms, the
    cell's own file name, so that lines read ``In[N] line L``; ``first_line`` is the line of
    the cell the source starts on) and executed in a shallow copy of the user's namespace.
    Afterwards ``shell.user_ns`` holds exactly what it held: names the cell bound are gone,
    names it rebound (through functions' ``global``) get their objects back, and what it
    bound inside the user's objects is put back. Modules are named after the cell's names
    (those it had before and those it binds). ``breakdown=False``: without the breakdown's
    hooks (a scan's dry runs need only the peaks)."""
    ns: dict[str, Any] = shell.user_ns
    before = dict(ns)
    try:
        text = "\n" * (first_line - 1) + shell.transform_cell(source)
        filename = shell.compile.cache(text, shell.execution_count)
        code = shell.compile(text, filename, "exec")
    except SyntaxError as e:
        run = FakeRun(device_type)
        where = f"line {e.lineno}" if e.lineno else None
        run.error = Stopped("syntax", None, f"SyntaxError: {e.msg}", where)
        run.notes.append(run.error.line)
        return run
    # IPython keeps which execution count each cell file name ran as
    names: dict[str, int] = getattr(shell.compile, "_filename_map", None) or {}
    hidden = getattr(shell, "user_ns_hidden", {}) or {}
    keep = [v for k, v in before.items() if k not in hidden and not k.startswith("_")]
    scratch = dict(before)

    def bound() -> list[tuple[str, Any]]:
        """The names the cell sees (those before it and those it bound so far)."""
        return [(k, v) for k, v in list(scratch.items()) if k not in hidden and k[:1] != "_"]

    try:
        return record(
            lambda: exec(code, scratch),
            device_type=device_type,
            workspaces=workspaces,
            keep=keep,
            cell_names=names.get,
            names=bound,
            breakdown=breakdown,
        )
    finally:
        scratch.clear()
        for k in [k for k in ns if k not in before]:
            del ns[k]
        for k, v in before.items():
            if ns.get(k, _MISSING) is not v:
                ns[k] = v


_MISSING = object()
