"""One measured cell as the history keeps it: a few hundred bytes (``core/history.py``
keeps the last few hundred; the panel's history table and ``%gpumem history`` show them)."""

from __future__ import annotations

from typing import NamedTuple


class DeviceRow(NamedTuple):
    device: int
    allocated: int | None  # after the cell
    allocated_delta: int | None
    reserved: int | None
    reserved_delta: int | None
    peak_allocated: int | None
    peak_above_start: int | None
    outside_torch_delta: int | None
    device_allocs: int | None
    kept_at: str | None = None  # with tracking: the line that allocated most of what it kept
    # A worker process's device ("rank 1 (pid 4242)"); None: the kernel's own
    worker: str | None = None
    # Out-of-memory errors on the device: in the cell (the kernel's), or the worker's own
    # count at its last report
    ooms: int | None = None
    # A worker's OOM post-mortem on this device, in one line (reporters/_rows.py's
    # postmortem_line): the request, the largest free block, free memory, the cap, the
    # best fix
    oom: str | None = None


class HistoryRow(NamedTuple):
    execution_count: int | None
    time: float  # unix seconds at the cell's end
    first_line: str
    wall_time: float
    failed: bool
    host_rss_delta: int | None
    devices: tuple[DeviceRow, ...]
