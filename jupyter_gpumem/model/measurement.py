"""One instant of the process: the allocator's figures and the device's, per device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .process import ProcessMemory
from .render import ShowsItself
from .workers import WorkerReport

State = Literal["ok", "no_torch", "cpu_only", "not_initialized", "no_gpu"]
BackendName = Literal["cuda", "rocm", "xpu", "mps", "nvml"]


@dataclass(slots=True)
class AllocatorStats:
    """What PyTorch's caching allocator says about one device (``memory_stats``)."""

    allocated: int  # bytes held by live tensors (allocated_bytes.all.current)
    reserved: int  # bytes obtained from cudaMalloc and kept (reserved_bytes.all.current)
    active: int  # allocated + freed-but-not-yet-reusable (stream-ordered frees)
    requested: int  # bytes the program asked for, before rounding
    inactive_split: int  # free pieces of split blocks: empty_cache can't return them
    peak_allocated: int  # since the last reset_peak_memory_stats (global per device)
    peak_reserved: int
    device_allocs: int  # cudaMalloc calls so far (num_device_alloc)
    device_frees: int  # cudaFree calls so far (num_device_free)
    alloc_retries: int  # cudaMalloc failed, cache flushed, retried (slow)
    ooms: int  # OutOfMemoryError raised by the allocator
    segments: int  # cudaMalloc'd segments currently held
    blocks: int  # live allocations (allocation.all.current)
    # highest inactive_split since the last peak reset: free pieces inside segments that
    # also hold live blocks, which a cap can't reclaim (the scan's fragmentation margin)
    peak_inactive_split: int = 0


@dataclass(frozen=True, slots=True)
class Limit:
    """A cap set by ``set_per_process_memory_fraction``."""

    fraction: float
    bytes: int


@dataclass(slots=True)
class DeviceSample:
    """One device, one instant."""

    index: int  # torch index, after CUDA_VISIBLE_DEVICES
    name: str
    backend: BackendName
    initialized: bool  # this process has a context here: allocator figures are valid
    allocator: AllocatorStats | None = None
    total: int | None = None  # device capacity
    device_used: int | None = None  # all processes: total - free
    process_used: int | None = None  # this process, from NVML; None when unknown
    limit: Limit | None = None
    error: str | None = None  # why some figures are missing
    # Child processes of this kernel using the device (NVML).
    children: tuple[ProcessMemory, ...] = ()

    @property
    def outside_torch(self) -> int | None:
        """Device memory this process uses beyond PyTorch's reservation.

        CUDA context, cuBLAS/cuDNN workspaces, NCCL, other libraries and anything allocated
        while caching was off. From NVML's per-process figure when known, else from the
        whole device's usage (which then includes other processes).
        """
        if self.allocator is None:
            return None
        used = self.process_used if self.process_used is not None else self.device_used
        if used is None:
            return None
        return used - self.allocator.reserved


@dataclass(frozen=True, slots=True)
class Replay:
    """Where replayed figures were recorded: the GPU and torch of the recording, not of
    this machine (a backend that replays a recording says so; live figures have none)."""

    gpu: str  # the recording's device name, "NVIDIA H200"
    torch_version: str | None  # the recording's torch, "2.11.0+cu130"
    recorded: str | None = None  # the day it was recorded, ISO 8601 ("2026-11-21")

    def describe(self, here: str | None = None) -> str:
        """One sentence for every view that shows replayed figures: ``replay: readings
        recorded on an NVIDIA H200 with torch 2.11.0+cu130 on 2026-11-21 are replayed;
        nothing here is measured on this machine (this kernel: torch 2.13.0+cpu)``.
        ``here``: this kernel's torch, read when the sentence is made (torch is often
        imported after the replay began): ``reporters/replay.py``."""
        gpu = self.gpu or "GPU"
        what = f"{_article(gpu)} {gpu}"
        if self.torch_version:
            what += f" with torch {self.torch_version}"
        if self.recorded:
            what += f" on {self.recorded}"
        tail = f" (this kernel: torch {here})" if here else ""
        return (
            f"replay: readings recorded on {what} are replayed; nothing here is measured on "
            f"this machine{tail}"
        )


def _article(name: str) -> str:
    """``an NVIDIA H200``, ``an AMD MI300X``, ``an Intel ...``, ``a Tesla T4``: letters
    spelled out (an acronym) sound as their names do."""
    first = name[:1]
    acronym = name[:2].isupper()
    vowel = first.upper() in "AEIOU" or (acronym and first in "FHLMNRSX")
    return "an" if vowel else "a"


@dataclass(slots=True)
class Measurement(ShowsItself):
    """The whole process at one instant."""

    time: float  # unix seconds
    clock: float  # perf_counter seconds, for intervals
    state: State
    message: str  # why ``state`` is not ``ok``, in the user's words; "" when ok
    torch_version: str | None
    host_rss: int | None
    caching: bool | None  # caching allocator switched on; None when not applicable
    devices: tuple[DeviceSample, ...] = ()
    # Worker processes of the notebook alive now, with their latest own figures (full
    # readings only: the panel, %gpumem).
    workers: tuple[WorkerReport, ...] = ()
    # Set when the figures are replayed from a recording, not measured on this machine.
    replay: Replay | None = None

    def device(self, index: int) -> DeviceSample | None:
        for d in self.devices:
            if d.index == index:
                return d
        return None
