"""One cell's measurement: a reading before, a reading after, and the exact peaks between.

Kernel-agnostic: the IPython hooks call :meth:`CellTracker.begin` and
:meth:`CellTracker.end`; so can any other front end.

Peaks. PyTorch keeps one peak counter per device for the whole process. By default
``begin`` resets it (``reset_peak_memory_stats``, 0.2 us), so the peak read at ``end`` is
exactly the highest point inside the cell, and the user's own ``max_memory_allocated()``
afterwards also means "peak of the last measured cell". With ``keep_peak=True`` nothing
is reset: the peak is exact when the cell set a new process-wide peak, and otherwise only
an upper bound (``peak_exact=False``).

Workers. With a :class:`~jupyter_gpumem.collectors.workers.WorkerChannel`, processes forked
while the cell runs report their own allocators, and the report lists them (``workers``).
The front end hands it the worker sources' cell feeds (``collectors/worker_sources.py``):
each is called at begin and end only where the module it names is imported (Ray's: what
Ray workers sent, ``collectors/ray_workers.py``); otherwise it costs one ``sys.modules``
lookup.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..analysis.hints import hints_for
from ..collectors import Collector

if TYPE_CHECKING:
    from ..collectors.workers import WorkerChannel
from ..model import CellReport, DeviceCellReport, DeviceSample, Measurement, WorkerReport


@dataclass(slots=True)
class _Open:
    before: Measurement
    keep_peak: bool
    oom_mark: int


CellFeed = Callable[["WorkerChannel", bool], None]
"""A worker source's news at a measured cell's begin (True) or end (False), into the
kernel's worker channel."""


class CellTracker:
    def __init__(
        self,
        collector: Collector,
        workers: WorkerChannel | None = None,
        feeds: Sequence[tuple[str, CellFeed]] = (),
    ) -> None:
        """``feeds``: (module, feed) pairs; with ``workers``, a cell's begin and end call
        each feed whose module is imported, in order."""
        self.collector = collector
        self.workers = workers
        self.feeds: tuple[tuple[str, CellFeed], ...] = tuple(feeds)
        self._open: _Open | None = None

    @property
    def active(self) -> bool:
        return self._open is not None

    def begin(self, keep_peak: bool = False, with_process: bool = False) -> Measurement:
        """``with_process``: also this process's NVML figure, so that a full report can
        show "outside PyTorch, this process" from the same source at both ends."""
        before = self.collector.measure(with_process=with_process, full=False)
        if not keep_peak:
            self.collector.backend.reset_peaks(
                [d.index for d in before.devices if d.allocator is not None]
            )
        self._open = _Open(before, keep_peak, self.collector.oom_count)
        if self.workers is not None:
            for module, feed in self.feeds:
                if module in sys.modules:
                    feed(self.workers, True)
            self.workers.begin()
        return before

    def cancel(self) -> None:
        self._open = None
        if self.workers is not None:
            self.workers.measuring = False

    def end(
        self,
        execution_count: int | None = None,
        first_line: str = "",
        error: BaseException | None = None,
        device: int | None = None,
        with_process: bool = True,
        hints: bool = True,
    ) -> CellReport:
        """Close the cell. ``device`` restricts the report to one device;
        ``with_process`` adds NVML's per-process figure (17-60 us a device), which only the
        full report shows, and ``hints`` its plain-language hints."""
        if self._open is None:
            raise RuntimeError("end() without begin()")
        opened, self._open = self._open, None
        after = self.collector.measure(with_process=with_process, full=False)
        if self.workers is not None:
            for module, feed in self.feeds:
                if module in sys.modules:
                    feed(self.workers, False)
        workers = self.workers.end() if self.workers is not None else ()
        if workers and any(w.oom_snapshot is not None for w in workers):
            workers = _with_postmortems(workers, execution_count, after.time)
        devices = []
        for a in after.devices:
            if device is not None and a.index != device:
                continue
            b = opened.before.device(a.index) or DeviceSample(a.index, a.name, a.backend, False)
            d = _device_report(b, a, opened.keep_peak)
            if device is not None or _touched(d):
                devices.append(d)
        new_ooms = self.collector.oom_count - opened.oom_mark
        ooms = tuple(list(self.collector.ooms)[-new_ooms:]) if new_ooms else ()
        report = CellReport(  # positional, in the record's field order: once a cell
            execution_count,
            first_line,
            opened.before,
            after,
            tuple(devices),
            after.clock - opened.before.clock,  # wall_time
            error is not None,  # failed
            _describe(error) if error is not None else None,
            ooms,
            workers=workers,
        )
        return with_hints(report) if hints else report


def _with_postmortems(
    workers: tuple[WorkerReport, ...], execution_count: int | None, time: float
) -> tuple[WorkerReport, ...]:
    """Each worker's OOM post-mortem, from the snapshot it handed over."""
    from ..analysis.postmortem import worker_postmortem

    out = []
    for w in workers:
        pm = worker_postmortem(w) if w.oom_snapshot is not None else None
        if pm is not None:
            pm = replace(pm, execution_count=execution_count, time=time)
            w = replace(w, postmortem=pm)
        out.append(w)
    return tuple(out)


def _device_report(b: DeviceSample, a: DeviceSample, keep_peak: bool) -> DeviceCellReport:
    if a.allocator is None:
        return DeviceCellReport(b, a, None, None, True)
    pa, pr = a.allocator.peak_allocated, a.allocator.peak_reserved
    if b.allocator is None or not keep_peak:
        # Reset at begin, or the allocator started inside this cell: counters are exact.
        return DeviceCellReport(b, a, pa, pr, True)
    exact = pa > b.allocator.peak_allocated
    return DeviceCellReport(b, a, pa, pr, exact)


def _touched(d: DeviceCellReport) -> bool:
    if d.before.initialized != d.after.initialized:
        return True
    a, b = d.after.allocator, d.before.allocator
    if a is not None:
        if (
            b is None
            or a.allocated != b.allocated
            or a.reserved != b.reserved
            or a.device_allocs != b.device_allocs
            or a.ooms != b.ooms
        ):
            return True
        if (d.peak_above_start or 0) > 0:
            return True
    # Allocations made while caching is off show only at the device level.
    delta = d.process_used_delta
    if delta is None:
        delta = d.device_used_delta
    return bool(delta)


def _describe(error: BaseException | None) -> str | None:
    if error is None:
        return None
    msg = str(error).strip().splitlines()
    first = msg[0] if msg else ""
    name = type(error).__name__
    return f"{name}: {first}" if first else name


def with_hints(r: CellReport) -> CellReport:
    """Set the report's hints, which are derived from the report itself. Set in place, once,
    while the report is being made: a copy (dataclasses.replace) would cost more than the
    readings of a cell."""
    r.hints = hints_for(r)
    return r
