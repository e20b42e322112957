"""The demo's kernel: plays back a recording of the demo notebook made on a GPU.

``jupyter-gpumem demo`` starts its kernels with this module as an IPython extension
(``--ext=jupyter_gpumem.testing.player``) and with :func:`env`. The recording
(``recorded/demo_cells.json``, written by ``tests/gpu/record_demo.py`` on a GPU) holds,
for each code cell of the demo notebook: its source, its outputs, the raw allocator and
NVML readings sampled while it ran, the history rows and the panel's cell markers it made,
and what ``who`` and the segment map read after it.

Running a cell whose source is a recorded cell's plays that cell: the kernel's GPU figures
(the panel, the status bar, ``%gpumem``) move through the readings recorded while it ran,
in order, over up to a few seconds; then its outputs are shown, each marked *replay*, its
history rows and cell markers join the session's, and ``who`` and the segment map answer
from what was recorded after it. A recorded error is raised again (with its recorded
traceback). No torch and no GPU are needed.

A cell that is not in the recording (edited or added) runs for real. A cell of only
``%gpumem`` commands asks the tool about the replayed state; any other cell is measured by
this machine's own backend (no GPU, or a CPU-only torch), so its report says what this
machine has instead of mixing in replayed figures.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ActionRefused
from ..model import PostMortem, SegmentMap
from ..model.history import DeviceRow, HistoryRow
from ..protocol.convert import to_protocol
from .replay import RecordedAttribution, ReplayBackend, recorded_postmortem, recorded_segment_maps

RECORDING_ENV = "JUPYTER_GPUMEM_DEMO_RECORDING"
EXTENSION = "jupyter_gpumem.testing.player"
# A played cell lasts as long as it did on the GPU, within these bounds (seconds): long
# enough for the panel to show its readings move, short enough for Run All.
MIN_PLAY_S, MAX_PLAY_S = 0.6, 3.0


def recording_path() -> str:
    return os.environ.get(RECORDING_ENV) or str(
        Path(__file__).resolve().parent / "recorded" / "demo_cells.json"
    )


def env(path: str | None = None) -> dict[str, str]:
    """The environment of a kernel that plays the recording (with the extension loaded)."""
    return {
        "JUPYTER_GPUMEM_BACKEND": f"{EXTENSION}:backend",
        "JUPYTER_GPUMEM_ATTRIBUTION": f"{EXTENSION}:attribution",
        RECORDING_ENV: path or recording_path(),
    }


@dataclass(frozen=True)
class RecordedCell:
    index: int  # among the recorded cells, in the order they ran
    source: str
    execution_count: int | None
    duration_s: float
    frames: tuple[tuple[float, Mapping[str, Any]], ...]  # (seconds into the cell, raw reading)
    outputs: tuple[Mapping[str, Any], ...]  # nbformat outputs
    history: tuple[list[Any], ...]
    markers: tuple[Mapping[str, Any], ...]
    attribution: Mapping[str, Any] | None


@dataclass(frozen=True)
class DemoRecording:
    meta: Mapping[str, Any]
    before: Mapping[str, Any]  # the kernel's reading before the first cell
    cells: tuple[RecordedCell, ...]

    @classmethod
    def load(cls, path: str) -> DemoRecording:
        with open(path) as f:
            data = json.load(f)
        cells = tuple(
            RecordedCell(
                i,
                c["source"],
                c.get("execution_count"),
                float(c.get("duration_s", 0.0)),
                tuple((float(t), raw) for t, raw in c["frames"]),
                tuple(c.get("outputs", ())),
                tuple(c.get("history", ())),
                tuple(c.get("markers", ())),
                c.get("attribution"),
            )
            for i, c in enumerate(data["cells"])
        )
        return cls(data.get("meta", {}), data["before"], cells)

    def label(self) -> str:
        """ "replay · recorded on an NVIDIA H200 (torch 2.11.0+cu130), 2026-11-29"."""
        m = self.meta
        torch = f" (torch {m['torch']})" if m.get("torch") else ""
        day = f", {m['recorded']}" if m.get("recorded") else ""
        return f"replay · recorded on an {m.get('device', 'GPU')}{torch}{day}"


def key(source: str) -> str:
    """What two sources must share to be the same cell: the text, line ends and trailing
    blanks aside."""
    return "\n".join(line.rstrip() for line in source.replace("\r\n", "\n").strip().split("\n"))


class PlayerBackend(ReplayBackend):
    """The readings of the cell being played, in time; between cells, the last one."""

    def __init__(self, recording: DemoRecording, clock: Any = time.monotonic) -> None:
        super().__init__({"timeline": [recording.before], "meta": recording.meta}, clock)
        self._rest: Mapping[str, Any] = recording.before
        self._script: tuple[float, tuple[tuple[float, Mapping[str, Any]], ...]] | None = None
        self.session: Any = None

    def bind_session(self, session: Any) -> None:
        """Called by the extension with the session it made over this backend."""
        self.session = session

    def play(self, cell: RecordedCell, duration: float) -> None:
        """Move through ``cell``'s readings over ``duration`` seconds from now."""
        scale = duration / cell.duration_s if cell.duration_s > 0 else 0.0
        self._freed.clear()  # the recording goes on from its own state
        self._peak_floor.clear()
        self._fraction.clear()
        self._script = (self._clock(), tuple((t * scale, raw) for t, raw in cell.frames))

    def settle(self, cell: RecordedCell) -> None:
        """The reading after ``cell``, from now on."""
        self._script = None
        self._rest = cell.frames[-1][1]

    def _frame(self) -> dict[str, Any]:
        script = self._script
        if script is None:
            return dict(self._rest)
        start, frames = script
        elapsed = self._clock() - start
        current = frames[0][1]
        for t, raw in frames:
            if t > elapsed:
                break
            current = raw
        return dict(current)

    def cuda_ready(self) -> bool:
        return any(d.get("initialized") for d in self._frame()["devices"])


class PlayerAttribution(RecordedAttribution):
    """``who`` and the segment map as recorded after the last cell played; the post-mortem
    of the last recorded out-of-memory error played."""

    def __init__(self) -> None:
        self.data = {}
        self.frees = {}
        self._cell: Mapping[str, Any] | None = None
        self._oom: Mapping[str, Any] | None = None

    def settle(self, cell: RecordedCell) -> None:
        self.frees = {}  # what was freed is the recording's own from here on
        self._cell = cell.attribution
        if cell.attribution is not None and "oom" in cell.attribution:
            self._oom = cell.attribution

    def record(self, name: str = "cells") -> dict[str, Any]:
        if self._cell is None:
            raise ActionRefused("CUDA is not initialised in this kernel (replay)")
        return dict(self._cell)

    def tracking(self, recording: Any) -> bool:
        rec = self._cell
        return rec is not None and any(
            b.get("frames") for s in rec["segments"] for b in s.get("blocks", ())
        )

    def set_tracking(self, recording: Any, on: bool) -> tuple[str, bool]:
        return "allocation tracking follows the recording in the demo (replay)", False

    def segment_maps(self, device: int | None, max_segments: int | None) -> list[SegmentMap]:
        return recorded_segment_maps(self.record(), device, max_segments)

    def known_postmortems(self) -> tuple[PostMortem, ...]:
        return () if self._oom is None else (recorded_postmortem(self._oom),)


@dataclass(frozen=True)
class RecordedMarker:
    """A recorded cell marker (``CellMarker`` of the protocol), for the panel."""

    marker: Mapping[str, Any]


to_protocol.register(RecordedMarker, lambda m: dict(m.marker))


class RecordedError(Exception):
    """A recorded cell's error raised again: its recorded traceback, marked replay."""

    lines: tuple[str, ...] = ()

    def _render_traceback_(self) -> list[str]:
        return list(self.lines)


_COMMAND = re.compile(r"%gpumem(\s|$)")


def only_commands(source: str) -> bool:
    """A cell of ``%gpumem`` lines (and comments): it asks about the replayed state."""
    lines = [s.strip() for s in source.splitlines() if s.strip() and not s.strip().startswith("#")]
    return bool(lines) and all(_COMMAND.match(s) for s in lines)


class Player:
    def __init__(self, recording: DemoRecording) -> None:
        self.recording = recording
        self.label = recording.label()
        self.by_key = {key(c.source): c for c in recording.cells}
        self.backend = PlayerBackend(recording)
        self.attribution = PlayerAttribution()
        self._real: Any = None
        self.played = -1  # the index of the last recorded cell played
        self._after_error: list[Mapping[str, Any]] = []
        self.shell: Any = None

    # -- the kernel ---------------------------------------------------------------------
    def attach(self, shell: Any) -> None:
        """Hooks around the gpumem extension's own (loaded here: the recorded first cell
        that loads it is played, not run)."""
        self.shell = shell
        shell.events.register("pre_run_cell", self.pre_run_cell)
        shell.input_transformers_cleanup.insert(0, self.transform)
        shell.extension_manager.load_extension("jupyter_gpumem")
        shell.events.register("post_run_cell", self.post_run_cell)

    def session(self) -> Any:
        """The gpumem session of the kernel (handed to the backend when it was made)."""
        return self.backend.session

    def recorded(self, source: str) -> RecordedCell | None:
        """The recorded cell that running ``source`` plays, if any. A cell of ``%gpumem``
        commands only is played in its place in the recording (the next one); elsewhere it
        asks about the replayed state as it is, not as it was when the command was recorded.
        """
        cell = self.by_key.get(key(source))
        if cell is None or (cell.index != self.played + 1 and only_commands(source)):
            return None
        return cell

    def transform(self, lines: list[str]) -> list[str]:
        """A recorded cell becomes a call that plays it. Pure (IPython also calls it for
        completeness checks)."""
        cell = self.recorded("".join(lines))
        if cell is None:
            return lines
        return [f"__import__({EXTENSION!r}, fromlist=['play']).play({cell.index})\n"]

    def pre_run_cell(self, info: Any) -> None:
        session = self.session()
        if session is None:
            return
        raw = getattr(info, "raw_cell", "") or ""
        recorded = self.recorded(raw) is not None
        session.playing = recorded
        if recorded or only_commands(raw):
            session.collector.backend = self.backend
        else:  # run for real: measured by what this machine has
            session.collector.backend = self.real_backend()

    def post_run_cell(self, result: Any) -> None:
        pending, self._after_error = self._after_error, []
        for output in pending:
            self._show(output)
        session = self.session()
        if session is not None:
            session.playing = False
            session.collector.backend = self.backend

    def real_backend(self) -> Any:
        if self._real is None:
            from ..collectors.allocator import TorchBackend

            self._real = TorchBackend()
        return self._real

    # -- playing a cell -----------------------------------------------------------------
    def play(self, index: int) -> Any:
        cell = self.recording.cells[index]
        self.played = index
        duration = min(max(cell.duration_s, MIN_PLAY_S), MAX_PLAY_S)
        self.backend.play(cell, duration)
        try:
            time.sleep(duration)
        finally:
            self.backend.settle(cell)
            self.attribution.settle(cell)
        self._record(cell)
        result = None
        for i, output in enumerate(cell.outputs):
            kind = output.get("output_type")
            if kind == "error":
                self._after_error = list(cell.outputs[i + 1 :])
                raise self._error(output)
            if kind == "execute_result":
                result = _Result(self._marked(output.get("data", {})), output.get("metadata", {}))
            else:
                self._show(output)
        return result

    def _record(self, cell: RecordedCell) -> None:
        """The cell's history rows and markers, as the session would have made them now."""
        session = self.session()
        if session is None:
            return
        now = time.time()
        for row in cell.history:
            devices = tuple(DeviceRow(*d) for d in row[-1])
            first_line, wall_time, failed, rss = row[2:6]
            session.history.add_row(
                HistoryRow(row[0], now, first_line, wall_time, failed, rss, devices)
            )
        for marker in cell.markers:
            for listener in list(session.report_listeners):
                try:
                    listener(RecordedMarker({**marker, "time": now}))
                except Exception:
                    pass  # a listener's failure is not the cell's

    def _show(self, output: Mapping[str, Any]) -> None:
        kind = output.get("output_type")
        if kind == "stream":
            stream = sys.stderr if output.get("name") == "stderr" else sys.stdout
            stream.write(f"[{self.label}]\n" + _text(output.get("text", "")))
            stream.flush()
        elif kind in ("display_data", "execute_result"):
            from IPython.display import publish_display_data

            publish_display_data(self._marked(output.get("data", {})), output.get("metadata", {}))

    def _marked(self, data: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(data)
        if "text/plain" in out:
            out["text/plain"] = f"[{self.label}]\n" + _text(out["text/plain"])
        if "text/html" in out:
            out["text/html"] = (
                '<div class="gpumem-replay-label" style="font-size:0.85em;opacity:0.75;'
                f'margin:0 0 2px 0">&#9654; {self.label}</div>' + _text(out["text/html"])
            )
        return out

    def _error(self, output: Mapping[str, Any]) -> RecordedError:
        name = str(output.get("ename", "Error"))
        cls = type(name, (RecordedError,), {"__module__": "replay"})
        err = cls(str(output.get("evalue", "")))
        err.lines = (f"[{self.label}]", *output.get("traceback", []))
        return err


class _Result:
    """A recorded ``execute_result``: shown by IPython's display hook as ``Out[n]``."""

    def __init__(self, data: Mapping[str, Any], metadata: Mapping[str, Any]) -> None:
        self.data, self.metadata = data, metadata

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> tuple[Any, Any]:
        return dict(self.data), dict(self.metadata)


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


_PLAYER: Player | None = None


def player() -> Player:
    """The kernel's player (one per process), over :func:`recording_path`."""
    global _PLAYER
    if _PLAYER is None:
        _PLAYER = Player(DemoRecording.load(recording_path()))
    return _PLAYER


def play(index: int) -> Any:
    """What a recorded cell becomes (:meth:`Player.transform`)."""
    return player().play(index)


def backend() -> PlayerBackend:
    """``JUPYTER_GPUMEM_BACKEND=jupyter_gpumem.testing.player:backend``."""
    return player().backend


def attribution() -> PlayerAttribution:
    """``JUPYTER_GPUMEM_ATTRIBUTION=jupyter_gpumem.testing.player:attribution``."""
    return player().attribution


def load_ipython_extension(shell: Any) -> None:
    player().attach(shell)
