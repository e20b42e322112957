"""The per-run state of a dry run: what sees storages born and die.

A ``TorchDispatchMode`` above the fake mode (``recorder.py``) looks at each op's
outputs; a storage it has not seen is a new allocation (its exact bytes, device, stream and
thread), and a weak reference on the storage's Python object records its death (PyTorch
keeps one Python object per storage while the storage lives). Views and in-place ops
return storages already seen: they allocate nothing. Storages of the user's real tensors
(converted to fake copies by the fake mode) existed before the run: they are inputs, not
allocations. :class:`State` keeps the events in order, adds cuBLAS's workspaces and the
notes on what the fake kernels don't show (``collectors/dry_run/workspaces.py``), and answers
a value read to the host (:meth:`State.host_read`): with the value when the run knows it
(small tensors made of constants, ``collectors/dry_run/values.py``), else with 0. A run past
:data:`MAX_SECONDS` stops (:class:`TimeBudget`). Used by ``collectors/fake_run.record``
for one run, and by the breakdown's watch (``collectors/dry_run/watch.py``), which reads its
live storages."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from ..torch_build import cuda_ready
from .conv import ConvWorkspaces
from .events import Alloc, AllocKind, Event, Free
from .values import KnownValues
from .where import here
from .workspaces import (
    CUDNN_OPS,
    NOTED_OPS,
    SCRATCH_OPS,
    addmm_uses_lt,
    grouped_mm_uses_cublas,
    op_kind,
)

HELD = "held before the cell"  # the op of a held storage's Alloc
MAX_HOST_READS = 100_000  # a dry run's reads of values before it stops (see host_read)
MAX_SECONDS = 300.0  # a dry run's time before it stops (see TimeBudget)
CLOCK_EVERY = 256  # ops between two looks at the clock
PROGRESS_AFTER = 2.0  # seconds of a dry run before it shows how it goes
PROGRESS_EVERY = 1.0  # seconds between two updates


class TimeBudget(BaseException):
    """A dry run that ran past :data:`MAX_SECONDS`: stopped, with what it did and the line
    it was at. A ``BaseException``, as ``fake_guard.Refused``: a cell's ``except
    Exception`` does not swallow it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _tensors(out: Any, tensor_type: type) -> Iterator[Any]:
    """The tensors of an op's output: a tensor, or tuples and lists of them."""
    if isinstance(out, tensor_type):
        yield out
    elif isinstance(out, (tuple, list)):
        for o in out:
            yield from _tensors(o, tensor_type)


class State:
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
        # the user's real tensors on the run's device that the cell used, in the order it
        # first used them: held from the cell's start (the key -> the real tensor)
        self.held: list[Alloc] = []
        self.held_tensors: dict[int, Any] = {}
        self.failed: tuple[Any, BaseException] | None = None  # (op, what it raised)
        self.kinds: dict[Any, str] = {}  # op -> "cublas" / "cublaslt" / "addmm" / ""
        self.noted: set[str] = set()
        self.module_now = -1  # the innermost module running in the run's thread (Watch)
        self.libraries: set[str] = set()  # "cudnn", "nccl": loaded by the ops that ran
        self.unseen: set[str] = set()  # scratch memory of ops the run saw, not sized
        self.convs = ConvWorkspaces(t)  # cuDNN convolutions' workspaces, sized at the end
        self.scalar_read = t.ops.aten._local_scalar_dense.default
        # sized by ``shapes`` before the fake mode sees them: for CTC loss it has no fake
        # kernel and falls back to running the op for real, which starts CUDA
        self.presized = frozenset(
            op.Tensor for op in (t.ops.aten._ctc_loss, t.ops.aten._ctc_loss_backward)
        )
        from torch.utils._python_dispatch import is_traceable_wrapper_subclass_type

        self.is_wrapper = is_traceable_wrapper_subclass_type
        self.wrappers: dict[type, bool] = {}
        from torch._subclasses.fake_tensor import (
            DataDependentOutputException,
            DynamicOutputShapeException,
        )

        self.data_dependent = DataDependentOutputException
        self.dynamic_shape = DynamicOutputShapeException
        from torch._subclasses.fake_tensor import FakeTensor

        self.reads = 0  # values read to the host (.item(), bool(), `if tensor`)
        # small values the run knows (fake_values): a read of one gets its real answer
        self.values = KnownValues(t, FakeTensor)
        self.started = time.perf_counter()
        self.deadline = self.started + MAX_SECONDS
        # told how the run goes while it runs long: (ops, the user's line, seconds)
        self.progress: Callable[[int, str | None, float], None] | None = None
        self.reported = self.started
        self.read_at: dict[str, int] = {}  # where, in the user's code -> how many times
        self.cell_names: Callable[[str], int | None] | None = None
        self.fake_type = FakeTensor
        # what torch.tensor(data) calls with the real tensor it just made, for the fake mode
        # to make a constant of it
        self.lifts = frozenset(getattr(fake_mode, "lift_fns", ()))
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
        if not self.cuda_streams or not cuda_ready(self.t):
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
    def fake_inputs(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The op's arguments with each of the user's real tensors replaced by its fake copy
        (made once per tensor: views and aliases stay aliases, and what the op writes goes
        into the copy). FakeTensorMode runs an op whose inputs are all real *for real*
        (``allow_non_fake_inputs``): without this, ``w.mul_(0)`` in a dry run zeroes the
        user's real weights."""
        Tensor, fake_type = self.t.Tensor, self.fake_type

        def real(a: Any) -> bool:
            return isinstance(a, Tensor) and not isinstance(a, fake_type)

        def swapped(a: Any) -> Any:
            if real(a):
                return self.as_fake(a)
            if isinstance(a, (list, tuple)) and any(real(x) for x in a):
                return type(a)(self.as_fake(x) if real(x) else x for x in a)
            return a

        if any(real(a) or isinstance(a, (list, tuple)) for a in args):
            args = tuple(swapped(a) for a in args)
        if kwargs and any(real(a) or isinstance(a, (list, tuple)) for a in kwargs.values()):
            kwargs = {k: swapped(v) for k, v in kwargs.items()}
        return args, kwargs

    def as_fake(self, x: Any) -> Any:
        """The fake copy of the user's real tensor ``x`` (made on first use). Its storage
        existed before the cell: on the run's device it is *held* (:attr:`held`), as a
        fresh process that ran the earlier cells would hold it, and its gradient is put
        back at the end."""
        entry = self.real.get(id(x))
        if entry is None:
            entry = self._real_input(x)
        fake = entry[2]
        if fake is None:
            from .guard import Refused

            raise Refused(
                f"a dry run runs no op on a real tensor: the cell's {type(x).__name__} "
                f"(layout {x.layout}) has no fake copy in this torch",
                None,
            )
        return fake

    def _real_input(self, x: Any) -> tuple[Any, Any, Any]:
        grad = x.grad if x.is_leaf and x.requires_grad else None
        try:
            fake = self.fake_mode.from_tensor(x)
            st = fake.untyped_storage()
        except Exception:  # sparse, nested, subclasses: no copy, the op is refused
            entry = self.real[id(x)] = (x, grad, None)
            return entry
        entry = self.real[id(x)] = (x, grad, fake)
        if x.device.type == "cpu" and x.numel() == 1 and fake.constant is None:
            self._known_value(x, fake)
        self.values.seed(fake, x)  # a small CPU tensor's values (a mask, token ids)
        if id(st) not in self.live:
            n = st.nbytes()
            key = None
            if fake.device.type == self.device_type:
                self.input_bytes += n
                if n > 0:
                    self.next_key += 1
                    key = self.next_key
                    held = Alloc(key, n, fake.device.index or 0, 0, 0, HELD, "tensor")
                    self.held.append(held)
                    self.held_tensors[key] = x
            self._watch(st, key, n)
        return entry

    def _known_value(self, x: Any, fake: Any) -> None:
        """A one-number tensor on the CPU (an optimizer's step count) keeps its value in the
        fake copy, on a private copy: ops on it are computed (``x += 1`` on the copy),
        and ``.item()`` reads it, as the fake mode does for ``torch.tensor(0.0)``. Only on
        the CPU: the fake mode computes such values where the constant lies, and a CUDA
        tensor's must not run on the device."""
        from torch.utils._mode_utils import no_dispatch

        try:
            with no_dispatch():
                fake.constant = x.detach().clone()
            self.fake_mode.fake_tensor_converter.add_constant_storage_mapping(fake)
        except Exception:  # another torch: the copy has no value, a read is 0
            fake.constant = None

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
            kind = self.kinds[func] = op_kind(func)
        if kind:
            self._library(func, kind, out, args, kwargs)

    def _library(self, func: Any, kind: str, out: Any, args: Any, kwargs: Any) -> None:
        if kind == "custom":
            if not any(x.device.type == self.device_type for x in _tensors(out, self.t.Tensor)):
                return  # a query (a version, a flag): nothing on the device
            self.note(
                f"custom:{func}",
                f"{func} (a custom op) ran its fake kernel: scratch memory its real kernel "
                "takes is not seen",
            )
            self.unseen.add(f"scratch memory of {func}")
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
            if name in CUDNN_OPS:
                self.libraries.add("cudnn")
            if name in ("convolution", "convolution_backward") and self._convolution(
                name, args, out
            ):
                return
            self.note(f"scratch:{name}", f"not seen: {SCRATCH_OPS[name]} ({func})")
            self.unseen.add(SCRATCH_OPS[name])
            return
        if kind == "noted":
            self.note(f"noted:{func._opname}", f"not sized: {NOTED_OPS[func._opname]} ({func})")
            return
        if kind == "mha":  # its temporaries, then its projections' cuBLASLt workspaces
            from .attention import record_temporaries

            record_temporaries(self, func, args, kwargs, out)
            kind = "cublaslt"
        if kind == "grouped_mm" and not grouped_mm_uses_cublas(args, kwargs):
            return  # bfloat16: CUTLASS, no cuBLAS workspace
        if self.workspaces is None:
            return
        device = next((x.device for x in _tensors(out, self.t.Tensor)), None)
        if device is None or device.type != self.device_type:
            return
        index = device.index or 0
        ws = self.workspaces(index) if callable(self.workspaces) else self.workspaces
        libs = ["cublas"]
        if kind == "cublaslt" or (kind == "addmm" and addmm_uses_lt(args, kwargs)):
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

    def _convolution(self, name: str, args: Any, out: Any) -> bool:
        """A convolution's cuDNN workspaces, recorded to be sized when the run ends
        (``conv.ConvWorkspaces``); False when its backend cannot be told."""
        calls = self.convs.calls(name, args, out)
        if calls is None:
            return False
        for call in calls:  # taken and given back around each cuDNN call
            key = self.alloc(0, call.device, f"aten.{name}.default", "cudnn workspace")
            self.convs.pending.append((len(self.events) - 1, call))
            self.events.append(Free(key))
        return True

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
        self.values.forget(st)
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
        """A value read to the host (``.item()``, ``bool()``, ``if tensor``): the value
        itself when the run knows it (``values``: a flag or counter made from
        constants, as ``generate()``'s finished rows), else zero (``False``), and a note
        says where. A loop that reads values for ever is stopped after
        :data:`MAX_HOST_READS` of them."""
        self.reads += 1
        if self.reads > MAX_HOST_READS:
            raise RuntimeError(
                f"the run read {MAX_HOST_READS:,} values to the host: a loop that waits on a "
                "value never ends in a dry run"
            )
        known = self.values.value(x)
        if known is not None:
            self.values.answered += 1
            return self.values.item(known)
        where = here(self.t, self.cell_names) or "?"
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

    def clock(self) -> None:
        """The recorder asks every :data:`CLOCK_EVERY` ops: after :data:`PROGRESS_AFTER`
        seconds, ``progress`` is told how the run goes, once per :data:`PROGRESS_EVERY`
        seconds; past its time the run stops (:class:`TimeBudget`)."""
        now = time.perf_counter()
        if (
            self.progress is not None
            and now - self.started >= PROGRESS_AFTER
            and now - self.reported >= PROGRESS_EVERY
        ):
            self.reported = now
            try:
                self.progress(self.ops, here(self.t, self.cell_names), now - self.started)
            except Exception:  # a display that fails is not the run's business
                self.progress = None
        if now <= self.deadline:
            return
        busiest = max(self.read_at, key=self.read_at.__getitem__, default=None)
        reads = f"{self.reads:,} values read"
        if busiest is not None:
            reads += f", {self.read_at[busiest]:,} of them at {busiest}"
        raise TimeBudget(
            f"the dry run ran past its {MAX_SECONDS:g} s ({self.ops:,} ops, {reads}): "
            "stopped; a loop that ends on a value the dry run does not know (read as 0) "
            "runs until then"
        )

    def size_by_values(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], e: BaseException | None
    ) -> Any:
        """An output whose size depends on values (``nonzero``, ``x[mask]``), sized by
        ``shapes``; the note says how and where. Other such ops stop the run."""
        from .shapes import sized

        made = sized(self.t, func, args, kwargs, self.values.value)
        if made is None:
            e = e if e is not None else RuntimeError(f"{func} could not be sized")
            self.failed = (func, e)
            raise e
        out, how = made
        self.note(
            f"sized:{func}:{how}",
            f"{func}'s output size depends on values: sized {how}, first at "
            f"{here(self.t, self.cell_names) or '?'}",
        )
        return out

    def note(self, key: str, line: str) -> None:
        if key not in self.noted:
            self.noted.add(key)
            self.notes.append(line)

    def restore_grads(self) -> None:
        for x, grad, _ in self.real.values():
            if x.is_leaf and x.requires_grad and x.grad is not grad:
                x.grad = grad
        self.real.clear()
        self.held_tensors.clear()
