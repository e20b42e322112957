"""Who holds the memory: tracking, ``who``, per-cell attribution, the OOM post-mortem,
the kept traceback, traces and breakdowns, for one front end's workspace.

Front-end free: the user's names, cells and kept traceback come through a
:class:`Workspace` (IPython's is ``_ipython/cells.py``). Who holds the memory is read
through an :class:`AttributionSource`: :class:`LiveAttribution` (torch's snapshot, the
namespace walk, the cells' names) unless the front end that composes the session gives
another.

Reads the namespace: call only on the shell thread while no cell runs (the magics and the
cell hooks do; the panel's requests are sent to the shell thread by the kernel front end).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ..analysis.breakdown import breakdowns_from_raw
from ..analysis.cell_sites import cell_attribution, live_blocks_by_device
from ..analysis.postmortem import Need, bound_names, explain_oom
from ..analysis.scan_hint import scan_knowledge
from ..analysis.segments import segment_map
from ..analysis.sites import SiteResolver
from ..analysis.timeline import build_timeline
from ..analysis.who import DeviceHoldings, holdings
from ..collectors.host import process_name
from ..collectors.namespace import (
    Limits,
    NamespaceWalker,
    Root,
    TorchTensors,
    collection_paused,
)
from ..collectors.snapshot import Recording, Trace, cuda_ready, read_snapshot
from ..collectors.step import StepRecorder
from ..errors import ActionRefused
from ..model import (
    AllocatorSnapshot,
    CellReport,
    CellTrace,
    OomEvent,
    PostMortem,
    ProcessMemory,
    ScanResult,
    SegmentMap,
    TracebackHolding,
    TracebackHoldings,
    WhoReport,
)
from .tracker import with_hints

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from ..analysis.sites import CellNames
    from ..collectors import Collector

By = Literal["variable", "line", "cell"]


@dataclass(frozen=True, slots=True)
class ReleaseResult:
    frames: int
    freed: dict[int, int]  # device -> bytes no longer allocated


class Workspace(Protocol):
    """What attribution reads from a front end: the user's names, cells, kept traceback."""

    @property
    def cells(self) -> CellNames: ...

    def roots(self, optimizer_type: type | None) -> list[Root]:
        """Where a namespace walk starts: the user's names, then the output history."""
        ...

    def traceback_roots(self) -> list[Root]: ...

    def release_traceback(self) -> int:
        """Drop what the front end keeps of the last failure; frames cleared."""
        ...

    def variables(self) -> Iterable[tuple[str, Any]]:
        """The user's own variables (not the front end's), by name."""
        ...

    def namespace(self) -> Mapping[str, Any]: ...

    def python(self, raw: str) -> str:
        """A cell's source as Python (the front end's transforms applied)."""
        ...


class AttributionSource(Protocol):
    """Where the Attributor reads who holds the memory: whether allocation sites are
    recorded, the live blocks matched with their owners, the segment maps."""

    def tracking(self, recording: Recording) -> bool:
        """Whether allocation sites are recorded now."""
        ...

    def set_tracking(self, recording: Recording, on: bool) -> tuple[str, bool]:
        """Switch allocation-site recording (``recording.wanted`` already says ``on``):
        what happened, in words, and whether a recording started (the blocks alive now
        were then made before it). Raises ActionRefused with a sentence."""
        ...

    def holdings(
        self,
        recording: Recording,
        devices: list[int] | None,
        walk: bool,
        snapshot: AllocatorSnapshot | None,
    ) -> dict[int, DeviceHoldings]:
        """The live blocks of each device (or those asked) matched with their owners
        (``walk=False``: none looked for). Raises ActionRefused with a sentence."""
        ...

    def segment_maps(self, device: int | None, max_segments: int | None) -> list[SegmentMap]:
        """The segment map of each device (or one). Raises ActionRefused with a sentence."""
        ...

    def known_postmortems(self) -> tuple[PostMortem, ...]:
        """Post-mortems of failures the source knew of before the session saw any."""
        ...


def _torch() -> Any:
    return sys.modules.get("torch")


def why_nothing(t: Any) -> str | None:
    """A sentence when there is no GPU memory of PyTorch's to attribute, else None."""
    if t is None:
        return "torch is not imported in this kernel: PyTorch holds no GPU memory"
    v = getattr(t, "version", None)
    if not (getattr(v, "cuda", None) or getattr(v, "hip", None)):
        return f"torch {t.__version__} is a CPU-only build: PyTorch holds no GPU memory"
    if not t.cuda.is_initialized():
        return "CUDA is not initialised in this kernel: PyTorch holds no GPU memory yet"
    return None


class LiveAttribution:
    """Who holds the memory, read live: torch's snapshot, the walk of the user's namespace,
    the cells' names (through the site resolver)."""

    def __init__(
        self,
        workspace: Workspace,
        resolver: SiteResolver,
        walker: Callable[[Any], NamespaceWalker],
    ) -> None:
        self.workspace = workspace
        self.resolver = resolver
        self.walker = walker

    def tracking(self, recording: Recording) -> bool:
        t = _torch()
        return t is not None and cuda_build(t) and recording.active(t)

    def set_tracking(self, recording: Recording, on: bool) -> tuple[str, bool]:
        t = _torch()
        if not on:
            was_ours = recording.ours
            recording.stop(t)
            if t is not None and cuda_build(t) and recording.active(t):
                return (
                    "allocation tracking is off for gpumem, but your own code records "
                    "allocation history (_record_memory_history): it stays on"
                ), False
            return (
                "allocation tracking is off" if was_ours else "allocation tracking was off"
            ), False
        if t is None:
            return (
                "allocation tracking starts as soon as torch is imported (at the next cell "
                "after the import)"
            ), False
        err = recording.start(t)
        if err is not None:
            recording.wanted = False
            raise ActionRefused(err)
        return (
            "allocation tracking is on: blocks allocated from now on carry the line that "
            "allocated them (`%gpumem who --by line`)"
        ), True

    def holdings(
        self,
        recording: Recording,
        devices: list[int] | None,
        walk: bool,
        snapshot: AllocatorSnapshot | None,
    ) -> dict[int, DeviceHoldings]:
        """Snapshot + namespace walk, matched per device."""
        t = _torch()
        why = why_nothing(t)
        if why is not None:
            raise ActionRefused(why)
        start = time.perf_counter()
        snap = snapshot if snapshot is not None else read_snapshot(t)
        if snap is None:
            raise ActionRefused("CUDA is not initialised in this kernel")
        refs = None
        notes: list[str] = []
        if devices is None:
            devices = snap.devices()
        if walk:
            ws = self.workspace
            roots = ws.roots(t.optim.Optimizer) + ws.traceback_roots()
            # the blocks the matching below reads anyway, made once, spare the walk two
            # torch calls a tensor
            w = self.walker(t).walk(roots, [(d, snap.live_blocks(d)) for d in devices])
            refs = w.refs
            notes += [f"namespace walk {r}: some owners may be missing" for r in w.truncated]
        elapsed = time.perf_counter() - start
        before = recording.before
        return {d: holdings(snap, d, refs, self.resolver, before, notes, elapsed) for d in devices}

    def segment_maps(self, device: int | None, max_segments: int | None) -> list[SegmentMap]:
        """Reads no namespace: safe beside a running cell (the cell names it reads are only
        looked up)."""
        t = _torch()
        why = why_nothing(t)
        if why is not None:
            raise ActionRefused(why)
        snap = read_snapshot(t)
        if snap is None:
            raise ActionRefused("CUDA is not initialised in this kernel")
        resolver = self.resolver
        devices = snap.devices()
        if device is not None:
            devices = [device]
        return [segment_map(snap, d, resolver, max_segments) for d in devices]

    def known_postmortems(self) -> tuple[PostMortem, ...]:
        return ()  # a live session explains the failures it sees


class Attributor:
    def __init__(
        self,
        workspace: Workspace,
        collector: Collector,
        track: bool = False,
        source: AttributionSource | None = None,
    ) -> None:
        self.workspace = workspace
        self.collector = collector
        self.cells = workspace.cells
        self.resolver = SiteResolver(self.cells)
        self.recording = Recording()
        self.recording.wanted = track
        self.limits = Limits()
        self._walkers: dict[int, NamespaceWalker] = {}
        # who holds it: live unless the session was composed with another source
        if source is None:
            source = LiveAttribution(workspace, self.resolver, self._walker)
        self.source: AttributionSource = source
        # Live blocks (device -> address -> size) at the last per-cell attribution: blocks a
        # cell "made" are those not in it (re-running a cell's code reuses its file name).
        self._known: dict[int, dict[int, int]] | None = None
        self.last_postmortems: tuple[PostMortem, ...] = ()
        # the session's scans (ScanResults), newest last: what a failed cell needs
        self.scans: Callable[[], Sequence[ScanResult]] = lambda: ()

    # -- tracking ------------------------------------------------------------------------
    @property
    def tracking(self) -> bool:
        return self.source.tracking(self.recording)

    def set_tracking(self, on: bool) -> str:
        """Switch allocation-site recording; returns what happened, in words."""
        self.recording.wanted = on
        message, started = self.source.set_tracking(self.recording, on)
        if started:
            self._known = _by_device(self.recording.before)
        return message

    def before_cell(self) -> None:
        """Start a wished-for recording once torch is there (cheap when nothing is wished)."""
        rec = self.recording
        if rec.wanted and not rec.ours and rec.error is None:
            t = _torch()
            if t is not None and not self.recording.active(t):
                if rec.start(t) is None:
                    self._known = _by_device(rec.before)

    # -- reading -------------------------------------------------------------------------
    def _walker(self, t: Any) -> NamespaceWalker:
        w = self._walkers.get(id(t))
        if w is None:
            w = NamespaceWalker(TorchTensors(t), self.limits)
            self._walkers = {id(t): w}
        return w

    def read(
        self,
        devices: list[int] | None = None,
        walk: bool = True,
        snapshot: AllocatorSnapshot | None = None,
    ) -> dict[int, DeviceHoldings]:
        """Snapshot + namespace walk, matched per device. Raises ActionRefused with a
        sentence when there is nothing to attribute."""
        if not self.last_postmortems:
            self.last_postmortems = self.source.known_postmortems()
        return self.source.holdings(self.recording, devices, walk, snapshot)

    def segment_maps(
        self, device: int | None = None, max_segments: int | None = None
    ) -> list[SegmentMap]:
        """The segment map of each device (or one). Reads no namespace: safe beside a
        running cell."""
        return self.source.segment_maps(device, max_segments)

    def who(
        self, device: int | None = None, by: By = "variable", n: int | None = 20
    ) -> list[WhoReport]:
        with collection_paused():  # snapshot, walk and views: ~10 ms of collections
            held = self.read(None if device is None else [device])
            if device is not None and device not in held:
                held[device] = holdings(_empty_snapshot(), device, [], self.resolver)
            return [h.report(by, n) for _, h in sorted(held.items())]

    # -- after a failure -------------------------------------------------------------------
    def traceback_holdings(
        self, snapshot: AllocatorSnapshot | None = None
    ) -> TracebackHoldings | None:
        t = _torch()
        if why_nothing(t) is not None:
            return None
        roots = self.workspace.traceback_roots()
        if not roots:
            return None
        snap = snapshot if snapshot is not None else read_snapshot(t)
        if snap is None:
            return None
        w = self._walker(t).walk(roots, [(d, snap.live_blocks(d)) for d in snap.devices()])
        found: dict[tuple[str, str], list[int]] = {}
        sizes: dict[int, int] = {}
        devices = sorted({r.device for r in w.refs})
        for d in devices:
            h = holdings(snap, d, w.refs, self.resolver)
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
        before = self._allocated()
        frames = self.workspace.release_traceback()
        after = self._allocated()
        return ReleaseResult(frames, {d: before[d] - after.get(d, 0) for d in before})

    def _allocated(self) -> dict[int, int]:
        m = self.collector.measure(with_process=False, full=False)
        return {d.index: d.allocator.allocated for d in m.devices if d.allocator is not None}

    # -- %%gpumem --trace -------------------------------------------------------------------
    def start_trace(self, entries: int, stacks: bool = True) -> Trace | str:
        """Start recording the allocator's full history; a sentence when it can't."""
        t = _torch()
        if t is None:
            return "torch was not imported when the cell began: nothing was traced"
        why = self.recording.supported(t)
        if why is not None:
            return why
        trace = Trace(self.recording, entries, stacks)
        trace.start(t)
        return trace

    def stop_trace(self, trace: Trace | str | None) -> tuple[dict[str, Any] | None, float, str]:
        """(the raw snapshot with the cell's trace, milliseconds it took, why none)."""
        if not isinstance(trace, Trace):
            return None, 0.0, trace or "the trace did not start"
        t = _torch()
        start = time.perf_counter()
        raw = trace.stop(t)
        snapshot_ms = (time.perf_counter() - start) * 1000
        if raw is None:
            return None, snapshot_ms, "CUDA never started in this cell"
        return raw, snapshot_ms, ""

    def finish_trace(
        self, trace: Trace | str | None, report: CellReport, save: str | None
    ) -> CellReport:
        raw, snapshot_ms, note = self.stop_trace(trace)
        return self.trace_report(raw, snapshot_ms, note, report, save, trace)

    def trace_report(
        self,
        raw: dict[str, Any] | None,
        snapshot_ms: float,
        note: str,
        report: CellReport,
        save: str | None,
        trace: Any,
    ) -> CellReport:
        if raw is None:
            return replace(report, trace=CellTrace((), note=note))
        count = report.execution_count
        files = self.cells.files_of(count) if count is not None else frozenset()
        timelines = []
        for device, entries in enumerate(raw.get("device_traces", [])):
            if not any(e.get("action") == "alloc" for e in entries):
                continue
            before = report.before.device(device)
            base = before.allocator.allocated if before and before.allocator else 0
            timelines.append(
                build_timeline(
                    entries, device, base, self.resolver, files, trace.entries, snapshot_ms
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

    # -- %%gpumem --breakdown -----------------------------------------------------------------
    def start_breakdown(self) -> StepRecorder | str:
        """Install the hooks of a breakdown; a sentence when it can't run here."""
        t = _torch()
        if t is None:
            from ..collectors import no_torch_before

            return no_torch_before("--breakdown", "the breakdown's hooks are set before it runs")
        if not cuda_build(t):
            return f"--breakdown needs a CUDA GPU: torch {t.__version__} is a CPU-only build"
        recorder = StepRecorder(t, self._modules_in_namespace)
        snap = read_snapshot(t) if cuda_ready(t) else None
        if snap is not None:  # where each block is when the cell begins: sizes are replayed
            recorder.record.begin_segments = [
                {
                    "device": seg.get("device", 0),
                    "address": seg["address"],
                    "total_size": seg["total_size"],
                    "blocks": [
                        {"address": b["address"], "size": b["size"], "state": b["state"]}
                        for b in seg.get("blocks", ())
                    ],
                }
                for seg in snap.segments
            ]
        recorder.start()
        return recorder

    def _modules_in_namespace(self) -> list[tuple[str, Any]]:
        """The user's modules and optimizers, by name (one level: ``model``, ``opt``)."""
        t = _torch()
        if t is None:
            return []
        kinds = (t.nn.Module, t.optim.Optimizer)
        return [
            (k, v)
            for k, v in self.workspace.variables()
            if isinstance(v, kinds) and not k.startswith("_")
        ]

    def finish_breakdown(
        self,
        recorder: StepRecorder | str | None,
        raw: dict[str, Any] | None,
        note: str,
        report: CellReport,
    ) -> CellReport:
        if not isinstance(recorder, StepRecorder):
            return replace(report, breakdown_note=recorder or "the breakdown did not start")
        record = recorder.stop()
        if raw is None:
            return replace(report, breakdown_note=f"no breakdown: {note}")
        breakdowns = breakdowns_from_raw(raw, record, report)
        if not breakdowns:
            why = "the cell allocated nothing on a GPU"
            return replace(report, breakdown_note=why)
        return replace(report, breakdowns=breakdowns, breakdown_note="")

    # -- after each measured cell -----------------------------------------------------------
    def enrich(
        self,
        report: CellReport,
        error: BaseException | None,
        hints: bool = True,
        code: str = "",
    ) -> CellReport:
        """Add per-cell attribution (tracking on and memory kept), the OOM post-mortem and
        the traceback's holdings (the cell failed). Costs nothing for other cells."""
        if not (report.devices or report.failed):
            return report  # nothing changed on any device: nothing to attribute
        t = _torch()
        grew = [d.index for d in report.devices if (d.allocated_delta or 0) > 0]
        oom = report.failed and (_is_oom(error) or bool(report.ooms))
        if not (grew or report.failed) or t is None or not cuda_ready(t):
            return report
        tracking = self.recording.active(t)
        if not (report.failed or tracking):
            return report
        snap = read_snapshot(t)
        if snap is None:
            return report
        changes: dict[str, Any] = {}
        if tracking and grew and report.execution_count is not None:
            files = self.cells.files_of(report.execution_count)
            known = self._known
            if known is None:
                known = _by_device(self.recording.before)
            changes["attribution"] = tuple(
                cell_attribution(snap, d, files, known.get(d, {}), self.resolver) for d in grew
            )
            self._known = live_blocks_by_device(snap)
        if oom:
            changes["postmortems"] = self._postmortems(report, snap, code)
            self.last_postmortems = changes["postmortems"]
        if report.failed:
            changes["traceback"] = self.traceback_holdings(snap)
        if not changes:
            return report
        new = replace(report, **changes)
        return with_hints(new) if hints else new

    def _postmortems(
        self, report: CellReport, snap: AllocatorSnapshot, code: str = ""
    ) -> tuple[PostMortem, ...]:
        events = {o.device: o for o in report.ooms}  # the last one per device
        if not events:
            return ()
        held = self.read(sorted(events), snapshot=snap)
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
                need=self._need(report, device, event, python),
            )
            out.append(replace(pm, execution_count=report.execution_count, time=report.after.time))
        return tuple(out)

    def _need(self, report: CellReport, device: int, event: OomEvent, code: str) -> Need:
        """What the failed cell needs: what it had allocated above its start plus the
        failed request; the whole need when a scan of this cell knows it."""
        d = report.device(device)
        above = d.peak_above_start if d is not None and d.peak_above_start is not None else 0
        so_far = max(0, above) + event.requested
        total = d.after.total if d is not None else None
        cap = event.allowed if total is not None and event.allowed < total else None
        outside = d.after.outside_torch if d is not None else None
        ns = self.workspace.namespace()
        full, hint = scan_knowledge(code, device, ns, self.scans(), cap, outside)
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


def _by_device(keys: frozenset[tuple[int, int, int]]) -> dict[int, dict[int, int]]:
    out: dict[int, dict[int, int]] = {}
    for device, address, size in keys:
        out.setdefault(device, {})[address] = size
    return out


def cuda_build(t: Any) -> bool:
    v = getattr(t, "version", None)
    return bool(getattr(v, "cuda", None) or getattr(v, "hip", None))


def _is_oom(error: BaseException | None) -> bool:
    return error is not None and type(error).__name__ == "OutOfMemoryError"


def _empty_snapshot() -> AllocatorSnapshot:
    return AllocatorSnapshot(time=time.time(), segments=(), tracking=False)


__all__ = [
    "AttributionSource",
    "Attributor",
    "LiveAttribution",
    "ReleaseResult",
    "Root",
    "Workspace",
    "why_nothing",
]
