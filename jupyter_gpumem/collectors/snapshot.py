"""The allocator's snapshot and its allocation-site recording, read from torch.

Facts this module rests on (checked on an H200 with torch 2.11, see
``benchmarks/probes/probe_history.py``):
- ``_record_memory_history(enabled="state", context="state", stacks="python")`` keeps the
  Python stack of each live block only; called before CUDA is initialised it creates no
  context and still applies to the first allocation.
- ``torch._C._cuda_isHistoryEnabled()`` says whether anyone records (also in "state" mode);
  there is no getter for the mode itself.
- A snapshot costs ~0.7 ms for 1k blocks without frames, 1.6 ms with 18 frames per block,
  19 ms for 10k blocks with frames. ``_cuda_memorySnapshot((0, 0, False))`` leaves out the
  trace entries (torch >= 2.10: ``memory_snapshot(include_traces=...)``).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Mapping
from typing import Any

from ..model import AllocatorSnapshot, Segment
from .torch_build import cuda_ready, gpu_build, imported_torch, why_no_gpu


def history_enabled(t: Any) -> bool | None:
    """Whether the allocator records allocation sites (ours or the user's own recording);
    None when this torch can't tell, or before CUDA starts (asking then could start it)."""
    f = getattr(t._C, "_cuda_isHistoryEnabled", None)
    if f is None or not cuda_ready(t):
        return None
    return bool(f())


def _can_skip_traces(t: Any) -> bool:
    try:
        return "include_traces" in inspect.signature(t.cuda.memory.memory_snapshot).parameters
    except (TypeError, ValueError, AttributeError):
        return False


_SKIP_TRACES: dict[int, bool] = {}


def read_snapshot(t: Any | None = None, traces: bool = False) -> AllocatorSnapshot | None:
    """All segments and blocks of every device, or None when there is nothing to read
    (torch not imported, not a CUDA build, CUDA not initialised: no context is created).

    ``traces``: also the recorded alloc/free history (``device_traces``), as
    ``torch.cuda.memory._snapshot()`` returns it; only ``%%gpumem --trace`` asks.
    """
    t = t if t is not None else imported_torch()
    if t is None or not cuda_ready(t):
        return None
    now = time.time()
    raw: Mapping[str, Any]
    key = id(t)
    if key not in _SKIP_TRACES:
        _SKIP_TRACES[key] = _can_skip_traces(t)
    if not traces and _SKIP_TRACES[key]:
        raw = t._C._cuda_memorySnapshot((0, 0, False))
    else:
        raw = t.cuda.memory._snapshot()
    return snapshot_from_dict(raw, tracking=bool(history_enabled(t)), time_=now)


def snapshot_from_dict(
    raw: Mapping[str, Any], tracking: bool | None = None, time_: float | None = None
) -> AllocatorSnapshot:
    """From the dict of ``torch.cuda.memory._snapshot()`` (also a memory_viz pickle or a
    recorded JSON fixture). ``tracking`` defaults to "some block carries frames"."""
    segments: list[Segment] = list(raw.get("segments", ()))
    if tracking is None:
        tracking = any(b.get("frames") for s in segments for b in s.get("blocks", ()))
    return AllocatorSnapshot(
        time=time.time() if time_ is None else time_,
        segments=segments,
        tracking=tracking,
        settings=dict(raw.get("allocator_settings") or {}),
    )


class Recording:
    """Allocation-site recording (``%gpumem track on|off``) for one kernel.

    Only switched by the user (or ``c.GpuMem.track``); never changes what the program
    computes. If someone else (the user's own ``_record_memory_history`` call) already
    records, we leave it alone: their recording gives us the frames as well.
    """

    def __init__(self) -> None:
        self.wanted = False  # the user asked for it; starts once torch is imported
        self.ours = False  # we switched it on (and will switch it off)
        self.error: str | None = None
        # Blocks alive when tracking started (device, address, size): their missing frames
        # mean "before tracking", not "no Python stack".
        self.before: frozenset[tuple[int, int, int]] = frozenset()

    def supported(self, t: Any) -> str | None:
        """None when this torch can record allocation sites, else why not."""
        if not gpu_build(t):
            return f"{why_no_gpu(None, t)}: there is no GPU allocator to track"
        f = getattr(getattr(t.cuda, "memory", None), "_record_memory_history", None)
        if f is None:
            return f"torch {t.__version__} cannot record allocation sites (needs torch >= 2.1)"
        try:
            names = set(inspect.signature(f).parameters)
        except (TypeError, ValueError):
            names = set()
        if names and "context" not in names and "args" not in names:
            return f"torch {t.__version__} cannot record allocation sites (needs torch >= 2.1)"
        return None

    def active(self, t: Any | None = None) -> bool:
        t = t if t is not None else imported_torch()
        if t is None:
            return False
        enabled = history_enabled(t) if hasattr(t, "_C") else None
        return self.ours if enabled is None else enabled

    def start(self, t: Any) -> str | None:
        """Switch recording on; returns an error sentence or None."""
        why = self.supported(t)
        if why is not None:
            self.error = why
            return why
        if history_enabled(t):
            if not self.ours:
                self.before = self._alive(t)
            return None  # someone records already (maybe us): frames are there
        try:
            t.cuda.memory._record_memory_history(enabled="state", context="state", stacks="python")
        except Exception as e:  # an old torch that refuses the arguments
            self.error = f"cannot record allocation sites: {e}"
            return self.error
        self.ours = True
        self.error = None
        self.before = self._alive(t)
        return None

    def stop(self, t: Any | None) -> None:
        if t is not None and self.ours:
            try:
                t.cuda.memory._record_memory_history(enabled=None)
            except Exception:
                pass
        self.ours = False
        self.before = frozenset()

    @staticmethod
    def _alive(t: Any) -> frozenset[tuple[int, int, int]]:
        snap = read_snapshot(t)
        if snap is None:
            return frozenset()
        return frozenset(
            (s.get("device", 0), b["address"], b["size"])
            for s in snap.segments
            for b in s.get("blocks", ())
            if b["state"] == "active_allocated"
        )


class Trace:
    """The allocator's full history for one cell (``%%gpumem --trace``), then recording goes
    back to how it was: our "state" tracking, or off. A recording the user started
    themselves is left alone; the cell's entries are then taken from it by time."""

    def __init__(self, recording: Recording, entries: int, stacks: bool = True) -> None:
        self.recording = recording
        self.entries = entries
        # Without stacks (``--breakdown`` alone) the trace holds addresses and sizes only,
        # which is all a breakdown needs, at a fraction of the cost per allocation.
        self.stacks = stacks
        self.start_us = 0.0
        self.foreign = False
        self.started = False

    def start(self, t: Any) -> None:
        self.start_us = time.time() * 1e6
        self.foreign = bool(history_enabled(t)) and not self.recording.ours
        if not self.foreign:
            # Without stacks, allocation tracking (when on) still needs the frames of the
            # blocks that stay alive ("state"): the lines of what the cell keeps.
            context = "all" if self.stacks else ("state" if self.recording.ours else None)
            t.cuda.memory._record_memory_history(
                enabled="all",
                context=context,
                stacks="python",
                max_entries=self.entries,
                clear_history=True,
            )
        self.started = True

    def stop(self, t: Any) -> dict[str, Any] | None:
        """The raw snapshot with this cell's trace entries (``_snapshot()``'s dict, as
        memory_viz reads it), or None when CUDA never started. Restores the recording."""
        if not self.started:
            return None
        self.started = False
        raw: dict[str, Any] | None = None
        try:
            if cuda_ready(t):
                raw = dict(t.cuda.memory._snapshot())
        finally:
            if not self.foreign:
                if self.recording.ours:
                    t.cuda.memory._record_memory_history(
                        enabled="state", context="state", stacks="python"
                    )
                else:
                    t.cuda.memory._record_memory_history(enabled=None)
        if raw is not None and self.foreign:
            raw["device_traces"] = [
                [e for e in trace if e.get("time_us", 0) >= self.start_us]
                for trace in raw.get("device_traces", [])
            ]
        return raw
