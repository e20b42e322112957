"""A dry run: the user's code under PyTorch's ``FakeTensorMode``, every storage it
allocates and frees recorded in order, no device memory used and no kernel run. The entry
point: :func:`record` (a callable; ``_ipython/cell_source.py`` compiles a cell's source and
runs it in a copy of the user's namespace through it); ``analysis/caching/`` turns the
events into the caching allocator's peaks.

The family, one module per part:

- ``events``: what a run records (:class:`Alloc`, :class:`Free`, :class:`Seen`,
  :class:`Stopped`, :class:`FakeRun`): plain records, no torch;
- ``state``: the per-run state that sees storages born (a dispatch mode above the
  fake mode) and die (weak references on the storages);
- ``workspaces``: what the fake kernels don't allocate: cuBLAS's workspaces by card
  (:data:`WORKSPACE_TABLE`, :func:`cuda_workspaces`), ops with scratch memory or libraries;
- ``watch``: the breakdown's hooks, which see what the peak is made of;
- ``keep``: the user's objects and torch's switches, put back after the run;
- ``where``: where the run is and why it stopped, as the user's line;
- ``patches``: what the run changes in torch while it runs (and puts back) so that
  it takes the real run's path: foreach optimizers, moving a module with ``.cuda()`` /
  ``.to()``, tensors made from data on the GPU, bfloat16 autocast;
- ``group``: a fake process group, for a run of several ranks.

A value read to the host (``.item()``, ``if loss > 0``, ``GradScaler``'s check for
infinities) has none in a dry run: the run goes on as if it were 0 (``False``), and a note
names the line (``fake_state.State.host_read``). What it cannot go on without stops the
run, with one plain line saying what and where: an output whose shape depends on values
(``nonzero``, boolean masks), an op without a fake kernel (custom ops, extensions).

The user's objects are left as they were: the fake mode never writes real tensors, and
what the run binds in the objects it was given (gradients of real parameters, optimizer
state, module attributes) is put back afterwards, as are the random generators, grad mode
and the default dtype. torch is imported inside functions only.

CUDA: torch itself is never started and PyTorch's allocator is never asked (the fake
mode's warm-up tensor is skipped, see :func:`_no_warmup_tensor`). The driver may still
create a context: ``torch.tensor(data, device="cuda")`` does under the fake mode (a device
guard; seen on an H200 with torch 2.11, ``benchmarks/probes/probe_context_ops.py``), which
``patches`` avoids by building such tensors on the CPU first; a note says so when a
context appears anyway.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

from ..torch_build import cuda_ready, gpu_build
from .events import (
    Alloc,
    AllocKind,
    Event,
    Events,
    FakeRun,
    Free,
    PhaseMark,
    PhaseName,
    Saved,
    Seen,
    StopKind,
    Stopped,
)
from .guard import Refused, guarded
from .keep import Keep, Switches, reachable
from .recorder import recorder_class
from .state import State, TimeBudget
from .watch import Watch
from .where import caused, describe, here_and_text, locate
from .workspaces import (
    OTHER_CARDS,
    WORKSPACE_TABLE,
    Workspaces,
    capability,
    cuda_workspaces,
    parse_workspace_config,
)

__all__ = [
    "OTHER_CARDS",
    "WORKSPACE_TABLE",
    "Alloc",
    "AllocKind",
    "Event",
    "Events",
    "FakeRun",
    "Free",
    "PhaseMark",
    "PhaseName",
    "Saved",
    "Seen",
    "StopKind",
    "Stopped",
    "Workspaces",
    "cuda_workspaces",
    "parse_workspace_config",
    "record",
]


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
def _storage_resizes(t: Any, state: State) -> Iterator[None]:
    """``UntypedStorage.resize_`` seen while the run records (it is no dispatched op); in
    the run's thread, a real storage's (the user's tensor's, not a fake copy's, whose
    storages are on the meta device) is refused: it would free or grow real memory."""
    import threading

    cls = t.UntypedStorage
    original = cls.resize_
    run_thread = threading.get_ident()

    def resize_(self: Any, size: int) -> Any:
        if self.device.type != "meta" and threading.get_ident() == run_thread:
            raise Refused(
                "a dry run changes no real tensor: resizing the storage of one of the "
                f"kernel's {self.device.type} tensors (untyped_storage().resize_) was refused",
                None,
            )
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


# -- the entry point -------------------------------------------------------------------


def record(
    run: Callable[[], object],
    *,
    device_type: str = "cuda",
    workspaces: Workspaces | None = None,
    keep: Iterable[object] = (),
    cell_names: Callable[[str], int | None] | None = None,
    names: Callable[[], Iterable[tuple[str, Any]]] | None = None,
    breakdown: bool = True,
    progress: Callable[[int, str | None, float], None] | None = None,
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
    ``progress``: told, while a run goes on for more than 2 s, once a second, how many ops
    it ran, the user's line it is at and for how long (what it writes or prints is not the
    cell's: it is neither refused nor counted).
    The run's exceptions become ``error``; KeyboardInterrupt and SystemExit propagate after
    the objects are put back.
    """
    result = FakeRun(device_type)
    t: Any = importlib.import_module("torch")  # asked for by the user: a dry run needs it
    if device_type == "cuda" and not gpu_build(t):
        result.error = Stopped(
            "no cuda build",
            None,
            "a dry run for CUDA needs a CUDA build of torch (this one is "
            f"{t.__version__}, CPU only); a dry run for the CPU works: device_type='cpu'",
        )
        result.notes.append(result.error.line)
        return result
    from .patches import fake_mode as make_fake_mode

    cuda_before = bool(device_type == "cuda" and cuda_ready(t))
    used_before = t.cuda.memory_allocated() if cuda_before else 0
    spaces = _workspaces_by_device(t, device_type, workspaces)
    contexts_before = _contexts(t) if device_type == "cuda" else set()
    keeper = Keep(t, keep or reachable(run))
    switches = Switches(t)
    fake_mode = make_fake_mode()
    state = State(t, fake_mode, device_type, spaces)
    state.cell_names = cell_names
    recorder = recorder_class()(state)
    watch = Watch(state, t, names) if breakdown else None
    refused = False
    start = time.perf_counter()
    guard = guarded(lambda: here_and_text(t, cell_names), names() if names is not None else ())
    try:
        try:
            with guard as g:
                if progress is not None:  # its own output is neither refused nor counted
                    state.progress = partial(g.quietly, progress)
                _run_recorded(run, t, device_type, state, fake_mode, recorder, watch)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:
            refused = watch is not None and watch.refused(e)
            result.error = _stopped(e, state, t, cell_names)
            del e
        if result.error is None and g.refused:  # the cell swallowed a refusal
            message, where = g.refused[0]
            result.error = Stopped("refused", None, message, where)
        if result.error is not None:
            result.notes.append(result.error.line)
    finally:
        result.seconds = time.perf_counter() - start
        _put_back(result, state, watch, keeper, switches, names)
    result.notes.extend(g.undoable())
    result.kernel_allocated = _kernel_allocated(t, device_type)
    _note_device(result, t, contexts_before, cuda_before, used_before)
    if refused:  # the run switched saved-tensor hooks off: again, without the hooks
        again = record(
            run,
            device_type=device_type,
            workspaces=workspaces,
            keep=keep,
            cell_names=cell_names,
            names=names,
            breakdown=False,
            progress=progress,
        )
        again.notes.insert(
            0,
            "the cell switches saved-tensor hooks off (disable_saved_tensors_hooks): it ran "
            "again without the breakdown's hooks, so its activations count as temporaries",
        )
        return again
    return result


def _workspaces_by_device(t: Any, device_type: str, workspaces: Workspaces | None) -> Any:
    """The workspaces the run adds: those given, else for CUDA each device's from
    :func:`cuda_workspaces`, looked up when the device first calls cuBLAS (a callable of
    the device index), else none."""
    if workspaces is not None or device_type != "cuda":
        return workspaces
    found: dict[int, Workspaces] = {}

    def table(index: int) -> Workspaces:
        ws = found.get(index)
        if ws is None:
            ws = found[index] = cuda_workspaces(capability(t, index))
        return ws

    return table


def _run_recorded(
    run: Callable[[], object],
    t: Any,
    device_type: str,
    state: State,
    fake_mode: Any,
    recorder: Any,
    watch: Watch | None,
) -> None:
    """``run()`` under the fake mode, the recorder, the patches of ``patches`` and,
    when given, the breakdown's watch; every one of them is undone when it returns or
    raises."""
    from .kernels import fake_kernels
    from .patches import data_on_cpu, patched

    with (
        _no_warmup_tensor(),
        patched(t, device_type, lambda i: capability(t, i)),
        fake_kernels(t, device_type, state.note),
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


def _stopped(
    e: BaseException, state: State, t: Any, cell_names: Callable[[str], int | None] | None
) -> Stopped:
    """Why the run stopped, from what it raised: the op that failed when ``e`` came from it,
    the kind and the plain line (``fake_where.describe``), the user's line."""
    if isinstance(e, Refused):
        where = e.where or locate(e.__traceback__, t, cell_names)[0]
        return Stopped("refused", None, e.message, where)
    if isinstance(e, TimeBudget):
        where, inside = locate(e.__traceback__, t, cell_names)
        return Stopped("time", None, e.message, where, inside)
    failed = state.failed
    op = failed[0] if failed is not None and caused(e, failed[1]) else None
    kind, op_name, message = describe(e, op, t)
    where, inside = locate(e.__traceback__, t, cell_names)
    return Stopped(kind, op_name, message, where, inside)


def _put_back(
    result: FakeRun,
    state: State,
    watch: Watch | None,
    keeper: Keep,
    switches: Switches,
    names: Callable[[], Iterable[tuple[str, Any]]] | None,
) -> None:
    """After the run: what the watch saw (read before the user's objects are put back), the
    user's gradients, objects and torch's switches put back, the state's records and notes
    into ``result``."""
    state.recording = False
    _size_convolutions(state)
    if watch is not None:  # before the user's objects are put back
        result.seen = watch.finish()
    result.held = list(state.held)
    result.held_owners = _owners(state, names)
    state.restore_grads()
    state.failed = None
    changed = keeper.restore()
    switches.restore()
    result.events = _with_held(state.held, state.events, result.seen)
    result.ops = state.ops
    result.input_bytes = state.input_bytes
    result.libraries = frozenset(state.libraries)
    result.unseen = frozenset(state.unseen)
    result.notes[:0] = state.notes
    if changed:
        result.notes.append(
            f"the run changed {changed} of the objects it was given "
            "(attributes, optimizer state, containers): they were put back"
        )


def _size_convolutions(state: State) -> None:
    """The cuDNN convolutions' workspaces sized (``conv.ConvWorkspaces``), and said so."""
    if not state.convs.pending:
        return
    sized, unsized, how = state.convs.size(state.events)
    what = "cuDNN's workspace for convolutions"
    if sized:
        state.note("conv:sized", f"{what}: {sized} calls sized, {how}")
    if unsized:
        state.note("conv:unsized", f"not seen: {what} of {unsized} calls ({how})")
        state.unseen.add("cuDNN's workspace for convolutions")


def _with_held(held: list[Alloc], events: list[Event], seen: Seen | None) -> Events:
    """The run's events with the storages it found on the device (the user's real tensors
    it used) allocated first, as a fresh process that ran the earlier cells holds them
    when the cell starts; what ``seen`` indexes moves with the events."""
    if held and seen is not None:
        n = len(held)
        seen.marks = [m._replace(at=m.at + n) for m in seen.marks]
        seen.saved = [s._replace(at=s.at + n) for s in seen.saved]
    return Events([*held, *events] if held else events, seen)


def _owners(state: State, names: Callable[[], Iterable[tuple[str, Any]]] | None) -> dict[int, str]:
    """Who holds each storage the cell found on the device, in the user's words: held key
    -> ``gpt's parameters``, ``opt's state``, ``x`` (a name), or ``tensors`` when no name
    reaches it."""
    if not state.held_tensors:
        return {}
    t = state.t
    by_id = {id(x): key for key, x in state.held_tensors.items()}
    found: dict[int, str] = {}

    def own(x: Any, label: str) -> None:
        key = by_id.get(id(x))
        if key is not None and key not in found:
            found[key] = label

    try:
        pairs = list(names()) if names is not None else []
        for name, obj in pairs:
            if isinstance(obj, t.Tensor):
                own(obj, name)
            elif isinstance(obj, t.nn.Module):
                for p in obj.parameters():
                    own(p, f"{name}'s parameters")
                    if p.grad is not None:
                        own(p.grad, f"{name}'s gradients")
                for b in obj.buffers():
                    own(b, f"{name}'s buffers")
            elif isinstance(obj, t.optim.Optimizer):
                for per_param in obj.state.values():
                    for v in per_param.values() if isinstance(per_param, dict) else ():
                        if isinstance(v, t.Tensor):
                            own(v, f"{name}'s state")
    except Exception:  # a namespace that can't be walked: the storages stay unnamed
        pass
    return {key: found.get(key, "tensors") for key in state.held_tensors}


def _kernel_allocated(t: Any, device_type: str) -> dict[int, int]:
    """What this process holds on each device now (PyTorch's allocated), where CUDA runs:
    the dry run counts what the cell used of it and lists the rest."""
    if device_type != "cuda" or not cuda_ready(t):
        return {}
    try:
        return {
            i: int(t.cuda.memory_allocated(i))
            for i in range(t.cuda.device_count())
            if t.cuda.memory_allocated(i)
        }
    except Exception:
        return {}


def _note_device(
    result: FakeRun, t: Any, contexts_before: set[int], cuda_before: bool, used_before: int
) -> None:
    """Notes on what the run did to the device that it should not have: a CUDA context
    created, CUDA started, real tensors made (for a CUDA run; nothing for another)."""
    device_type = result.device_type
    new_contexts = sorted(_contexts(t) - contexts_before) if device_type == "cuda" else []
    if new_contexts:
        result.notes.append(
            f"the driver created a CUDA context on device {', '.join(map(str, new_contexts))} "
            "(its own memory, outside PyTorch's allocator, as a first real CUDA call would): "
            "PyTorch's autograd asks CUDA about the device of the fake tensors it records "
            "(their current stream), and torch has no switch against it; nothing was "
            "allocated, and a process that already uses the GPU has its context already"
        )
    if device_type == "cuda" and not cuda_before and cuda_ready(t):
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
