"""Planning: what a step's peak is made of (``--breakdown``) and the largest value that
fits (``--scan``), with the plain records the breakdown's hooks make."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from .render import ShowsItself

Category = Literal[
    "parameters",
    "buffers",
    "gradients",
    "optimizer state",
    "activations",
    "library workspaces",
    "temporaries",
    "kept from before",
    "block slack",
]
# The order a block's owner is decided in (a parameter that autograd also saved is a
# parameter), and the order views list the categories in. "library workspaces" (cuBLAS's,
# taken from the caching allocator) is a dry run's (analysis/dry_breakdown.py): a measured
# breakdown counts them as temporaries or kept from before.
CATEGORIES: tuple[Category, ...] = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer state",
    "activations",
    "library workspaces",
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
class Breakdown(ShowsItself):
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


# What collectors/step.py records while a --breakdown cell runs (plain records, so that
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
class ScanPhase:
    """The allocator's peaks while a scanned run was in one phase of a step (forward,
    backward, optimizer step, other), read between the phase marks of
    ``collectors/phase_peaks.py``'s :class:`PhasePeaks`: each phase's peak is fitted on its own,
    since the phase that makes a step's peak can change with the scanned value."""

    phase: str
    peak_allocated: int
    peak_reserved: int
    fragmentation: int  # inactive_split's peak in that phase


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
    phases: tuple[ScanPhase, ...] = ()  # the peaks of each phase (empty: not known)
    # reserved when the run ended: for a run out of memory, when it failed (what the
    # allocator still held after freeing its cache and retrying), its tensors still alive
    held: int | None = None

    @property
    def peak_phase(self) -> str | None:
        """The phase the run's peak allocated fell in (None: phases not known)."""
        if not self.phases:
            return None
        return max(self.phases, key=lambda p: p.peak_allocated).phase

    def phase_peak(self, phase: str) -> int | None:
        for p in self.phases:
            if p.phase == phase:
                return p.peak_allocated
        return None

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
    """peak(x) = a + b·x (+ c·x²), least squares over the probe runs.

    With ``phases`` (each phase's peak fitted on its own, when the runs' phases are known)
    the peak is the largest of the phases' fitted peaks: ``fit(x)`` is that maximum, and
    ``kind``, ``a``, ``b``, ``c`` and ``phase`` are those of the phase that binds at the
    prediction; ``ys`` are the whole runs' peaks and ``residuals`` theirs."""

    kind: FitKind
    a: float
    b: float
    c: float
    xs: tuple[float, ...]
    ys: tuple[int, ...]
    residuals: tuple[float, ...]  # measured minus fitted, bytes, per point
    phase: str = ""  # the phase whose peak this curve fits ("": the whole run's peak)
    phases: tuple[Fit, ...] = ()  # one curve per phase; the peak is their maximum

    def __call__(self, x: float) -> float:
        if self.phases:
            return max(f(x) for f in self.phases)
        return self.a + self.b * x + self.c * x * x


@dataclass(frozen=True, slots=True)
class Target:
    """The memory a run must fit in."""

    bytes: int  # the card's memory (--fit-in), or what PyTorch may use here (default)
    label: str  # "24 GiB", "T4 (15360 MiB)", "free on cuda:0 now"
    source: str  # where the number comes from
    whole_card: bool  # True: a card's total, from which this process's overhead is taken


@dataclass(frozen=True, slots=True)
class ScanResult(ShowsItself):
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
    def verify_failed(self) -> bool:
        """Verification ran and no value ran under the cap: nothing is known to fit (and
        the prediction is known not to)."""
        return self.verified is None and bool(self.verifications)

    @property
    def smallest_failed(self) -> float | None:
        """The smallest value that ran out of memory under the cap, if any did."""
        return min((r.value for r in self.verifications if r.oom), default=None)

    @property
    def largest(self) -> float | None:
        """The answer: the verified value when verification ran; None when it ran and every
        value tried ran out of memory; the prediction when it did not run."""
        if self.verified is not None:
            return self.verified
        if self.verify_failed:
            return None
        return self.predicted


@dataclass(frozen=True, slots=True)
class DryRunDevice:
    """One device of a dry run: what the model of the caching allocator predicts for the
    storages the cell made, and what it adds beside them."""

    device: int
    peak_allocated: int  # the model's peak of allocated (blocks of live tensors)
    peak_reserved: int  # the model's peak of reserved (segments from cudaMalloc)
    workspaces: int  # cuBLAS/cuBLASLt workspaces in it, taken from the caching allocator
    requests: int  # allocations the cell made (storages and workspaces)
    segments: int  # cudaMalloc calls the model made
    out_of_memory: str | None = None  # under a cap: the request the model could not place
    # what the predicted peak allocated is made of (categories, phase, modules; exact=False,
    # note says predicted); None when not computed (a scan's dry runs, hand-made events)
    breakdown: Breakdown | None = None
    # the kernel's tensors the cell used (a model built in an earlier cell, its optimizer
    # state): held from the cell's start, counted in the peaks above
    held: int = 0
    # what the kernel holds on this device that the cell never used: counted in the peaks
    # only with ``untouched_counted`` (``--count-untouched``)
    untouched: int = 0
    untouched_counted: bool = False


@dataclass(frozen=True, slots=True)
class DryRunCheck:
    """``--dry-run --check``: the same cell run for real afterwards, its allocator's own
    figures beside the prediction."""

    device: int
    peak_allocated: int  # measured, above the cell's start
    peak_reserved: int  # measured, above the cell's start
    ran: bool  # False: it did not run (why in ``note``)
    note: str = ""
    # what the measured peak was made of (``--breakdown``'s record of the real run), to
    # put beside the predicted categories; None when the breakdown could not be taken
    breakdown: Breakdown | None = None


@dataclass(frozen=True, slots=True)
class DryRun(ShowsItself):
    """``%%gpumem --dry-run`` / ``jupyter_gpumem.dry_run``: a cell's step predicted without
    a byte of device memory: the cell ran under FakeTensorMode, its storages were replayed
    through a model of PyTorch's caching allocator."""

    devices: tuple[DryRunDevice, ...]
    outside: int | None  # the CUDA context and libraries beside PyTorch, per process
    outside_source: str  # measured here, or from which table
    target: Target | None  # --fit-in
    seconds: float  # how long the dry run took
    world_size: int = 1  # the job the cell ran as rank 0 of
    notes: tuple[str, ...] = ()  # what it could not see, one plain line each
    stopped: str | None = None  # why the cell stopped before its end (then a lower bound)
    execution_count: int | None = None
    code: str = ""
    checks: tuple[DryRunCheck, ...] = ()
    torch_version: str | None = None
    # --fit-in: the model replayed under the target's cap (the card minus the memory beside
    # PyTorch) placed every request (True) or ran out (False); None without a target or
    # when the run stopped early. ``headroom``: cap minus the capped peak reserved, or
    # minus the uncapped one (negative: short by that much).
    fits: bool | None = None
    headroom: int | None = None
    # who holds what the cell found on the device, largest first: ("gpt's parameters", B)
    held_by: tuple[tuple[str, int], ...] = ()
    # what the run's ops take that it could not size (cuDNN's convolution workspaces): the
    # peaks and the need are lower bounds by that much
    unseen: tuple[str, ...] = ()

    @property
    def peak_reserved(self) -> int:
        return max((d.peak_reserved for d in self.devices), default=0)

    @property
    def held(self) -> int:
        """What the cell found on its busiest device and used, held from its start."""
        busiest = max(self.devices, key=lambda d: d.peak_reserved, default=None)
        return busiest.held if busiest is not None else 0

    @property
    def need(self) -> int | None:
        """What one process needs on its busiest device, in a fresh process: predicted
        peak reserved plus the memory beside PyTorch (None when that is not known)."""
        if self.outside is None:
            return None
        return self.peak_reserved + self.outside


@dataclass(frozen=True, slots=True)
class DryScanPoint:
    """One value a dry-run scan predicted."""

    value: float
    peak_allocated: int  # predicted, busiest device
    peak_reserved: int  # predicted, busiest device, no cap
    need: int | None  # peak reserved plus the memory beside PyTorch
    fits: bool | None  # under the target's cap, as the allocator model placed it
    stopped: str | None = None  # the dry run could not see the whole cell


@dataclass(frozen=True, slots=True)
class DryScan(ShowsItself):
    """``%%gpumem --scan NAME=V1,V2 --dry-run``: the largest value that fits a target,
    found by bisection on dry runs' predictions; nothing runs on the GPU."""

    name: str
    target: Target
    outside: int  # beside PyTorch, per process
    outside_source: str
    points: tuple[DryScanPoint, ...]  # in the order they were predicted
    largest: float | None  # the largest value predicted to fit (None: none of them)
    smallest_failing: float | None  # the smallest predicted not to fit (None: none)
    integer: bool
    seconds: float
    execution_count: int | None = None
    notes: tuple[str, ...] = ()
    world_size: int = 1  # each dry run as rank 0 of a job of this many processes
    # what the cell found on the device and used (the first value's run), held from the
    # cell's start in each value's need, largest first: ("gpt's parameters", B)
    held_by: tuple[tuple[str, int], ...] = ()
    # what the runs' ops take that they could not size: the largest is an upper bound
    unseen: tuple[str, ...] = ()
