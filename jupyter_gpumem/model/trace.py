"""One cell's allocations over time (``%%gpumem --trace``)."""

from __future__ import annotations

from dataclasses import dataclass

from .attribution import Site


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
