"""The one typed model of a measurement, by topic.

Collectors fill these records; analyses derive more records from them; reporters (text,
HTML, DataFrame, panel protocol) only read them. A :class:`Measurement` is the state of
the process at one instant; a :class:`CellReport` is the difference of two measurements
plus the exact in-cell peaks and what the analyses found.

- ``measurement``: devices and the process at one instant
- ``process``: a process's memory on a device, an OOM its allocator reported
- ``cell``: what one cell did
- ``history``: a measured cell as the history keeps it
- ``snapshot``: the allocator's segments and blocks; free space; the segment map
- ``attribution``: where memory was allocated, who holds it
- ``postmortem``: after a failure
- ``trace``: one cell's allocations over time
- ``planning``: a step's breakdown, scans
- ``workers``: worker processes' own figures, per rank and device
- ``forecast``: memory that grows cell after cell, and when it would run out
- ``run_diff``: two runs of a notebook compared cell by cell
- ``render``: records that show themselves (the views register)

Records are values: nothing changes one once it is made. Most are frozen dataclasses. The
few made on every measured cell (``AllocatorStats``, ``DeviceSample``, ``Measurement``,
``DeviceCellReport``, ``CellReport``) are plain slotted dataclasses instead: a frozen
dataclass's ``__init__`` stores each field through ``object.__setattr__``, five times the
cost of a plain store, which came to 10 us of a cell's 30 us of bookkeeping. They are
therefore not hashable; the only code that sets a field is the one making the record
(``core.tracker.with_hints``, while the report is being made).
"""

from __future__ import annotations

from .attribution import (
    VIA_RANK,
    DeviceAttribution,
    LineShare,
    Reference,
    Site,
    SiteKind,
    Via,
    WhoReport,
    WhoRow,
    WhoRowKind,
    short_path,
)
from .cell import (
    CellReport,
    DeviceCellReport,
    Failed,
)
from .forecast import Forecast, LimitKind
from .history import DeviceRow, HistoryRow
from .measurement import (
    AllocatorStats,
    BackendName,
    DeviceSample,
    Limit,
    Measurement,
    Replay,
    State,
)
from .planning import (
    CATEGORIES,
    Breakdown,
    Category,
    CategoryShare,
    DryRun,
    DryRunCheck,
    DryRunDevice,
    DryScan,
    DryScanPoint,
    Fit,
    FitKind,
    Mark,
    ModuleCall,
    ModuleShare,
    Observed,
    Phase,
    RunKind,
    ScanResult,
    ScanRun,
    StepRecord,
    Target,
)
from .postmortem import (
    Fix,
    FixKind,
    PostMortem,
    TracebackHolding,
    TracebackHoldings,
)
from .process import OomEvent, ProcessMemory
from .run_diff import (
    CellDiff,
    CellRef,
    DeviceDiff,
    FigureChange,
    Judged,
    MatchKind,
    Outcome,
    RunDiff,
    Spread,
    Tolerance,
    Why,
    WhyKind,
)
from .snapshot import (
    ACTIVE,
    AllocatorSnapshot,
    Block,
    BlockKind,
    BlockState,
    BlockView,
    Frame,
    FreeSpace,
    Pool,
    Segment,
    SegmentMap,
    SegmentView,
)
from .trace import (
    CellTrace,
    Timeline,
    TraceAllocation,
)
from .workers import (
    WorkerDevice,
    WorkerOomSnapshot,
    WorkerReport,
    WorkerSegments,
    WorkerStatus,
)

__all__ = [
    "ACTIVE",
    "CATEGORIES",
    "VIA_RANK",
    "AllocatorSnapshot",
    "AllocatorStats",
    "BackendName",
    "Block",
    "BlockKind",
    "BlockState",
    "BlockView",
    "Breakdown",
    "Category",
    "CategoryShare",
    "CellDiff",
    "CellRef",
    "CellReport",
    "CellTrace",
    "DeviceAttribution",
    "DeviceCellReport",
    "DeviceDiff",
    "DeviceRow",
    "DeviceSample",
    "DryRun",
    "DryRunCheck",
    "DryRunDevice",
    "DryScan",
    "DryScanPoint",
    "Failed",
    "FigureChange",
    "Fit",
    "FitKind",
    "Fix",
    "FixKind",
    "Forecast",
    "Frame",
    "FreeSpace",
    "HistoryRow",
    "Judged",
    "Limit",
    "LimitKind",
    "LineShare",
    "Mark",
    "MatchKind",
    "Measurement",
    "ModuleCall",
    "ModuleShare",
    "Observed",
    "OomEvent",
    "Outcome",
    "Phase",
    "Pool",
    "PostMortem",
    "ProcessMemory",
    "Reference",
    "Replay",
    "RunDiff",
    "RunKind",
    "ScanResult",
    "ScanRun",
    "Segment",
    "SegmentMap",
    "SegmentView",
    "Site",
    "SiteKind",
    "Spread",
    "State",
    "StepRecord",
    "Target",
    "Timeline",
    "Tolerance",
    "TraceAllocation",
    "TracebackHolding",
    "TracebackHoldings",
    "Via",
    "WhoReport",
    "WhoRow",
    "WhoRowKind",
    "Why",
    "WhyKind",
    "WorkerDevice",
    "WorkerOomSnapshot",
    "WorkerReport",
    "WorkerSegments",
    "WorkerStatus",
    "short_path",
]
