"""The one typed model of a measurement.

Collectors fill these records; reporters (text, HTML, DataFrame, panel protocol) only read
them. A :class:`Measurement` is the state of the process at one instant; a
:class:`CellReport` is the difference of two measurements plus the exact in-cell peaks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NamedTuple, TypedDict

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
    # highest inactive_split since the last peak reset: free pieces inside segments that
    # also hold live blocks, which a cap can't reclaim (the scan's fragmentation margin)
    peak_inactive_split: int = 0


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
    # Child processes of this kernel using the device (NVML): (pid, name, bytes).
    children: tuple[tuple[int, str, int], ...] = ()

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
            a.pop("peak_inactive_split", None)
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
                    "children": [{"pid": p, "name": n, "used": b} for p, n, b in d.children],
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

    def marker(self) -> dict[str, Any]:
        """The protocol's ``CellMarker``."""
        out: dict[str, Any] = {
            "execution_count": self.execution_count,
            "time": self.after.time,
            "wall_time": self.wall_time,
            "failed": self.failed,
            "first_line": self.first_line,
            "devices": [],
        }
        for d in self.devices:
            row: dict[str, Any] = {
                "index": d.index,
                "allocated_delta": d.allocated_delta or 0,
                "reserved_delta": d.reserved_delta or 0,
                "peak_allocated": d.peak_allocated,
            }
            attribution = self.device_attribution(d.index)
            if attribution is not None:
                row["kept_at"] = [s.to_dict() for s in attribution.lines[:3]]
            out["devices"].append(row)
        if self.postmortems:
            out["postmortems"] = [p.to_dict() for p in self.postmortems]
        return out


# -- the allocator's own snapshot (torch.cuda.memory._snapshot) ---------------------------
# Kept in PyTorch's own shape (dicts), typed here: converting tens of thousands of blocks
# into objects would cost more than the snapshot itself, and recorded snapshots (JSON,
# memory_viz pickles) then feed the analyses unchanged.


class Frame(TypedDict):
    filename: str
    line: int
    name: str


class Block(TypedDict):
    address: int
    size: int  # what the allocator counts (rounded)
    requested_size: int  # what the program asked for
    state: str  # "active_allocated", "active_pending_free" / "active_awaiting_free", "inactive"
    frames: list[Frame]  # innermost first; empty when nothing was recorded


class Segment(TypedDict, total=False):
    device: int
    address: int
    total_size: int
    allocated_size: int
    active_size: int
    requested_size: int
    stream: int
    segment_type: str  # "small" (2 MiB segments for <= 1 MiB blocks) or "large"
    is_expandable: bool
    blocks: list[Block]


@dataclass(frozen=True, slots=True)
class AllocatorSnapshot:
    """Every segment the caching allocator holds, with its blocks, at one instant."""

    time: float
    segments: Sequence[Segment]
    tracking: bool  # allocation sites were being recorded (blocks may carry frames)
    settings: dict[str, Any] = field(default_factory=dict)  # allocator_settings

    def device_segments(self, device: int) -> list[Segment]:
        return [s for s in self.segments if s.get("device", 0) == device]


ACTIVE = "active_allocated"


# -- where memory was allocated ----------------------------------------------------------
SiteKind = Literal["cell", "file", "library", "no_stack", "before_tracking"]


@dataclass(frozen=True, slots=True)
class Site:
    """Where a block was allocated, in the user's words.

    ``cell``: ``In[7] line 3``; ``file``: the user's own module, ``train.py:42``;
    ``library``: no user frame at all (the outermost library frame); ``no_stack``: the
    block has no Python frames (allocated by autograd's backward thread or C++ code);
    ``before_tracking``: alive since before tracking began.
    """

    kind: SiteKind
    filename: str = ""
    line: int = 0
    function: str = ""
    execution_count: int | None = None  # for cells
    text: str = ""  # the source line, stripped
    # the library frame this user line called into: "torch/nn/functional.py:2380 linear"
    library: str = ""

    @property
    def label(self) -> str:
        if self.kind == "cell":
            return f"In[{self.execution_count}] line {self.line}"
        if self.kind in ("file", "library"):
            return f"{short_path(self.filename)}:{self.line}"
        if self.kind == "before_tracking":
            return "allocated before tracking began"
        return "no Python stack (backward pass or C++)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "label": self.label,
            "execution_count": self.execution_count,
            "filename": self.filename,
            "line": self.line,
            "function": self.function,
            "text": self.text,
            "library": self.library,
        }


def short_path(path: str, parts: int = 2) -> str:
    """The last ``parts`` components of a path: ``torch/nn/functional.py``."""
    pieces = path.replace("\\", "/").split("/")
    return "/".join(pieces[-parts:]) if len(pieces) > parts else path


@dataclass(frozen=True, slots=True)
class LineShare:
    """Bytes alive at the end of a cell that one of its lines allocated."""

    line: int
    text: str
    bytes: int
    blocks: int
    site: Site  # the innermost user frame (may be a function defined elsewhere)

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "text": self.text, "bytes": self.bytes, "blocks": self.blocks}


@dataclass(frozen=True, slots=True)
class DeviceAttribution:
    """Where the blocks a cell allocated and left alive on one device come from."""

    device: int
    new_bytes: int  # bytes in blocks allocated during the cell and still alive
    lines: tuple[LineShare, ...]  # by line of the cell, largest first
    elsewhere: int  # new blocks whose stack does not pass through this cell's code
    no_stack: int  # new blocks without Python frames (backward pass, C++)


# -- who holds the memory -----------------------------------------------------------------
# How an owner reaches a storage; lower ranks win when several owners reach the same one.
VIA_RANK: dict[str, int] = {
    "tensor": 0,
    "parameters": 1,
    "buffers": 1,
    "attribute": 1,
    "container": 1,
    "gradients": 2,
    "optimizer state": 2,
    "autograd graph": 3,
    "optimizer params": 4,
    "output history": 5,
    "traceback": 6,
}


class Reference(NamedTuple):
    """One path from a name in the user's namespace to a tensor's storage. (A named tuple:
    a walk makes one per tensor it meets, tens of thousands.)"""

    device: int
    address: int  # untyped_storage().data_ptr()
    nbytes: int  # storage size (the allocator's block may be larger)
    owner: str  # "acts", "Out[7]", "traceback: f() h"
    via: str  # a key of VIA_RANK
    path: str  # "acts[3]", "model.fc1.weight.grad", "total.grad_fn._saved_self"
    order: int  # position of the owner's root in the walk (ties between equal ranks)

    @property
    def rank(self) -> tuple[int, int]:
        return (VIA_RANK.get(self.via, 9), self.order)


@dataclass(frozen=True, slots=True)
class WhoRow:
    key: str  # a variable ("acts"), a line ("In[7] line 3"), a cell ("In[7]")
    detail: str  # how it holds the memory, the line's text, ...
    bytes: int
    blocks: int
    example: str = ""  # a path to one of the tensors, or the top holder of a line
    # "owner", "site", "cell", "unreachable", "untracked", "rest" (the rows past n, summed)
    kind: str = ""
    site: str = ""  # by owner, with tracking: the line that allocated most of it

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "detail": self.detail,
            "bytes": self.bytes,
            "blocks": self.blocks,
            "example": self.example,
            "kind": self.kind,
            "site": self.site,
        }


@dataclass(frozen=True, slots=True)
class WhoReport:
    """Live GPU memory of one device, split by owner, allocation line or cell.

    The rows add up to ``allocated`` (the allocator's live blocks): what no name reaches,
    or what has no recorded site, is a row of its own.
    """

    device: int
    by: Literal["variable", "line", "cell"]
    allocated: int
    explained: int  # bytes of the rows that name an owner / a site
    rows: tuple[WhoRow, ...]
    tracking: bool
    notes: tuple[str, ...] = ()
    outside_allocator: int = 0  # reachable tensors whose memory the allocator doesn't own
    elapsed: float = 0.0  # seconds it took

    @property
    def explained_share(self) -> float:
        return self.explained / self.allocated if self.allocated else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "by": self.by,
            "allocated": self.allocated,
            "explained": self.explained,
            "rows": [r.to_dict() for r in self.rows],
            "tracking": self.tracking,
            "notes": list(self.notes),
            "outside_allocator": self.outside_allocator,
            "elapsed_ms": round(self.elapsed * 1000, 3),
        }


# -- after a failure ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TracebackHolding:
    frame: str  # "f() at In[9] line 4"
    name: str  # the local variable
    bytes: int
    blocks: int


@dataclass(frozen=True, slots=True)
class TracebackHoldings:
    """Tensors that the frames of the kept traceback (sys.last_traceback) hold."""

    holdings: tuple[TracebackHolding, ...]

    @property
    def bytes(self) -> int:
        return sum(h.bytes for h in self.holdings)


FixKind = Literal[
    "fragmentation", "cap", "traceback", "output_history", "graph", "other_process",
    "delete", "empty_cache", "smaller",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Fix:
    kind: FixKind
    text: str  # the whole sentence, numbers included
    frees: int | None  # bytes it would make available (None: not a matter of bytes)
    # Judged against what the cell needs, not the failed request alone: True when the whole
    # cell's need is known (a scan of it) and fits after this; None ("maybe") when it covers
    # what the cell needed up to the failure, or can't be told; False when it does not.
    fits: bool | None
    command: str = ""  # what to run, when there is one
    # A first step before any retry, not a fix: it frees memory of the failed run itself
    # (the kept traceback, names the failed cell bound), which a re-run allocates again.
    first_step: bool = False
    shortfall: int | None = None  # bytes still missing after it (when it does not fit)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "text": self.text,
            "frees": self.frees,
            "fits": self.fits,
            "command": self.command,
            "first_step": self.first_step,
            "shortfall": self.shortfall,
        }


@dataclass(frozen=True, slots=True)
class PostMortem:
    """Why an allocation failed, with numbers, and the fixes ranked by whether the failed
    request would fit after them."""

    device: int
    requested: int
    free: int  # free device memory (all processes) when it failed
    total: int | None
    cap: int | None  # the per-process cap, when one is set
    reserved: int
    allocated: int
    cached_free: int  # reserved - allocated
    releasable: int  # what empty_cache would return now (fully free segments)
    free_pieces: int  # free blocks inside segments that also hold live blocks
    free_pieces_bytes: int
    largest_free_block: int
    outside_torch: int | None  # this process beyond PyTorch (context, libraries)
    other_processes: tuple[tuple[int, str, int], ...]  # (pid, name, bytes)
    owners: tuple[WhoRow, ...]  # allocated by owner (top rows)
    lines: tuple[WhoRow, ...]  # allocated by line (top rows; empty without tracking)
    fixes: tuple[Fix, ...]  # first steps, then the best fix first
    execution_count: int | None = None  # the cell that failed
    time: float = 0.0  # when (unix seconds)
    # What the cell needs, against which every fix is judged: what it had allocated above
    # its start when it failed plus the failed request; the whole cell's need when a scan
    # of it says; and what PyTorch can use for it after the first steps.
    need: int | None = None
    need_full: int | None = None
    room: int | None = None
    hint: str = ""  # the largest value that fits (after a scan), or the scan to run

    def to_dict(self) -> dict[str, Any]:
        return {
            "execution_count": self.execution_count,
            "time": self.time,
            "device": self.device,
            "requested": self.requested,
            "free": self.free,
            "total": self.total,
            "cap": self.cap,
            "reserved": self.reserved,
            "allocated": self.allocated,
            "cached_free": self.cached_free,
            "releasable": self.releasable,
            "free_pieces": self.free_pieces,
            "free_pieces_bytes": self.free_pieces_bytes,
            "largest_free_block": self.largest_free_block,
            "outside_torch": self.outside_torch,
            "other_processes": [
                {"pid": p, "name": n, "bytes": b} for p, n, b in self.other_processes
            ],
            "owners": [r.to_dict() for r in self.owners],
            "lines": [r.to_dict() for r in self.lines],
            "fixes": [f.to_dict() for f in self.fixes],
            "need": self.need,
            "need_full": self.need_full,
            "room": self.room,
            "hint": self.hint,
        }


# -- one cell's allocations over time (%%gpumem --trace) ----------------------------------
@dataclass(frozen=True, slots=True)
class TraceAllocation:
    address: int
    size: int
    start: int  # index of its alloc event
    end: int | None  # index of its free event; None: alive when the cell ended
    site: Site
    cell_line: int | None  # the line of the traced cell that led to it
    text: str  # that line's code

    def alive_at(self, event: int) -> bool:
        return self.start <= event and (self.end is None or event < self.end)

    @property
    def label(self) -> str:
        if self.cell_line is not None:
            return f"line {self.cell_line}" + (f" `{self.text}`" if self.text else "")
        if self.site.kind in ("cell", "file", "library"):
            return self.site.label + (f" `{self.site.text}`" if self.site.text else "")
        return self.site.label


@dataclass(frozen=True, slots=True)
class Timeline:
    device: int
    base: int  # bytes allocated when the cell began
    times_us: tuple[int, ...]  # of each event
    active: tuple[int, ...]  # allocated bytes after each event
    allocations: tuple[TraceAllocation, ...]  # in the order they were made
    peak: int
    peak_event: int  # -1: no event
    entries: int  # trace entries of this device
    max_entries: int
    complete: bool  # every event of the cell is there
    snapshot_ms: float = 0.0

    @property
    def peak_above_start(self) -> int:
        return self.peak - self.base

    @property
    def duration_ms(self) -> float:
        return (self.times_us[-1] - self.times_us[0]) / 1000 if self.times_us else 0.0

    def alive_at_peak(self) -> list[TraceAllocation]:
        if self.peak_event < 0:
            return []
        alive = [a for a in self.allocations if a.alive_at(self.peak_event)]
        return sorted(alive, key=lambda a: (-a.size, a.start))

    def kept(self) -> list[TraceAllocation]:
        return [a for a in self.allocations if a.end is None]


@dataclass(frozen=True, slots=True)
class CellTrace:
    timelines: tuple[Timeline, ...]  # one per device the cell allocated on
    saved: str | None = None  # the memory_viz snapshot file written (--save)
    saved_bytes: int = 0
    note: str = ""  # why nothing was traced, or what went wrong


# -- what a step's peak is made of (%%gpumem --breakdown) ---------------------------------
Category = Literal[
    "parameters",
    "buffers",
    "gradients",
    "optimizer state",
    "activations",
    "temporaries",
    "kept from before",
    "block slack",
]
# The order a block's owner is decided in (a parameter that autograd also saved is a
# parameter), and the order views list the categories in.
CATEGORIES: tuple[Category, ...] = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer state",
    "activations",
    "temporaries",
    "kept from before",
    "block slack",
)
Phase = Literal["forward", "backward", "optimizer step", "other"]


@dataclass(frozen=True, slots=True)
class CategoryShare:
    """Bytes of one category alive at the peak. For parameters, buffers, gradients,
    optimizer state and activations: the tensors' storages rounded up to 512 B (what the
    allocator counts for them); the rest of their blocks is ``block slack``."""

    category: Category
    bytes: int
    blocks: int


@dataclass(frozen=True, slots=True)
class ModuleShare:
    """Bytes alive at the peak that one module made: the activations autograd saved while
    it ran, and the temporaries allocated while it ran (forward)."""

    module: str  # qualified name, "model.layers.3.attn"
    activations: int
    temporaries: int

    @property
    def bytes(self) -> int:
        return self.activations + self.temporaries


@dataclass(frozen=True, slots=True)
class Breakdown:
    """One device at the moment of a cell's peak allocated: what was alive then.

    ``categories`` add up to ``peak`` exactly: every block alive at the peak is counted
    once, in the first category of :data:`CATEGORIES` that owns it."""

    device: int
    peak: int  # allocated at the peak (replayed from the allocator's trace)
    base: int  # allocated when the cell began
    categories: tuple[CategoryShare, ...]
    phase: Phase  # what the cell was doing when the peak happened
    modules: tuple[ModuleShare, ...]  # largest first
    reserved_at_peak: int | None  # reserved by PyTorch at that moment
    outside_torch: int | None  # this process beyond PyTorch, when the cell ended
    exact: bool  # the replayed peak equals the allocator's own peak counter
    events: int  # allocations and frees the cell made on this device
    peak_event: int  # the allocation that reached the peak (1-based; 0: none)
    counter_peak: int | None = None  # the allocator's peak counter, for comparison
    note: str = ""  # why it is not exact, or what is missing

    def bytes_of(self, category: Category) -> int:
        for c in self.categories:
            if c.category == category:
                return c.bytes
        return 0

    @property
    def cached_free_at_peak(self) -> int | None:
        if self.reserved_at_peak is None:
            return None
        return self.reserved_at_peak - self.peak

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "peak": self.peak,
            "base": self.base,
            "categories": [
                {"category": c.category, "bytes": c.bytes, "blocks": c.blocks}
                for c in self.categories
            ],
            "phase": self.phase,
            "modules": [
                {"module": m.module, "activations": m.activations, "temporaries": m.temporaries}
                for m in self.modules
            ],
            "reserved_at_peak": self.reserved_at_peak,
            "outside_torch": self.outside_torch,
            "exact": self.exact,
            "events": self.events,
            "peak_event": self.peak_event,
            "counter_peak": self.counter_peak,
            "note": self.note,
        }


# -- the largest value that fits (%%gpumem --scan) ----------------------------------------
# What collectors/_step.py records while a --breakdown cell runs (plain records, so that
# analysis/breakdown.py can be tested on recorded data).
class Observed(NamedTuple):
    """One storage seen as belonging to a category at one point of the cell."""

    # allocations + frees on ``device`` since the cell began (the allocator's counters);
    # -1: not read, the point is ``time_ns`` (the trace's clock places it)
    position: int
    device: int
    address: int  # untyped_storage().data_ptr(): the block's address
    nbytes: int  # the storage's size
    category: str  # parameters, buffers, gradients, optimizer state, activations
    module: str = ""  # activations: the module that was running when autograd saved it
    time_ns: int = 0  # unix nanoseconds (time.time_ns) when it was seen


class Mark(NamedTuple):
    positions: Mapping[int, int]  # device -> position
    phase: str  # the phase that begins here: forward, backward, optimizer step, other


class ModuleCall(NamedTuple):
    """One module's forward call, in unix nanoseconds (``time.time_ns``): reading the
    allocator's counters costs ~12 us, a clock 50 ns, and the trace's own clock places the
    call among the allocations (analysis/breakdown.py)."""

    name: str
    start_ns: int
    end_ns: int | None  # None: it never returned


@dataclass
class StepRecord:
    """Everything the hooks of one ``--breakdown`` cell saw."""

    observations: list[Observed] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    calls: list[ModuleCall] = field(default_factory=list)
    end_positions: dict[int, int] = field(default_factory=dict)
    saved: int = 0  # tensors autograd saved (on any device)
    # The allocator's segments with their blocks when the cell began (the snapshot's own
    # dicts, trimmed to device, address, total_size and blocks' address, size, state).
    begin_segments: list[dict[str, Any]] = field(default_factory=list)


RunKind = Literal["probe", "repeat", "verify"]


@dataclass(frozen=True, slots=True)
class ScanRun:
    """One run of the scanned cell (or function) at one value, measured as ``%%gpumem``
    measures a cell."""

    value: float
    kind: RunKind  # probe; repeat (the first probe again, its state now built); verify
    ok: bool
    error: str | None  # "OutOfMemoryError: CUDA out of memory. ..."; None when ok
    oom: bool
    base: int  # allocated when the run began
    peak_allocated: int | None  # exact, from the allocator's counters
    peak_reserved: int | None
    kept: int  # allocated after the run's names were dropped, minus before the scan
    cap: int | None  # the cap the run ran under (verification)
    wall_time: float  # seconds
    # the highest non-releasable free space of the run (free pieces of segments that also
    # hold live blocks: inactive_split's peak), which a cap can't reclaim
    fragmentation: int | None = None
    request: int | None = None  # the allocation that ran out of memory

    @property
    def margin(self) -> int | None:
        """What the allocator needed beyond the tensors: reserved beyond allocated at the
        peaks, but no more than the free pieces of segments that also held live blocks
        (the only cached memory a cap can't reclaim). Measured on an H100: reserved minus
        allocated alone made a CNN's prediction 14 % too low, this 1.4 %."""
        if self.peak_allocated is None or self.peak_reserved is None:
            return None
        cached = max(0, self.peak_reserved - self.peak_allocated)
        if self.fragmentation is None:
            return cached
        return min(cached, self.fragmentation)


FitKind = Literal["affine", "quadratic"]


@dataclass(frozen=True, slots=True)
class Fit:
    """peak(x) = a + b·x (+ c·x²), least squares over the probe runs."""

    kind: FitKind
    a: float
    b: float
    c: float
    xs: tuple[float, ...]
    ys: tuple[int, ...]
    residuals: tuple[float, ...]  # measured minus fitted, bytes, per point

    def __call__(self, x: float) -> float:
        return self.a + self.b * x + self.c * x * x


@dataclass(frozen=True, slots=True)
class Target:
    """The memory a run must fit in."""

    bytes: int  # the card's memory (--fit-in), or what PyTorch may use here (default)
    label: str  # "24 GiB", "T4 (15360 MiB)", "free on cuda:0 now"
    source: str  # where the number comes from
    whole_card: bool  # True: a card's total, from which this process's overhead is taken


@dataclass(frozen=True, slots=True)
class ScanResult:
    """``%%gpumem --scan`` / ``jupyter_gpumem.scan``: runs, fit, prediction, verification."""

    name: str  # the scanned variable ("batch")
    device: int
    runs: tuple[ScanRun, ...]
    target: Target
    outside_torch: int  # this process beyond PyTorch, measured before the runs
    cap: int  # what PyTorch may reserve: the target minus outside_torch (or free now)
    margin: int  # largest reserved-beyond-allocated of the probe runs
    budget: int  # for the peak allocated: cap - margin
    fit: Fit | None
    predicted: float | None  # largest value whose fitted peak is within the budget
    verified: float | None  # largest value that ran under the cap (None: not verified)
    verify_note: str  # how verification went, in words
    answer: str  # the one-line answer
    integer: bool  # the values are whole numbers
    execution_count: int | None = None  # the cell scanned (None: scan(fn))
    code: str = ""  # the scanned cell's body
    notes: tuple[str, ...] = ()  # what may make the prediction wrong

    @property
    def probes(self) -> tuple[ScanRun, ...]:
        return tuple(r for r in self.runs if r.kind != "verify")

    @property
    def verifications(self) -> tuple[ScanRun, ...]:
        return tuple(r for r in self.runs if r.kind == "verify")

    @property
    def largest(self) -> float | None:
        """The answer: verified when verification ran, else the prediction."""
        return self.verified if self.verified is not None else self.predicted

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from .reporters.scan import scan_html, scan_text

        return {"text/plain": scan_text(self), "text/html": scan_html(self)}
