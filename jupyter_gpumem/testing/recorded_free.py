"""``%gpumem free`` on recorded attribution (the replay kernel, the demo): the plan made by
the same ``analysis/free_plan.plan`` as live, from the recorded references grouped by owner
and the recorded snapshot; a real run plays it on the records.

Playing a plan: the references of each owner it lets go of are dropped (a detached tensor
drops only those through its autograd graph), and the blocks it expects to be freed are
freed in the snapshot, then the segments left with no live block are given back (the
``empty_cache`` that ``%gpumem free`` runs). Later ``who`` readings of the kernel read the
records so changed: the owners let go are gone. Nothing is measured: the report's measured
figures stay None, and a note says the plan was played on recorded data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..analysis.free_plan import (
    TRACEBACK,
    Key,
    holder_kind,
    nothing_to_free,
    plan,
    unknown_name,
    walks_from_references,
)
from ..errors import ActionRefused
from ..model import ACTIVE, AllocatorSnapshot, Reference
from ..model.free import FreeReport
from ..model.snapshot import Block, Segment

REPLAYED = (
    "replayed on recorded data: the plan was played on the recording (what it lets go of "
    "is gone from `who`), nothing was measured, so what came back to the driver is unknown"
)


class RecordedFrees:
    """What the frees played so far took away from one recording."""

    def __init__(self) -> None:
        self.gone: set[str] = set()  # owners let go (deleted, forgotten, released)
        self.detached: set[str] = set()  # tensors that dropped their autograd graphs
        self.freed: set[Key] = set()  # blocks freed (device, address)

    def references(self, raw: Iterable[Sequence[Any]]) -> list[Reference]:
        """The recorded references (rows of ``refs``) that the frees left."""
        out = []
        for row in raw:
            r = Reference(*row)
            owner = TRACEBACK if holder_kind(r.owner) == "traceback" else r.owner
            if owner in self.gone or (owner in self.detached and r.via == "autograd graph"):
                continue
            out.append(r)
        return out

    def snapshot(self, snap: AllocatorSnapshot) -> AllocatorSnapshot:
        """The recorded snapshot with the freed blocks freed and the segments left empty
        given back (``empty_cache``)."""
        if not self.freed:
            return snap
        segments: list[Segment] = []
        for seg in snap.segments:
            device = seg.get("device", 0)
            blocks: list[Block] = [
                {**b, "state": "inactive"} if (device, b["address"]) in self.freed else b
                for b in seg.get("blocks", ())
            ]
            live = [b for b in blocks if b["state"] != "inactive"]
            if not live:
                continue
            left: Segment = {**seg, "blocks": blocks}
            left["allocated_size"] = sum(b["size"] for b in live if b["state"] == ACTIVE)
            left["active_size"] = sum(b["size"] for b in live)
            segments.append(left)
        return AllocatorSnapshot(snap.time, segments, snap.tracking, snap.settings)

    def owners(self, record: Mapping[str, Any]) -> list[str]:
        """The names a free on ``record`` knows: the owners of the references left (the
        kept traceback is no name)."""
        walks = walks_from_references(self.references(record["refs"]))
        return [w.owner for w in walks if w.kind != "traceback"]

    def free(
        self,
        record: Mapping[str, Any],
        snap: AllocatorSnapshot,
        names: Sequence[str],
        dry: bool,
    ) -> FreeReport:
        """The plan for ``names`` on ``record`` (``refs``) and ``snap`` (this object's
        frees applied to both); unless ``dry``, played. Raises ActionRefused with the
        sentences the live service uses."""
        walks = walks_from_references(self.references(record["refs"]))
        known = [w.owner for w in walks if w.kind != "traceback"]
        for n in names:
            if n not in known:
                raise ActionRefused(unknown_name(n, known))
        snap = self.snapshot(snap)
        report, freed = plan(names, walks, snap, (REPLAYED,))
        if report.held == 0:
            raise ActionRefused(nothing_to_free(names))
        if dry:
            return report
        for g in report.let_go:
            if g.action == "detach":
                self.detached.add(g.holder)
            else:
                self.gone.add(g.holder)
        self.freed |= freed
        return replace(report, done=True)


__all__ = ["REPLAYED", "RecordedFrees"]
