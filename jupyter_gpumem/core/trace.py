"""``%%gpumem --trace``: the allocator's full history recorded for one cell, and its
timelines (stacked allocations, the peak, what was alive at the peak and which line made
it), optionally saved as a snapshot PyTorch's memory_viz opens.

For the session, around a measured cell: :meth:`Traces.start` before it, :meth:`Traces.stop`
after it (the raw snapshot, which ``--breakdown`` reads too), then :meth:`Traces.report`.
Given the :class:`~.who.Who` service: its recording (a trace and allocation tracking share
torch's one history) and the names of lines and cells.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from ..analysis.timeline import build_timeline
from ..collectors.snapshot import Trace
from ..collectors.torch_build import imported_torch, why_no_gpu
from ..model import CellReport, CellTrace, Failed
from .who import Who


class Traces:
    """Starts, stops and reads one cell's trace at a time."""

    def __init__(self, who: Who) -> None:
        self.who = who

    def start(self, entries: int, stacks: bool = True) -> Trace | Failed:
        """Start recording the allocator's full history; why not when it can't."""
        t = imported_torch()
        if t is None:  # nothing was traced
            return Failed(str(why_no_gpu(None, t, before_cell="the trace starts with the cell")))
        why = self.who.recording.supported(t)
        if why is not None:
            return Failed(why)
        trace = Trace(self.who.recording, entries, stacks)
        trace.start(t)
        return trace

    def stop(self, trace: Trace | Failed | None) -> tuple[dict[str, Any] | None, float, str]:
        """(the raw snapshot with the cell's trace, milliseconds it took, why none)."""
        if not isinstance(trace, Trace):
            return None, 0.0, trace.note if trace is not None else "the trace did not start"
        t = imported_torch()
        start = time.perf_counter()
        raw = trace.stop(t)
        snapshot_ms = (time.perf_counter() - start) * 1000
        if raw is None:
            return None, snapshot_ms, "CUDA never started in this cell"
        return raw, snapshot_ms, ""

    def report(
        self,
        raw: dict[str, Any] | None,
        snapshot_ms: float,
        note: str,
        report: CellReport,
        save: str | None,
        trace: Trace | Failed | None,
    ) -> CellReport:
        """The cell's report with its trace: a timeline per device it allocated on (or
        ``note``, why there is none), and the raw snapshot written to ``save``."""
        if raw is None or not isinstance(trace, Trace):
            return replace(report, trace=CellTrace((), note=note))
        count = report.execution_count
        files = self.who.cells.files_of(count) if count is not None else frozenset()
        timelines = []
        for device, entries in enumerate(raw.get("device_traces", [])):
            if not any(e.get("action") == "alloc" for e in entries):
                continue
            before = report.before.device(device)
            base = before.allocator.allocated if before and before.allocator else 0
            timelines.append(
                build_timeline(
                    entries, device, base, self.who.resolver, files, trace.entries, snapshot_ms
                )
            )
        saved, size = None, 0
        if save is not None:
            import pickle

            with open(save, "xb") as f:  # never overwrites (checked before the cell too)
                pickle.dump(raw, f)
                size = f.tell()
            saved = save
        note = "" if timelines else "the cell allocated nothing on a GPU"
        return replace(report, trace=CellTrace(tuple(timelines), saved, size, note))


__all__ = ["Traces"]
