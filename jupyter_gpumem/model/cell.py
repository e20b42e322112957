"""What one cell did to GPU memory: two measurements, the exact peaks between them, and
what the analyses found (attribution, post-mortem, trace, breakdown)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .attribution import DeviceAttribution
from .forecast import Forecast
from .measurement import DeviceSample, Measurement
from .planning import Breakdown
from .postmortem import PostMortem, TracebackHoldings
from .process import OomEvent
from .render import ShowsItself
from .trace import CellTrace
from .workers import WorkerReport


@dataclass(frozen=True, slots=True)
class Failed:
    """Something a cell needed that did not start (its trace, a breakdown's hooks), and
    why, in words."""

    note: str


@dataclass(slots=True)
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


@dataclass(slots=True)
class CellReport(ShowsItself):
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
    # With allocation tracking on: where the memory this cell kept was allocated.
    attribution: tuple[DeviceAttribution, ...] = ()
    # When the cell raised OutOfMemoryError: what filled the device and which fix fits.
    postmortems: tuple[PostMortem, ...] = ()
    # When the cell failed: tensors that the kept traceback's frames hold.
    traceback: TracebackHoldings | None = None
    # %%gpumem --trace: the cell's allocations over time.
    trace: CellTrace | None = None
    # %%gpumem --breakdown: what each device's peak was made of; the note says why there
    # is none (None: not asked for).
    breakdowns: tuple[Breakdown, ...] = ()
    breakdown_note: str | None = None
    # Worker processes started by (or reporting during) the cell: their own allocators.
    workers: tuple[WorkerReport, ...] = ()
    # Allocated grew steadily over the last cells: when it would reach the limit at that
    # rate (analysis/forecast.py), one per growing device, the kernel's and workers'.
    forecasts: tuple[Forecast, ...] = ()

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

    def device_attribution(self, index: int) -> DeviceAttribution | None:
        for a in self.attribution:
            if a.device == index:
                return a
        return None
