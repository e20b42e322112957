"""Where who holds the memory is read from, and what a front end gives for it.

A front end gives its user's names, cells and kept traceback through a :class:`Workspace`
(IPython's is ``_ipython/cells.py``). Who holds the memory is read through an
:class:`AttributionSource`: :class:`LiveAttribution` (torch's snapshot, the namespace walk,
the cells' names) unless the front end that composes the session gives another (the
recorded one in ``testing/replay.py``). The services that read them are in ``who.py``
(who holds it, tracking), ``postmortem.py`` (after a failure), ``trace.py`` and
``breakdown.py``.

Reads the namespace: call only on the shell thread while no cell runs (the magics and the
cell hooks do; the panel's requests are sent to the shell thread by the kernel front end).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from ..analysis.segments import segment_map
from ..analysis.who import DeviceHoldings, holdings
from ..collectors.namespace import NamespaceWalker, Place, Root
from ..collectors.snapshot import Recording, read_snapshot
from ..collectors.torch_build import gpu_build, imported_torch, why_no_gpu
from ..errors import ActionRefused
from ..model import AllocatorSnapshot, PostMortem, SegmentMap

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from ..analysis.sites import CellNames, SiteResolver
    from ..model.free import FreeReport


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

    def places(self, optimizer_type: type | None) -> list[Place]:
        """Every place that keeps objects alive: the user's names, the output history's
        entries, the kept traceback (``%gpumem free``)."""
        ...

    def place(self, name: str) -> Place | None:
        """The place a user's argument names (a variable, ``Out[7]``, ``_``), or None."""
        ...

    def let_go(self, place: Place) -> None:
        """Drop the references ``place`` is."""
        ...

    def variables(self) -> Iterable[tuple[str, Any]]:
        """The user's own variables (not the front end's), by name."""
        ...

    def namespace(self) -> Mapping[str, Any]: ...

    def python(self, raw: str) -> str:
        """A cell's source as Python (the front end's transforms applied)."""
        ...


class AttributionSource(Protocol):
    """Where the who service reads who holds the memory: whether allocation sites are
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

    def free(self, names: Sequence[str], dry: bool) -> FreeReport | None:
        """``%gpumem free`` on the source's own records: the plan, and unless ``dry`` the
        plan played on them (the owners let go are gone from later readings), nothing
        measured. None: the source reads the live namespace, which ``core/free.py`` lets go
        of and measures itself. Raises ActionRefused with a sentence."""
        ...


def why_nothing(t: Any) -> str | None:
    """A sentence when there is no GPU memory of PyTorch's to attribute, else None."""
    why = why_no_gpu(None, t, needs="memory")
    return None if why is None else f"{why}: PyTorch holds no GPU memory"


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
        t = imported_torch()
        return t is not None and gpu_build(t) and recording.active(t)

    def set_tracking(self, recording: Recording, on: bool) -> tuple[str, bool]:
        t = imported_torch()
        if not on:
            was_ours = recording.ours
            recording.stop(t)
            if t is not None and gpu_build(t) and recording.active(t):
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
        t = imported_torch()
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
        t = imported_torch()
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

    def free(self, names: Sequence[str], dry: bool) -> FreeReport | None:
        return None  # the live namespace: core/free.py lets go of it and measures


__all__ = [
    "AttributionSource",
    "LiveAttribution",
    "Root",
    "Workspace",
    "why_nothing",
]
