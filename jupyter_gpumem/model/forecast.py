"""A forecast before the OOM: memory that grows steadily (by a constant amount or a constant
factor) cell after cell, and when it would reach the limit at that rate
(``analysis/forecast.py`` makes it; the rule is there)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# What allocated grows into: ``cap``, the cap set by ``set_per_process_memory_fraction``;
# ``device``, what the device has left: reserved (allocated plus the cache's free memory)
# plus the device's free memory.
LimitKind = Literal["cap", "device"]


@dataclass(frozen=True, slots=True)
class Forecast:
    """Allocated on one device (the kernel's, or one worker's) grows by about
    ``bytes_per_cell`` a measured cell: ``cells_left`` more cells reach ``limit``."""

    device: int
    worker: str | None  # "rank 1 (pid 4242)"; None: the kernel's own device
    bytes_per_cell: int  # the least-squares slope over the window; geometric: the next cell
    cells_left: int  # more cells of this growth that still fit under the limit
    seconds_left: float | None  # at the window's mean interval between cells; None unknown
    limit: int  # bytes allocated can reach
    limit_kind: LimitKind
    allocated: int  # after the last cell
    cells: int  # cells in the window the rate was fitted on (3 to 10)
    first_cell: int | None = None  # execution count of the window's first cell
    who: str | None = None  # with tracking: the line that allocated what grew
    factor: float | None = None  # a geometric growth: allocated multiplies by this a cell
