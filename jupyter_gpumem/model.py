"""The one typed model of a measurement.

Collectors fill these records; reporters (text, HTML, DataFrame, panel protocol) only read
them. A :class:`Measurement` is the state of the process at one instant; a
:class:`CellReport` is the difference of two measurements plus the exact in-cell peaks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

State = Literal["ok", "no_torch", "cpu_only", "not_initialized", "no_gpu"]
Backend = Literal["cuda", "rocm", "xpu", "mps", "nvml"]


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class Limit:
    """A cap set by ``set_per_process_memory_fraction``."""

    fraction: float
    bytes: int


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """One device, one instant."""

    index: int  # torch index, after CUDA_VISIBLE_DEVICES
    name: str
    backend: Backend
    initialized: bool  # this process has a context here: allocator figures are valid
    allocator: AllocatorStats | None = None
    total: int | None = None  # device capacity
    device_used: int | None = None  # all processes: total - free
    process_used: int | None = None  # this process, from NVML; None when unknown
    limit: Limit | None = None
    error: str | None = None  # why some figures are missing

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

    @property
    def outside_torch_is_process(self) -> bool:
        return self.process_used is not None


@dataclass(frozen=True, slots=True)
class Measurement:
    """The whole process at one instant."""

    time: float  # unix seconds
    clock: float  # perf_counter seconds, for intervals
    state: State
    message: str  # why ``state`` is not ``ok``, in the user's words; "" when ok
    torch_version: str | None
    host_rss: int | None
    caching: bool | None  # caching allocator switched on; None when not applicable
    devices: tuple[DeviceSample, ...] = ()

    def device(self, index: int) -> DeviceSample | None:
        for d in self.devices:
            if d.index == index:
                return d
        return None

    def to_dict(self) -> dict[str, Any]:
        """The protocol's ``Sample`` (docs/protocol.md)."""
        devices = []
        for d in self.devices:
            a = asdict(d.allocator) if d.allocator is not None else dict.fromkeys(_ALLOC_FIELDS)
            a.pop("segments", None)
            a.pop("blocks", None)
            devices.append(
                {
                    "index": d.index,
                    "name": d.name,
                    "backend": d.backend,
                    "initialized": d.initialized,
                    **a,
                    "total": d.total,
                    "device_used": d.device_used,
                    "process_used": d.process_used,
                    "limit": asdict(d.limit) if d.limit is not None else None,
                    "error": d.error,
                }
            )
        return {
            "time": self.time,
            "state": self.state,
            "message": self.message,
            "torch_version": self.torch_version,
            "host_rss": self.host_rss,
            "caching": self.caching,
            "devices": devices,
        }


_ALLOC_FIELDS = [f for f in AllocatorStats.__dataclass_fields__]


@dataclass(frozen=True, slots=True)
class OomEvent:
    """What the allocator's OOM observer saw just before raising OutOfMemoryError."""

    device: int
    requested: int  # bytes the failing allocation asked for
    allowed: int  # device total, or the cap when one is set
    free: int  # free device memory at that moment


@dataclass(frozen=True, slots=True)
class DeviceCellReport:
    """What one cell did to one device."""

    before: DeviceSample
    after: DeviceSample
    # Exact in-cell peaks from the allocator's own counters (reset before the cell).
    # With --keep-peak they are exact only when the cell set a new global peak; otherwise
    # they are an upper bound and ``peak_exact`` is False.
    peak_allocated: int | None
    peak_reserved: int | None
    peak_exact: bool

    @property
    def index(self) -> int:
        return self.after.index

    @property
    def name(self) -> str:
        return self.after.name

    def _alloc(self, attr: str) -> int | None:
        a, b = self.after.allocator, self.before.allocator
        if a is None:
            return None
        return int(getattr(a, attr)) - (int(getattr(b, attr)) if b is not None else 0)

    @property
    def allocated_delta(self) -> int | None:
        return self._alloc("allocated")

    @property
    def reserved_delta(self) -> int | None:
        return self._alloc("reserved")

    @property
    def device_allocs(self) -> int | None:
        return self._alloc("device_allocs")

    @property
    def device_frees(self) -> int | None:
        return self._alloc("device_frees")

    @property
    def alloc_retries(self) -> int | None:
        return self._alloc("alloc_retries")

    @property
    def ooms(self) -> int | None:
        return self._alloc("ooms")

    @property
    def peak_above_start(self) -> int | None:
        """How far the allocated peak rose above what was allocated when the cell began."""
        if self.peak_allocated is None:
            return None
        start = self.before.allocator.allocated if self.before.allocator is not None else 0
        return self.peak_allocated - start

    @property
    def device_used_delta(self) -> int | None:
        # A device that got its context in the cell has NVML figures before and
        # cudaMemGetInfo figures after: different definitions, not comparable.
        if self.after.device_used is None or self.before.device_used is None:
            return None
        if self.before.initialized != self.after.initialized:
            return None
        return self.after.device_used - self.before.device_used

    @property
    def process_used_delta(self) -> int | None:
        if self.after.process_used is None:
            return None
        if not self.before.initialized:
            return self.after.process_used  # no context before: this process used nothing
        if self.before.process_used is None:
            return None
        return self.after.process_used - self.before.process_used

    @property
    def outside_torch_delta(self) -> int | None:
        """Change of device memory used beyond PyTorch's reservation during the cell.

        Uses this process's NVML figure when known at both ends, else the whole device.
        A cell that created the CUDA context, loaded cuBLAS, or allocated while caching was
        off shows here and nowhere in PyTorch's counters.
        """
        used = self.process_used_delta
        if used is None:
            used = self.device_used_delta
        if used is None:
            return None
        return used - (self.reserved_delta or 0)


@dataclass(frozen=True, slots=True)
class CellReport:
    """What one cell did to GPU memory: the difference of two measurements plus peaks."""

    execution_count: int | None
    first_line: str
    before: Measurement
    after: Measurement
    devices: tuple[DeviceCellReport, ...]
    wall_time: float  # seconds
    failed: bool
    error: str | None  # "KeyboardInterrupt", "OutOfMemoryError: CUDA out of memory...", ...
    ooms: tuple[OomEvent, ...] = ()
    hints: tuple[str, ...] = field(default=())

    @property
    def host_rss_delta(self) -> int | None:
        if self.after.host_rss is None or self.before.host_rss is None:
            return None
        return self.after.host_rss - self.before.host_rss

    def device(self, index: int) -> DeviceCellReport | None:
        for d in self.devices:
            if d.index == index:
                return d
        return None

    def marker(self) -> dict[str, Any]:
        """The protocol's ``CellMarker``."""
        return {
            "execution_count": self.execution_count,
            "time": self.after.time,
            "wall_time": self.wall_time,
            "failed": self.failed,
            "first_line": self.first_line,
            "devices": [
                {
                    "index": d.index,
                    "allocated_delta": d.allocated_delta or 0,
                    "reserved_delta": d.reserved_delta or 0,
                    "peak_allocated": d.peak_allocated,
                }
                for d in self.devices
            ],
        }
