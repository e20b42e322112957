"""The job a multi-GPU dry run stands in: this process as rank 0 of ``N`` processes, with
PyTorch's fake process group (``torch.testing._internal.distributed.fake_pg``) as the
job's default group. Collectives on it return at once and move no data; everything else
the cell does (``fully_shard``, ``DistributedDataParallel``, ``ZeroRedundancyOptimizer``)
runs as it would on rank 0, under the fake mode of ``collectors/dry_run``, so what rank 0
allocates is recorded, the buffers collectives take from PyTorch's caching allocator
included. NCCL's own buffers are outside that allocator: ``core/dry_run`` adds them beside
it (``LIBRARIES``, measured).

:func:`fake_job` sets the job up around one dry run and takes it down afterwards, leaving
nothing behind: the default group destroyed, every patch below undone, the environment
variables put back. What it patches, and why (read in torch 2.13's source; run with torch
2.13 on the CPU and torch 2.11 on two H100s):

- ``init_device_mesh`` (in every module that imported it) and ``DeviceMesh.from_group``
  run with the dispatch modes off: a mesh is bookkeeping of ranks, built from a CPU
  tensor whose values it reads (``.tolist()``), which the fake mode can't give. On the
  "fake" backend the mesh skips its device setup (``_setup_world_group_and_device``).
- DTensor (FSDP2's parameters) works out each op's output shape by running the op on
  fake tensors of the global shape: that runs under the fake mode alone, unseen by the
  run's recorder (it is no allocation of rank 0's).
- DDP: the check that every rank has the same parameter shapes reads its metadata tensor
  on the host (C++ ``verify_params_across_processes``): in a fake job every rank is rank
  0, so it only allocates its small metadata tensor on the parameters' device, as the real
  one does. DDP's default gradient all-reduce (C++) reads the fake group's work's future,
  which holds no tensor: a Python comm hook doing the same in place (all-reduce of the
  bucket) takes its place when the cell registered none. The rebuild of the buckets at the
  second forward reads the bucket order on the host: skipped, the buckets keep the first
  step's layout (the same bytes). On two H100s (torch 2.11) the real job held the first
  buckets beside the rebuilt ones for a while (GPT-2: +5 % at the second step), on two
  H200s it did not: not predicted, a note says so.
- ``init_process_group`` / ``destroy_process_group`` called by the cell itself are
  answered by the fake job (a script written for ``torchrun`` calls them); ``RANK``,
  ``LOCAL_RANK``, ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` are set as ``torchrun`` sets them
  for rank 0.

CUDA: FSDP2 asks torch for the current device (``torch.cuda.current_device()``) and makes
its own streams for all-gather and reduce-scatter, which starts CUDA in this process (a
context on the device, outside PyTorch's allocator; nothing in it). Its streams are real,
so the run records which stream each buffer was allocated on, as the caching allocator
keeps a pool per stream.

torch is imported only for a job of more than one process.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import operator
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ...errors import GpuMemError
from ...units import shown
from ..torch_build import imported_torch

MAX_WORLD_SIZE = 65536
ENVIRONMENT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
REBUILD = (
    "DDP's buckets keep the layout of the first step: PyTorch rebuilds them at the second "
    "forward (the same bytes), and the first ones can stay allocated a while longer, until "
    "NCCL's work on them is let go (seen on two H100s with torch 2.11: one more set of "
    "buckets, GPT-2 +5 %; not on two H200s), which a dry run does not predict"
)
STARTED_CUDA = (
    "the run started CUDA in this process: FSDP2 asks for the current device and makes its "
    "own streams for all-gather and reduce-scatter (a CUDA context on the device, outside "
    "PyTorch's allocator, which the run leaves empty)"
)


def check_world_size(value: object) -> int:
    """``value`` as a world size (a whole number from 1 to :data:`MAX_WORLD_SIZE`, or a
    string of one); :class:`GpuMemError` otherwise."""
    n: int | None = None
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit() and len(text) <= len(str(MAX_WORLD_SIZE)):  # int() has a limit
            n = int(text)
    elif not isinstance(value, bool):
        try:
            n = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            n = None
    if n is None or not 1 <= n <= MAX_WORLD_SIZE:
        raise GpuMemError(
            f"world size must be a whole number from 1 to {MAX_WORLD_SIZE} (the processes "
            f"of the job), got {shown(value)}"
        )
    return n


def refusal(world_size: int) -> str | None:
    """Why a dry run can't be rank 0 of a fake job here (None: it can, or needs none).
    Imports ``torch.distributed`` only for a job of more than one process."""
    if world_size <= 1:
        return None
    try:
        dist: Any = importlib.import_module("torch.distributed")
    except ImportError:
        dist = None
    if dist is None or not dist.is_available():
        torch = imported_torch()
        version = getattr(torch, "__version__", "?")
        return (
            f"a dry run of {world_size} processes needs torch.distributed, which this build "
            f"of torch ({version}) does not have"
        )
    if dist.is_initialized():
        try:
            what = f"backend {dist.get_backend()}, world size {dist.get_world_size()}"
        except Exception:
            what = "of an unknown backend"
        return (
            f"a process group is already initialised in this process ({what}): the dry "
            "run does not replace a real job's group; dry-run in a process without one "
            "(a fresh kernel)"
        )
    return None


@dataclass
class FakeJob:
    """The job one dry run ran in: its size, and what happened in it that the report
    should say (one plain line each)."""

    world_size: int
    said: list[str] = field(default_factory=list)

    def say(self, line: str) -> None:
        if line not in self.said:
            self.said.append(line)

    def explain(self, notes: list[str]) -> list[str]:
        """The run's notes with the job's own: what a fake job counts and what not.
        FSDP2's copy ops (``torch.ops.fsdp.*``, torch's own, copies without scratch) are
        not custom ops whose scratch is unseen: their notes go."""
        if self.world_size <= 1:
            return notes
        kept = [n for n in notes if not n.startswith("fsdp.")]
        collectives = any(n.startswith("collectives ran") for n in kept)
        if collectives:
            kept.append(
                f"ran as rank 0 of {self.world_size} processes in PyTorch's fake process "
                "group: collectives moved no data; the buffers they take from PyTorch's "
                "allocator (FSDP2's all-gather and reduce-scatter buffers, DDP's buckets) "
                "are counted"
            )
        else:
            kept.append(
                f"ran as rank 0 of {self.world_size} processes, but no collective ran: "
                "nothing was sharded or reduced (no fully_shard, DistributedDataParallel "
                "or ZeroRedundancyOptimizer step?), so each rank holds what one process would"
            )
        kept.extend(self.said)
        return kept


@contextlib.contextmanager
def fake_job(world_size: object) -> Iterator[FakeJob]:
    """This process as rank 0 of a job of ``world_size`` processes for the ``with`` block:
    PyTorch's fake process group as the default group, and the patches the module's
    docstring lists; all of it undone afterwards. ``world_size`` 1: nothing at all (no
    group, no import). Raises :class:`GpuMemError` for a world size that is not a whole
    number from 1 to :data:`MAX_WORLD_SIZE`, without ``torch.distributed``, or when this
    process already has a process group."""
    n = check_world_size(world_size)
    job = FakeJob(n)
    if n == 1:
        yield job
        return
    why = refusal(n)
    if why is not None:
        raise GpuMemError(why)
    dist: Any = importlib.import_module("torch.distributed")
    patches = _Patches()
    environ = {k: os.environ.get(k) for k in ENVIRONMENT}
    try:
        dist.init_process_group("fake", store=_store(dist), rank=0, world_size=n)
        os.environ.update(
            {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n)}
        )
        _patch_device_mesh(patches)
        _patch_dtensor(patches)
        _patch_ddp(patches, job)
        _patch_group_calls(patches, dist, job)
        yield job
    finally:
        patches.restore()
        for k, v in environ.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if dist.is_initialized():
            dist.destroy_process_group()


def _store(dist: Any) -> Any:
    """The fake group's store: torch's ``FakeStore`` (importing its module registers the
    "fake" backend on torch versions that don't have it built in), else a ``HashStore``."""
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError:
        return dist.HashStore()
    return FakeStore()


# -- the patches ------------------------------------------------------------------------
class _Patches:
    """Attributes replaced for the job, put back in reverse order."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def attr(self, owner: Any, name: str, new: Any) -> None:
        had = name in vars(owner)
        old = vars(owner).get(name)
        setattr(owner, name, new)

        def undo() -> None:
            if had:
                setattr(owner, name, old)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)

        self._undo.append(undo)

    def everywhere(self, name: str, original: Any, new: Any) -> None:
        """``new`` for ``name`` in every module that holds ``original`` under it; undone
        in every module that holds ``new`` then (modules the run imported too)."""
        for module in list(sys.modules.values()):
            if _get(module, name) is original:
                setattr(module, name, new)

        def undo() -> None:
            for module in list(sys.modules.values()):
                if _get(module, name) is new:
                    setattr(module, name, original)

        self._undo.append(undo)

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()


def _get(module: Any, name: str) -> Any:
    try:
        return vars(module).get(name)
    except TypeError:  # an entry of sys.modules without a __dict__
        return None


def _modes_off() -> Any:
    """A context without the dispatch modes (the fake mode and the run's recorder)."""
    try:
        from torch.utils._python_dispatch import _disable_current_modes
    except ImportError:  # pragma: no cover - older torch
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        return unset_fake_temporarily()
    return _disable_current_modes()


def _outside_fake(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def outside(*args: Any, **kwargs: Any) -> Any:
        with _modes_off():
            return fn(*args, **kwargs)

    return outside


def _patch_device_mesh(patches: _Patches) -> None:
    dm: Any = importlib.import_module("torch.distributed.device_mesh")
    original = getattr(dm, "init_device_mesh", None)
    if original is not None:
        patches.everywhere("init_device_mesh", original, _outside_fake(original))
    mesh = getattr(dm, "DeviceMesh", None)
    from_group = vars(mesh).get("from_group") if mesh is not None else None
    if isinstance(from_group, staticmethod):
        patches.attr(mesh, "from_group", staticmethod(_outside_fake(from_group.__func__)))


def _patch_dtensor(patches: _Patches) -> None:
    """DTensor works out an op's output shape by running the op on fake tensors of the
    global shape (``ShardingPropagator._propagate_tensor_meta_non_cached``): bookkeeping
    that allocates nothing on a real device, so it runs under the run's fake mode alone,
    without the recorder (which would count a whole unsharded tensor for each op)."""
    try:
        module: Any = importlib.import_module("torch.distributed.tensor._sharding_prop")
    except ImportError:  # pragma: no cover - a torch without DTensor
        return
    cls = getattr(module, "ShardingPropagator", None)
    original = vars(cls).get("_propagate_tensor_meta_non_cached") if cls is not None else None
    if original is None:
        return

    @functools.wraps(original)
    def propagate(self: Any, op_schema: Any) -> Any:
        from torch._guards import detect_fake_mode

        fake_mode = detect_fake_mode()
        if fake_mode is None:
            return original(self, op_schema)
        with _modes_off(), fake_mode:
            return original(self, op_schema)

    patches.attr(cls, "_propagate_tensor_meta_non_cached", propagate)


def _patch_ddp(patches: _Patches, job: FakeJob) -> None:
    utils: Any = sys.modules.get("torch.distributed.utils")
    verify = getattr(utils, "_verify_param_shape_across_processes", None)
    if verify is not None:
        patches.everywhere("_verify_param_shape_across_processes", verify, _same_shapes)
    ddp: Any = sys.modules.get("torch.nn.parallel.distributed")
    cls = getattr(ddp, "DistributedDataParallel", None)
    pre_forward = vars(cls).get("_pre_forward") if cls is not None else None
    if pre_forward is not None:
        patches.attr(cls, "_pre_forward", _ddp_pre_forward(pre_forward, job))


def _same_shapes(process_group: Any, tensors: Any, logger: Any = None) -> None:
    """DDP's check that the ranks' parameters agree, in a job whose ranks are all rank 0:
    only its metadata tensor on the parameters' device (two int64 per dimension), which
    the real check allocates and frees."""
    import torch

    tensors = list(tensors)
    if tensors:
        n = sum(2 * t.dim() for t in tensors)
        metadata = torch.empty(n, dtype=torch.long, device=tensors[0].device)
        del metadata


def _allreduce_hook(process_group, bucket):  # type: ignore[no-untyped-def]
    """DDP's default all-reduce of a bucket, in place, as a Python comm hook (the fake
    group's work holds no tensor for the C++ one). Not annotated: DDP accepts a hook's
    annotations only when they are its own classes."""
    import torch
    import torch.distributed as dist

    buffer = bucket.buffer()
    dist.all_reduce(buffer, group=process_group)
    done: Any = torch.futures.Future()
    done.set_result(buffer)
    return done


class _NoRebuild:
    """A DDP reducer whose bucket rebuild is skipped (it reads the order on the host)."""

    def __init__(self, reducer: Any, ddp: Any, job: FakeJob) -> None:
        self._reducer = reducer
        self._ddp = ddp
        self._job = job

    def _rebuild_buckets(self) -> bool:
        ddp = self._ddp
        asked = ddp.__dict__.get("_gpumem_rebuilds", 0) + 1
        ddp.__dict__["_gpumem_rebuilds"] = asked
        # PyTorch rebuilds once, at the second forward with grad, unless it looks for
        # unused parameters in a graph that is not static
        dynamic = getattr(ddp, "find_unused_parameters", False) and not getattr(
            ddp, "static_graph", False
        )
        if asked == 2 and not dynamic:
            self._job.say(REBUILD)
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)


def _ddp_pre_forward(original: Callable[..., Any], job: FakeJob) -> Callable[..., Any]:
    @functools.wraps(original)
    def _pre_forward(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        reducer = getattr(self, "reducer", None)
        if reducer is None or getattr(self, "_use_python_reducer", False):
            return original(self, *inputs, **kwargs)
        if not getattr(self, "_lazy_init_ran", True):
            self._lazy_init()
        if not getattr(self, "_comm_hooks", True) and not getattr(self, "_gpumem_hook", False):
            self._gpumem_hook = True
            try:
                self.register_comm_hook(self.process_group, _allreduce_hook)
            except RuntimeError:  # a built-in hook the cell registered
                pass
        self.reducer = _NoRebuild(reducer, self, job)
        try:
            return original(self, *inputs, **kwargs)
        finally:
            self.reducer = reducer

    return _pre_forward


def _patch_group_calls(patches: _Patches, dist: Any, job: FakeJob) -> None:
    c10d: Any = sys.modules.get("torch.distributed.distributed_c10d")
    init = getattr(c10d, "init_process_group", None)
    destroy = getattr(c10d, "destroy_process_group", None)
    n = job.world_size

    if init is not None:

        def init_process_group(*args: Any, **kwargs: Any) -> None:
            job.say(f"the cell's init_process_group was answered by the fake group (rank 0 of {n})")

        patches.everywhere("init_process_group", init, init_process_group)
    if destroy is not None:

        def destroy_process_group(group: Any = None) -> None:
            if group is None or group is getattr(dist.group, "WORLD", None):
                return  # the job's own: taken down after the run
            destroy(group)

        patches.everywhere("destroy_process_group", destroy, destroy_process_group)
