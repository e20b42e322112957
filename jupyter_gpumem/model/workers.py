"""Worker processes of a notebook: their own allocator figures, per rank and device.

A notebook that trains on several GPUs starts worker processes (accelerate's
``notebook_launcher``, ``torch.multiprocessing`` with ``fork``). Each worker has its own
caching allocator; the kernel sees it only through what the worker reports
(``collectors/workers/``). These records are what a cell's report, the history and the
panel show of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .postmortem import PostMortem
    from .process import OomEvent
    from .snapshot import AllocatorSnapshot, Segment

# exited: its last report came at its exit; running: still reporting at the cell's end;
# silent: started reporting, then stopped without a last report (killed, hung, or its
# reports were dropped).
WorkerStatus = Literal["exited", "running", "silent"]


@dataclass(frozen=True, slots=True)
class WorkerDevice:
    """One device of one worker: its allocator's figures, exact (the worker's own)."""

    index: int  # the worker's torch index (after its CUDA_VISIBLE_DEVICES)
    name: str
    allocated_before: int  # when the cell began (0: the worker started inside the cell)
    allocated: int  # at the worker's last report
    reserved: int
    peak_allocated: int  # the worker's own peak counter
    peak_reserved: int
    ooms: int
    device_allocs: int  # cudaMalloc calls
    # The worker started inside the cell, so its process-wide peak is the cell's peak;
    # for a worker from an earlier cell it is an upper bound.
    peak_exact: bool

    @property
    def allocated_delta(self) -> int:
        return self.allocated - self.allocated_before


@dataclass(frozen=True, slots=True)
class WorkerOomSnapshot:
    """What a worker's own OOM observer saw at the failure, as its snapshot file carried
    it (checked field by field where it arrived): the request, the device's figures, the
    segments of the failing device with their blocks, and the top allocation sites when
    the worker recorded them."""

    device: int
    requested: int
    allowed: int  # the device's total, or the cap
    free: int  # free device memory (cudaMemGetInfo) at the failure
    total: int | None
    device_used: int | None  # all processes: total - free
    process_used: int | None  # the worker itself (NVML), when known
    segments: tuple[Segment, ...]  # torch's shape; blocks carry no frames
    lines: tuple[tuple[str, int, int], ...] = ()  # (site, bytes, blocks), largest first
    tracking: bool = False  # the worker recorded allocation sites
    expandable_segments: bool | None = None  # the allocator's setting, where it says
    trimmed: bool = False  # the worker dropped sites or merged live blocks to fit the cap


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """One worker process during one cell."""

    pid: int
    rank: int | None  # torch.distributed's rank, else $RANK / $LOCAL_RANK, else None
    world_size: int | None
    host: str
    status: WorkerStatus
    started_in_cell: bool
    age: float  # seconds between the worker's last report and the cell's end
    devices: tuple[WorkerDevice, ...]
    ooms: tuple[OomEvent, ...] = ()  # what its allocator's OOM observer saw
    via: Literal["fork", "spawn", "store", "ray"] = "fork"
    # The worker's last OOM as its own snapshot showed it (once, in the first cell that
    # ends after it arrived), and the post-mortem the kernel made of it.
    oom_snapshot: WorkerOomSnapshot | None = None
    postmortem: PostMortem | None = None

    @property
    def label(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "worker"
        if self.via == "ray":  # a Ray worker may run on any node of the cluster
            return f"ray {who} (pid {self.pid} on {self.host})"
        return f"{who} (pid {self.pid})"

    @property
    def peak_allocated(self) -> int:
        return max((d.peak_allocated for d in self.devices), default=0)


@dataclass(frozen=True, slots=True)
class WorkerSegments:
    """A worker's own allocator snapshot, taken on request (``%gpumem segments --rank``)
    and handed over as a file (checked field by field where it arrived): its segments
    and blocks; blocks carry no frames."""

    worker: WorkerReport  # the worker asked, as its latest report showed it
    snapshot: AllocatorSnapshot
    trimmed: bool = False  # runs of adjacent live blocks were merged to fit the file's cap
    # Why this worker among several of the rank asked for (""; two jobs share rank numbers)
    note: str = ""

    @property
    def title(self) -> str:
        """``rank 1 (pid 4242 on gpu-node)``: what its segment map is titled with."""
        w = self.worker
        who = f"rank {w.rank}" if w.rank is not None else "worker"
        return f"{who} (pid {w.pid} on {w.host})"
