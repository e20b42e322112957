"""A forecast before the OOM: allocated memory that grows steadily, cell after cell, and
how many more cells (and how long) until it reaches the limit at that rate.

A loop that keeps a little memory per cell (a list of outputs, a loss with its graph, a
cache that never evicts) runs out of memory hours later. This module says so early, from
the history's rows alone (pure: plain records in, a :class:`~jupyter_gpumem.model.Forecast`
or None out; tests feed it recorded and hand-made series).

**The series.** One device at a time: the kernel's own device, or one worker process's
device (history rows carry both; a worker's rows name it, ``rank 1 (pid 4242)``). Each
measured cell gives a point (execution count, unix time at the cell's end, allocated
after the cell). A measured cell that did not touch a kernel device left its allocated
where it was: it counts as a point with the same value. A cell without a report from a
worker gives no point for it. "Cells" are measured cells (``%%gpumem`` or auto mode).

**The rule.** Only a device that grew in the last cell is looked at. Of the last up to
:data:`WINDOW` (10) points, the window is the run since the last cell that freed memory
(a step down restarts it). There is a forecast only when

- the window holds at least :data:`MIN_CELLS` (3) points, every step between them ≥ 0;
- the window grew by more than :data:`MIN_GROWTH` (1 %) of allocated: a loop whose
  allocated stays within 1 % gets nothing (noise, a counter, a small cache);
- a line or a geometric growth fits the window well: R² ≥ :data:`MIN_R2` (0.9; a single
  jump among flat cells fits at most 0.75) of the least-squares line of allocated over
  the cells (slope > 0), or of the line of log(allocated) (a constant factor > 1 a cell:
  memory that doubles each cell, a buffer that grows by a fifth). When both fit, the
  geometric one is taken only when its squared residuals (in bytes) are under
  :data:`GEOMETRIC_BETTER` (half) of the line's: a steady leak stays a line;
- the forecast is within :data:`HORIZON_CELLS` (10,000) cells and, when the cells'
  times are known, :data:`HORIZON_SECONDS` (7 days): beyond, it says nothing (a growth
  that slow is not worth a warning, and extrapolating that far means nothing).

**Against what.** The limit is what allocated can grow into: the cap's bytes when a cap
is set (``set_per_process_memory_fraction``, kind ``cap``), else what the device has
left: allocated + (reserved - allocated) + the device's free memory, that is reserved +
free (kind ``device``). When a cap is set but the device has less than that left (other
processes fill it) the device's figure binds, and the forecast says so. A worker's cap is
not known to the kernel: its limit is its own reserved plus the free memory of its
device as the kernel sees it.

**The forecast.** ``cells_left = floor((limit - allocated now) / slope)``, or for a
geometric growth ``floor(log(limit / allocated now) / log(factor))``: how many more
cells of this growth still fit; ``seconds_left``: that many times the window's mean
interval between cells. With allocation tracking on, ``who`` names the line that
allocated most of what the last growing cell kept (what the history already holds: no
new reading).

**Cost.** The history's last 10 rows and two least-squares fits of at most 10 points, the
line in integers (exact: a leak of exactly 64 MiB a cell gives exactly 64 MiB a cell), the
geometric one in floats (10 logarithms and exponentials): about 20 microseconds after a
cell that grew, a check of the last row otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ..model import CellReport, DeviceRow, Forecast, HistoryRow, LimitKind

WINDOW = 10  # points the rate is fitted on, at most
MIN_CELLS = 3  # points in the window, at least
MIN_GROWTH = 0.01  # the window's growth, a share of allocated now, more than
MIN_R2 = 0.9  # how well a line fits the window, at least
MIN_R2_TENTHS = round(MIN_R2 * 10)  # the same, for the test in integers
GEOMETRIC_BETTER = 0.5  # a geometric fit is taken when its residuals are under this share
HORIZON_CELLS = 10_000  # a forecast further than this many cells says nothing
HORIZON_SECONDS = 7 * 86400.0  # nor one further than this (7 days)


class Point(NamedTuple):
    """One measured cell on one device."""

    cell: int | None  # execution count
    time: float  # unix seconds at the cell's end
    allocated: int  # after the cell
    who: str | None = None  # with tracking: the line that allocated most of what it kept


class Growth(NamedTuple):
    """The window of a steady growth: its points and the line's slope as an exact
    fraction; ``factor`` when the growth is geometric (then the slope is not used)."""

    points: tuple[Point, ...]
    numerator: int  # slope = numerator / denominator bytes per cell
    denominator: int
    factor: float | None = None  # allocated multiplies by this a cell

    @property
    def bytes_per_cell(self) -> int:
        """The line's slope; a geometric growth: what the next cell would add."""
        if self.factor is not None:
            return round(self.points[-1].allocated * (self.factor - 1))
        return round(self.numerator / self.denominator)


def growth(points: Sequence[Point]) -> Growth | None:
    """The steady growth at the end of ``points`` (oldest first), or None (the rule)."""
    pts = tuple(points[-WINDOW:])
    start = 0
    for i in range(1, len(pts)):
        if pts[i].allocated < pts[i - 1].allocated:
            start = i  # a cell that freed memory restarts the window
    window = pts[start:]
    n = len(window)
    if n < MIN_CELLS:
        return None
    first, last = window[0].allocated, window[-1].allocated
    if (last - first) <= MIN_GROWTH * last:
        return None
    # Least squares of allocated over the cells 0..n-1, in integers (n times the sums).
    sx = n * (n - 1) // 2
    sxx = (n - 1) * n * (2 * n - 1) // 6
    sy = sxy = syy = 0
    for i, p in enumerate(window):
        y = p.allocated
        sy += y
        sxy += i * y
        syy += y * y
    cov = n * sxy - sx * sy  # n² · covariance
    var_x = n * sxx - sx * sx
    var_y = n * syy - sy * sy
    if cov <= 0 or var_y <= 0:
        return None
    # R² = cov² / (var_x · var_y)
    line = cov * cov * 10 >= MIN_R2_TENTHS * var_x * var_y
    line_residuals = (var_y * var_x - cov * cov) / (n * var_x) if line else None  # exact 0
    factor = _geometric(window, sx, var_x, line_residuals)
    if factor is None and not line:
        return None
    return Growth(window, cov, var_x, factor)


def _geometric(
    window: Sequence[Point], sx: int, var_x: int, line_residuals: float | None
) -> float | None:
    """The factor a cell of the geometric growth that fits ``window`` (least squares of
    log(allocated) over the cells), when it fits (R² ≥ :data:`MIN_R2`, factor > 1) and
    better than the line whose squared residuals are ``line_residuals`` (None: the line
    does not fit); else None."""
    first = window[0].allocated
    if first <= 0 or line_residuals == 0:  # nothing to take the log of; a line fits exactly
        return None
    n = len(window)
    log, exp = math.log, math.exp
    logs = [log(p.allocated / first) for p in window]  # relative to the first: no cancelling
    sy = sxy = syy = 0.0
    for i, y in enumerate(logs):
        sy += y
        sxy += i * y
        syy += y * y
    cov = n * sxy - sx * sy
    var_y = n * syy - sy * sy
    if cov <= 0 or var_y <= 0 or cov * cov < MIN_R2 * var_x * var_y:
        return None
    slope = cov / var_x
    if line_residuals is not None:
        intercept = (sy - slope * sx) / n
        residuals = 0.0
        for i, p in enumerate(window):
            residuals += (p.allocated - first * exp(intercept + slope * i)) ** 2
        if residuals >= GEOMETRIC_BETTER * line_residuals:
            return None
    return exp(slope)


def forecast(
    points: Sequence[Point],
    limit: int,
    limit_kind: LimitKind,
    device: int = 0,
    worker: str | None = None,
) -> Forecast | None:
    """The forecast for one device's series against ``limit``, or None (the rule)."""
    g = growth(points)
    return None if g is None else project(g, limit, limit_kind, device, worker)


def project(
    g: Growth, limit: int, limit_kind: LimitKind, device: int, worker: str | None
) -> Forecast | None:
    """Where the growth ``g`` reaches ``limit``; None beyond the horizon."""
    window = g.points
    now = window[-1].allocated
    headroom = max(0, limit - now)
    if g.factor is not None:
        # the most cells k with now · factor^k ≤ limit (a hair of slack for the floats)
        cells_left = math.floor(math.log(limit / now) / math.log(g.factor) + 1e-9)
        cells_left = max(0, cells_left) if headroom else 0
    else:
        cells_left = headroom * g.denominator // g.numerator  # floor(headroom / slope), exact
    if cells_left > HORIZON_CELLS:
        return None
    span = window[-1].time - window[0].time
    seconds = cells_left * span / (len(window) - 1) if span > 0 else None
    if seconds is not None and seconds > HORIZON_SECONDS:
        return None
    who = next((p.who for p in reversed(window) if p.who), None)
    return Forecast(
        device=device,
        worker=worker,
        bytes_per_cell=g.bytes_per_cell,
        cells_left=cells_left,
        seconds_left=seconds,
        limit=limit,
        limit_kind=limit_kind,
        allocated=now,
        cells=len(window),
        first_cell=window[0].cell,
        who=who,
        factor=g.factor,
    )


def limit_for(
    reserved: int | None,
    cap: int | None,
    total: int | None,
    device_used: int | None,
) -> tuple[int, LimitKind] | None:
    """What allocated can grow into: the cap, else reserved + the device's free memory
    (the smaller of the two when both are known); None when neither is."""
    room = None
    if reserved is not None and total is not None and device_used is not None:
        room = reserved + max(0, total - device_used)
    if cap is not None:
        return (room, "device") if room is not None and room < cap else (cap, "cap")
    return (room, "device") if room is not None else None


def series(rows: Sequence[HistoryRow], device: int, worker: str | None = None) -> list[Point]:
    """The points of one device (``worker``: that worker's device) in ``rows``."""
    out: list[Point] = []
    for row in rows:
        d = _find(row, device, worker)
        if d is not None and d.allocated is not None:
            who = None
            if d.kept_at:
                cell = f"In[{row.execution_count}] " if row.execution_count is not None else ""
                who = cell + d.kept_at
            out.append(Point(row.execution_count, row.time, d.allocated, who))
        elif worker is None and out and d is None:
            # A measured cell that did not touch the device left it as it was.
            out.append(Point(row.execution_count, row.time, out[-1].allocated))
    return out


def _find(row: HistoryRow, device: int, worker: str | None) -> DeviceRow | None:
    for d in row.devices:
        if d.device == device and d.worker == worker:
            return d
    return None


# (index, name) of a worker's device -> (total, used) of that device, or None
DeviceRoom = Callable[[int, str], tuple[int, int] | None]


def forecasts(
    rows: Sequence[HistoryRow],
    report: CellReport,
    host: str | None = None,
    room: DeviceRoom | None = None,
) -> tuple[Forecast, ...]:
    """The forecasts after ``report``, whose row is the last of ``rows`` (the history's
    last :data:`WINDOW` rows); the limits from the report's own figures. A worker's limit
    needs its device's free memory: the kernel's reading of it when the worker runs on
    ``host`` (this machine), else what ``room`` reads (asked only for a steady growth)."""
    if not rows:
        return ()
    out: list[Forecast] = []
    for d in rows[-1].devices:
        if d.allocated is None or not d.allocated_delta or d.allocated_delta <= 0:
            continue
        g = growth(series(rows, d.device, d.worker))
        if g is None:
            continue
        if d.worker is None:
            limit = _kernel_limit(report, d)
        else:
            limit = _worker_limit(report, d, host, room)
        f = None if limit is None else project(g, limit[0], limit[1], d.device, d.worker)
        if f is not None:
            out.append(f)
    return tuple(out)


def _kernel_limit(report: CellReport, d: DeviceRow) -> tuple[int, LimitKind] | None:
    s = report.after.device(d.device)
    if s is None or s.allocator is None:
        return None
    cap = s.limit.bytes if s.limit is not None else None
    return limit_for(s.allocator.reserved, cap, s.total, s.device_used)


def _worker_limit(
    report: CellReport, d: DeviceRow, host: str | None, room: DeviceRoom | None
) -> tuple[int, LimitKind] | None:
    """The worker's reserved plus its device's free memory: the kernel's reading of the
    device of the same index and name (a worker forked on this host sees the kernel's
    devices), else what ``room`` reads."""
    name = None
    for w in report.workers:
        if w.label == d.worker and (host is None or w.host == host):
            name = next((wd.name for wd in w.devices if wd.index == d.device), None)
    if name is None:
        return None
    s = report.after.device(d.device)
    figures: tuple[int, int] | None = None
    if s is not None and s.total is not None and s.device_used is not None and s.name == name:
        figures = (s.total, s.device_used)
    elif room is not None:
        figures = room(d.device, name)
    if figures is None:
        return None
    return limit_for(d.reserved, None, figures[0], figures[1])
