"""Who holds the memory, and allocation-site tracking: ``%gpumem who``, ``%gpumem track``,
``%gpumem segments``, the panel's Who and Segments tabs, and the blocks a measured cell
kept (``kept, allocated at``).

For the front ends (through the session) and for the services after a failure
(``postmortem.py``), traces (``trace.py``): one :class:`Who` per session, given the front
end's :class:`~.attribution.Workspace` and, optionally, the
:class:`~.attribution.AttributionSource` to read from (live by default).

Reads the namespace: call only on the shell thread while no cell runs.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Literal

from ..analysis.cell_sites import cell_attribution, live_blocks_by_device
from ..analysis.sites import SiteResolver
from ..analysis.who import DeviceHoldings, holdings
from ..collectors.namespace import Limits, NamespaceWalker, TorchTensors, collection_paused
from ..collectors.snapshot import Recording
from ..collectors.torch_build import imported_torch
from ..model import AllocatorSnapshot, DeviceAttribution, SegmentMap, WhoReport
from .attribution import AttributionSource, LiveAttribution, Workspace

if TYPE_CHECKING:
    from collections.abc import Sequence

By = Literal["variable", "line", "cell"]


class Who:
    """Who holds the memory, read through the session's attribution source, and whether
    allocation sites are recorded."""

    def __init__(
        self,
        workspace: Workspace,
        source: AttributionSource | None = None,
        track: bool = False,
    ) -> None:
        self.workspace = workspace
        self.cells = workspace.cells
        self.resolver = SiteResolver(self.cells)
        self.recording = Recording()
        self.recording.wanted = track
        self.limits = Limits()
        self._walkers: dict[int, NamespaceWalker] = {}
        # who holds it: live unless the session was composed with another source
        if source is None:
            source = LiveAttribution(workspace, self.resolver, self.walker)
        self.source: AttributionSource = source
        # Live blocks (device -> address -> size) at the last per-cell attribution: blocks a
        # cell "made" are those not in it (re-running a cell's code reuses its file name).
        self._known: dict[int, dict[int, int]] | None = None

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
            t = imported_torch()
            if t is not None and not self.recording.active(t):
                if rec.start(t) is None:
                    self._known = _by_device(rec.before)

    # -- reading -------------------------------------------------------------------------
    def walker(self, t: Any) -> NamespaceWalker:
        """The namespace walker for this torch module (made once, kept for the next walk)."""
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
        """Who holds each device's memory (or one device's), grouped ``by``, ``n`` rows."""
        with collection_paused():  # snapshot, walk and views: ~10 ms of collections
            held = self.read(None if device is None else [device])
            if device is not None and device not in held:
                held[device] = holdings(_empty_snapshot(), device, [], self.resolver)
            return [h.report(by, n) for _, h in sorted(held.items())]

    # -- after each measured cell ----------------------------------------------------------
    def kept_by_cell(
        self, snap: AllocatorSnapshot, execution_count: int, grew: Sequence[int]
    ) -> tuple[DeviceAttribution, ...]:
        """The blocks cell ``execution_count`` made and kept on each device that ``grew``,
        by the line that allocated them (tracking on); remembers the live blocks for the
        next cell."""
        files = self.cells.files_of(execution_count)
        known = self._known
        if known is None:
            known = _by_device(self.recording.before)
        made = tuple(
            cell_attribution(snap, d, files, known.get(d, {}), self.resolver) for d in grew
        )
        self._known = live_blocks_by_device(snap)
        return made


def _by_device(keys: frozenset[tuple[int, int, int]]) -> dict[int, dict[int, int]]:
    out: dict[int, dict[int, int]] = {}
    for device, address, size in keys:
        out.setdefault(device, {})[address] = size
    return out


def _empty_snapshot() -> AllocatorSnapshot:
    return AllocatorSnapshot(time=time.time(), segments=(), tracking=False)


__all__ = ["By", "Who"]
