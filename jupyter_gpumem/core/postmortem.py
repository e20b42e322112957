"""After a measured cell: what its report gets from the analyses of who holds the memory
(the blocks it kept, by line, when tracking is on), and after a failure the out-of-memory
post-mortem and what the kept traceback holds; ``%gpumem release-traceback``.

For the session (after each measured cell), the magics and the panel: one
:class:`PostMortems` per session, given the front end's workspace, the collector (the
driver's view of other processes, the allocated figures around a release) and the
:class:`~.who.Who` service it reads the holdings through.

Reads the namespace: call only on the shell thread while no cell runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..analysis.postmortem import Need, bound_names, explain_oom
from ..analysis.scan_hint import scan_knowledge
from ..analysis.who import holdings
from ..collectors.host import process_name
from ..collectors.snapshot import read_snapshot
from ..collectors.torch_build import cuda_ready, imported_torch
from ..errors import is_out_of_memory
from ..model import (
    AllocatorSnapshot,
    CellReport,
    OomEvent,
    PostMortem,
    ProcessMemory,
    ScanResult,
    TracebackHolding,
    TracebackHoldings,
)
from .attribution import Workspace, why_nothing
from .tracker import with_hints
from .who import Who

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..collectors import Collector


@dataclass(frozen=True, slots=True)
class ReleaseResult:
    frames: int
    freed: dict[int, int]  # device -> bytes no longer allocated


class PostMortems:
    """The analyses a measured cell's report gets afterwards, and the kept traceback."""

    def __init__(self, workspace: Workspace, collector: Collector, who: Who) -> None:
        self.workspace = workspace
        self.collector = collector
        self.who = who
        self._last: tuple[PostMortem, ...] = ()

    @property
    def last(self) -> tuple[PostMortem, ...]:
        """The post-mortems of the last cell that ran out of memory; before the session saw
        one, those of failures the attribution source knew of."""
        if not self._last:
            self._last = self.who.source.known_postmortems()
        return self._last

    # -- after each measured cell -----------------------------------------------------------
    def enrich(
        self,
        report: CellReport,
        error: BaseException | None,
        hints: bool = True,
        code: str = "",
        scans: Sequence[ScanResult] = (),
    ) -> CellReport:
        """Add per-cell attribution (tracking on and memory kept), the OOM post-mortem and
        the traceback's holdings (the cell failed). Costs nothing for other cells.
        ``scans``: the session's scans, newest last (what a failed cell needs)."""
        if not (report.devices or report.failed):
            return report  # nothing changed on any device: nothing to attribute
        t = imported_torch()
        grew = [d.index for d in report.devices if (d.allocated_delta or 0) > 0]
        oom = report.failed and (is_out_of_memory(error) or bool(report.ooms))
        if not (grew or report.failed) or t is None or not cuda_ready(t):
            return report
        tracking = self.who.recording.active(t)
        if not (report.failed or tracking):
            return report
        snap = read_snapshot(t)
        if snap is None:
            return report
        changes: dict[str, Any] = {}
        if tracking and grew and report.execution_count is not None:
            changes["attribution"] = self.who.kept_by_cell(snap, report.execution_count, grew)
        if oom:
            changes["postmortems"] = self._postmortems(report, snap, code, scans)
            self._last = changes["postmortems"]
        if report.failed:
            changes["traceback"] = self.traceback_holdings(snap)
        if not changes:
            return report
        new = replace(report, **changes)
        return with_hints(new) if hints else new

    def _postmortems(
        self,
        report: CellReport,
        snap: AllocatorSnapshot,
        code: str,
        scans: Sequence[ScanResult],
    ) -> tuple[PostMortem, ...]:
        events = {o.device: o for o in report.ooms}  # the last one per device
        if not events:
            return ()
        held = self.who.read(sorted(events), snapshot=snap)
        python = self.workspace.python(code) if code else ""
        out = []
        for device, event in sorted(events.items()):
            after = report.after.device(device)
            if after is None:
                continue
            pm = explain_oom(
                event,
                after,
                snap.device_segments(device),
                held.get(device),
                self._other_processes(device),
                snap.settings,
                need=self._need(report, device, event, python, scans),
            )
            out.append(replace(pm, execution_count=report.execution_count, time=report.after.time))
        return tuple(out)

    def _need(
        self,
        report: CellReport,
        device: int,
        event: OomEvent,
        code: str,
        scans: Sequence[ScanResult],
    ) -> Need:
        """What the failed cell needs: what it had allocated above its start plus the
        failed request; the whole need when a scan of this cell knows it."""
        d = report.device(device)
        above = d.peak_above_start if d is not None and d.peak_above_start is not None else 0
        so_far = max(0, above) + event.requested
        total = d.after.total if d is not None else None
        cap = event.allowed if total is not None and event.allowed < total else None
        outside = d.after.outside_torch if d is not None else None
        ns = self.workspace.namespace()
        full, hint = scan_knowledge(code, device, ns, scans, cap, outside)
        if full is not None:
            full = max(full, so_far)
        return Need(so_far=so_far, full=full, bound=bound_names(code), hint=hint)

    def _other_processes(self, device: int) -> list[ProcessMemory]:
        nvml = getattr(self.collector.backend, "nvml", None)
        if nvml is None:
            return []
        index = nvml.nvml_index(device)
        if index is None:
            return []
        me = os.getpid()
        out = [
            ProcessMemory(pid, process_name(pid), used)
            for pid, used in nvml.processes(index)
            if pid != me
        ]
        return sorted(out, key=lambda p: -p.bytes)

    # -- the kept traceback -------------------------------------------------------------------
    def traceback_holdings(
        self, snapshot: AllocatorSnapshot | None = None
    ) -> TracebackHoldings | None:
        """What the frames of the kept traceback hold on the GPU, by frame and name."""
        t = imported_torch()
        if why_nothing(t) is not None:
            return None
        roots = self.workspace.traceback_roots()
        if not roots:
            return None
        snap = snapshot if snapshot is not None else read_snapshot(t)
        if snap is None:
            return None
        w = self.who.walker(t).walk(roots, [(d, snap.live_blocks(d)) for d in snap.devices()])
        found: dict[tuple[str, str], list[int]] = {}
        sizes: dict[int, int] = {}
        devices = sorted({r.device for r in w.refs})
        for d in devices:
            h = holdings(snap, d, w.refs, self.who.resolver)
            for address, ref in h.owners.items():
                frame, _, name = ref.owner.removeprefix("traceback: ").rpartition(": ")
                found.setdefault((frame, name), []).append(address)
                sizes[address] = h.blocks[address]["size"]
        if not found:
            return None
        rows = [
            TracebackHolding(frame, name, sum(sizes[a] for a in addrs), len(addrs))
            for (frame, name), addrs in found.items()
        ]
        rows.sort(key=lambda r: -r.bytes)
        return TracebackHoldings(tuple(rows))

    def release_traceback(self) -> ReleaseResult:
        """Drop the kept traceback: the frames cleared and the bytes that freed."""
        before = self._allocated()
        frames = self.workspace.release_traceback()
        after = self._allocated()
        return ReleaseResult(frames, {d: before[d] - after.get(d, 0) for d in before})

    def _allocated(self) -> dict[int, int]:
        m = self.collector.measure(with_process=False, full=False)
        return {d.index: d.allocator.allocated for d in m.devices if d.allocator is not None}


__all__ = ["PostMortems", "ReleaseResult"]
