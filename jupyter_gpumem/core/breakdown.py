"""``%%gpumem --breakdown``: what a cell's peak is made of (parameters, gradients,
optimizer state, activations, temporaries, kept from before, block slack), the phase it
fell in and the modules that made most of it.

For the session, around a measured cell: :meth:`Breakdowns.start` installs the hooks before
it, :meth:`Breakdowns.finish` removes them and reads them with the cell's trace
(``trace.py``) through ``analysis.breakdown``. Given the front end's workspace: the user's
modules and optimizers, by name.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..analysis.breakdown import breakdowns_from_raw
from ..collectors.snapshot import read_snapshot
from ..collectors.step import StepRecorder
from ..collectors.torch_build import cuda_ready, imported_torch, why_no_gpu
from ..model import CellReport, Failed
from .attribution import Workspace


class Breakdowns:
    """Installs and reads the hooks of one cell's breakdown at a time."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    def start(self) -> StepRecorder | Failed:
        """Install the hooks of a breakdown; why not when it can't run here."""
        t = imported_torch()
        why = why_no_gpu(
            "--breakdown", t, before_cell="the breakdown's hooks are set before it runs"
        )
        if why is not None:
            return Failed(why)
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
        t = imported_torch()
        if t is None:
            return []
        kinds = (t.nn.Module, t.optim.Optimizer)
        return [
            (k, v)
            for k, v in self.workspace.variables()
            if isinstance(v, kinds) and not k.startswith("_")
        ]

    def finish(
        self,
        recorder: StepRecorder | Failed | None,
        raw: dict[str, Any] | None,
        note: str,
        report: CellReport,
    ) -> CellReport:
        """The report with the breakdown of its peak, read from the hooks' record and the
        cell's trace ``raw`` (or ``note``: why there is none)."""
        if not isinstance(recorder, StepRecorder):
            note = recorder.note if recorder is not None else "the breakdown did not start"
            return replace(report, breakdown_note=note)
        record = recorder.stop()
        if raw is None:
            return replace(report, breakdown_note=f"no breakdown: {note}")
        breakdowns = breakdowns_from_raw(raw, record, report)
        if not breakdowns:
            why = "the cell allocated nothing on a GPU"
            return replace(report, breakdown_note=why)
        return replace(report, breakdowns=breakdowns, breakdown_note="")


__all__ = ["Breakdowns"]
