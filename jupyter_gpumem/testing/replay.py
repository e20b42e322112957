"""Test-only backend: replays allocator readings recorded on a real GPU.

Plugged in like any backend, by import path: ``JUPYTER_GPUMEM_BACKEND=
jupyter_gpumem.testing.replay:from_env`` with ``JUPYTER_GPUMEM_REPLAY=<fixture.json>`` (the UI
tests and ``jupyter-gpumem demo`` set both for the kernel on machines without a GPU,
:func:`env` gives them); every measurement then carries the recording's provenance
(:meth:`ReplayBackend.replay`, from the fixture's ``meta``), and every view says that it is
a replay. Nothing in the package's production code names it. When
an ``attribution.json`` (``tests/gpu/record_attribution.py``) lies beside the fixture,
``JUPYTER_GPUMEM_ATTRIBUTION=jupyter_gpumem.testing.replay:attribution_from_env`` makes it
the session's attribution source (:class:`RecordedAttribution`): ``who`` answers from its
recorded snapshot, namespace references and cell names, through the same analyses as live
data, and the recorded OOM gives a post-mortem. The fixture is
written by ``tests/gpu/record_fixtures.py``; its raw readings go through the same
:func:`make_device_sample` as live ones. Actions are simulated on top of the recording
(empty_cache drops the cached surplus, reset_peak, caching switch, caps), so every panel
button can be exercised.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..analysis.postmortem import explain_oom
from ..analysis.segments import segment_map
from ..analysis.sites import SiteResolver
from ..analysis.who import DeviceHoldings, holdings
from ..collectors.nvml import NvmlDevice
from ..collectors.readings import Reading, make_device_sample, stats_from_flat
from ..collectors.snapshot import Recording, snapshot_from_dict
from ..model import (
    AllocatorSnapshot,
    AllocatorStats,
    DeviceSample,
    OomEvent,
    PostMortem,
    Reference,
    Replay,
    SegmentMap,
)
from .recorded_free import RecordedFrees

if TYPE_CHECKING:
    from ..core.attribution import AttributionSource
    from ..model.free import FreeReport


def device_from_raw(raw: Mapping[str, Any]) -> DeviceSample:
    """A recorded raw device reading -> :class:`DeviceSample`."""
    nv = raw.get("nvml")
    mgi = raw.get("mem_get_info")
    stats = raw.get("memory_stats")
    return make_device_sample(
        index=int(raw["index"]),
        name=str(raw.get("name", "")),
        backend=raw.get("backend", "cuda"),
        initialized=bool(raw["initialized"]),
        stats=stats_from_flat(stats) if stats else None,
        nvml=NvmlDevice(nv["name"], nv["total"], nv["used"], nv.get("process_used"))
        if nv
        else None,
        mem_get_info=(int(mgi[0]), int(mgi[1])) if mgi else None,
        fraction=raw.get("fraction"),
    )


def reading_from_raw(raw: Mapping[str, Any], message: str = "") -> Reading:
    return Reading(
        state=raw.get("state", "ok"),
        message=message or raw.get("message", ""),
        torch_version=raw.get("torch_version"),
        caching=raw.get("caching"),
        devices=tuple(device_from_raw(d) for d in raw["devices"]),
    )


def from_env() -> ReplayBackend:
    """The backend ``JUPYTER_GPUMEM_BACKEND=jupyter_gpumem.testing.replay:from_env`` makes:
    the fixture named by ``JUPYTER_GPUMEM_REPLAY``."""
    path = os.environ.get(REPLAY_ENV)
    if not path:
        raise RuntimeError(
            f"{REPLAY_ENV} must name a fixture (jupyter_gpumem/testing/recorded/gpu_readings.json)"
        )
    return ReplayBackend(path)


REPLAY_ENV = "JUPYTER_GPUMEM_REPLAY"


def attribution_from_env() -> AttributionSource | None:
    """The attribution source ``JUPYTER_GPUMEM_ATTRIBUTION=jupyter_gpumem.testing.replay:
    attribution_from_env`` makes: the one recorded beside the fixture named by
    ``JUPYTER_GPUMEM_REPLAY`` (None, that is the live one, when there is none)."""
    path = os.environ.get(REPLAY_ENV)
    return RecordedAttribution.beside(path) if path else None


def env(path: str) -> dict[str, str]:
    """The environment that makes a kernel replay the readings recorded in ``path`` (and
    the attribution recorded beside them)."""
    return {
        "JUPYTER_GPUMEM_BACKEND": "jupyter_gpumem.testing.replay:from_env",
        "JUPYTER_GPUMEM_ATTRIBUTION": "jupyter_gpumem.testing.replay:attribution_from_env",
        REPLAY_ENV: path,
    }


class ReplayBackend:
    def __init__(
        self, path: str | Mapping[str, Any], clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``path``: the fixture, or its data (``timeline``, ``period_s``, ``meta``)."""
        if isinstance(path, Mapping):
            data = path
        else:
            with open(path) as f:
                data = json.load(f)
        self.timeline: list[dict[str, Any]] = data["timeline"]
        self.period = float(data.get("period_s", 0.1))
        self._replay = recording_of(data)
        self._clock = clock
        self._t0 = clock()
        self._freed: dict[int, int] = {}  # reserved bytes dropped by simulated empty_cache
        self._peak_floor: dict[int, tuple[int, int]] = {}  # after reset_peak
        # what the last reading said: a peak reset floors at it, as a real allocator's
        # peak is never below what was allocated when the counter was reset
        self._last: dict[int, tuple[int, int]] = {}
        self._caching = True
        self._fraction: dict[int, float] = {}

    def actionable(self) -> str | None:
        return None  # every action is simulated on the recording

    def replay(self) -> Replay:
        return self._replay

    def _frame(self) -> dict[str, Any]:
        i = int((self._clock() - self._t0) / self.period) % len(self.timeline)
        return self.timeline[i]

    def read(self, with_process: bool = True, full: bool = True) -> Reading:
        r = reading_from_raw(self._frame())
        devices = []
        for d in r.devices:
            a = d.allocator
            if a is not None:
                freed = min(self._freed.get(d.index, 0), a.reserved - a.allocated)
                pa, pr = self._peak_floor.get(d.index, (a.peak_allocated, a.peak_reserved))
                self._last[d.index] = (a.allocated, a.reserved - freed)
                a = _replace_stats(
                    a,
                    reserved=a.reserved - freed,
                    # free pieces of split blocks can't exceed what is cached but not in use
                    inactive_split=min(a.inactive_split, a.reserved - freed - a.allocated),
                    peak_allocated=max(pa, a.allocated),
                    peak_reserved=max(pr, a.reserved - freed),
                )
                f = self._fraction.get(d.index)
                limit = d.limit  # as recorded, unless a cap is simulated
                if f is not None and d.total:
                    from ..model import Limit

                    limit = Limit(f, int(f * d.total))
                d = DeviceSample(
                    d.index,
                    d.name,
                    d.backend,
                    d.initialized,
                    a,
                    d.total,
                    None if d.device_used is None else d.device_used - freed,
                    None if d.process_used is None else d.process_used - freed,
                    limit,
                    d.error,
                )
            devices.append(d)
        return Reading(r.state, r.message, r.torch_version, self._caching, tuple(devices))

    def initialized_devices(self) -> list[int]:
        return [d.index for d in self.read().devices if d.initialized]

    def device_count(self) -> int:
        return len(self._frame()["devices"])

    def reset_peaks(self, devices: list[int] | None = None) -> None:
        last = dict(self._last)  # the reading before this reset (the replay moves on)
        for d in self.read().devices:
            if d.allocator is not None and (devices is None or d.index in devices):
                la, lr = last.get(d.index, (0, 0))
                self._peak_floor[d.index] = (
                    max(d.allocator.allocated, la),
                    max(d.allocator.reserved, lr),
                )

    def attach_oom_observer(self, callback: Any) -> bool:
        return False  # recorded readings raise no OOM of their own

    def cuda_ready(self) -> bool:
        return True

    def empty_cache(self) -> None:
        for d in reading_from_raw(self._frame()).devices:
            if d.allocator is not None:
                self._freed[d.index] = d.allocator.reserved - d.allocator.allocated

    def caching_supported(self) -> str | None:
        return None

    def set_caching(self, enabled: bool) -> bool:
        self._caching = enabled
        return enabled

    def set_limit(self, device: int, fraction: float) -> None:
        if fraction >= 1.0:
            self._fraction.pop(device, None)
        else:
            self._fraction[device] = fraction

    def total_for_limit(self, device: int) -> int:
        d = self.read().devices[device]
        return int(d.total or 0)


def recording_of(data: Mapping[str, Any]) -> Replay:
    """Where a fixture was recorded, from its ``meta`` (``device``, ``torch``,
    ``recorded``), else from its first reading."""
    meta = data.get("meta") or {}
    first: Mapping[str, Any] = (data.get("timeline") or [{}])[0]
    devices = first.get("devices") or [{}]
    gpu = meta.get("device") or devices[0].get("name") or "GPU"
    torch = meta.get("torch") or first.get("torch_version")
    recorded = meta.get("recorded")
    return Replay(str(gpu), str(torch) if torch else None, str(recorded) if recorded else None)


def _replace_stats(a: AllocatorStats, **kw: int) -> AllocatorStats:
    from dataclasses import replace

    return replace(a, **kw)


class RecordedCells:
    """IPython's cell names (file name -> execution count, source lines) as recorded."""

    def __init__(self, record: Mapping[str, Any]) -> None:
        self.map: dict[str, int] = dict(record.get("filename_map", {}))
        self.lines: dict[str, dict[str, str]] = dict(record.get("lines", {}))

    def execution_count(self, filename: str) -> int | None:
        return self.map.get(filename)

    def line_text(self, filename: str, line: int) -> str:
        return self.lines.get(filename, {}).get(str(line), "").strip()

    def files_of(self, count: int) -> frozenset[str]:
        return frozenset(f for f, n in self.map.items() if n == count)


class RecordedAttribution:
    """What ``who`` reads, as recorded on a GPU (attribution.json): a
    :class:`~jupyter_gpumem.core.attribution.AttributionSource`. Tracking is simulated:
    sites are recorded when the user wants them; ``free`` plays its plan on the records
    (``recorded_free.py``)."""

    def __init__(self, path: str) -> None:
        with open(path) as f:
            self.data: dict[str, Any] = json.load(f)
        self.frees: dict[str, RecordedFrees] = {}  # by record

    @classmethod
    def beside(cls, fixture: str) -> RecordedAttribution | None:
        path = os.path.join(os.path.dirname(os.path.abspath(fixture)), "attribution.json")
        return cls(path) if os.path.exists(path) else None

    def record(self, name: str = "cells") -> dict[str, Any]:
        return dict(self.data[name])

    # -- core.attribution.AttributionSource ----------------------------------------------
    def tracking(self, recording: Recording) -> bool:
        return recording.wanted

    def set_tracking(self, recording: Recording, on: bool) -> tuple[str, bool]:
        return f"allocation tracking is {'on' if on else 'off'} (recorded data)", False

    def holdings(
        self,
        recording: Recording,
        devices: list[int] | None,
        walk: bool,
        snapshot: AllocatorSnapshot | None,
    ) -> dict[int, DeviceHoldings]:
        """The recorded snapshot matched with the recorded references (the namespace was
        walked when it was recorded)."""
        tracking = self.tracking(recording)
        rec = self.record("cells")
        snap = self.freed("cells").snapshot(snapshot_from_dict(rec, tracking=tracking))
        if not tracking:  # as if recorded without sites
            segments = [
                {**seg, "blocks": [{**b, "frames": []} for b in seg.get("blocks", ())]}
                for seg in snap.segments
            ]
            snap = AllocatorSnapshot(snap.time, segments, False)  # type: ignore[arg-type]
        resolver = SiteResolver(RecordedCells(rec), rec["library_dirs"])
        refs = self.freed("cells").references(rec["refs"])
        before = frozenset(tuple(k) for k in rec["before"])
        return {d: holdings(snap, d, refs, resolver, before) for d in devices or [0]}

    def segment_maps(self, device: int | None, max_segments: int | None) -> list[SegmentMap]:
        return recorded_segment_maps(self.record("oom_fragmentation"), device, max_segments)

    def known_postmortems(self) -> tuple[PostMortem, ...]:
        """The recorded OOM's post-mortem."""
        return (recorded_postmortem(self.record("oom_fragmentation")),)

    def freed(self, record: str) -> RecordedFrees:
        """What the frees played so far took from one record."""
        return self.frees.setdefault(record, RecordedFrees())

    def free(self, names: Sequence[str], dry: bool) -> FreeReport:
        """The plan for ``names`` from the references and snapshot ``who`` reads; unless
        ``dry``, played on them. Names of the recorded out-of-memory error's moment (its
        post-mortem's fixes) are planned on that record."""
        name = "cells"
        for other in ("cells", "oom_fragmentation"):
            try:
                known = self.freed(other).owners(self.record(other))
            except KeyError:  # not recorded
                continue
            if all(n in known for n in names):
                name = other
                break
        rec = self.record(name)
        return self.freed(name).free(rec, snapshot_from_dict(rec, tracking=True), names, dry)


def recorded_segment_maps(
    rec: Mapping[str, Any], device: int | None, max_segments: int | None
) -> list[SegmentMap]:
    """The segment maps of a recorded snapshot (``record_attribution.py``'s format)."""
    snap = snapshot_from_dict(rec, tracking=True)
    resolver = SiteResolver(RecordedCells(rec), rec["library_dirs"])
    devices = sorted({seg.get("device", 0) for seg in snap.segments})
    if device is not None:
        devices = [device]
    return [segment_map(snap, d, resolver, max_segments) for d in devices]


def recorded_postmortem(rec: Mapping[str, Any]) -> PostMortem:
    """The post-mortem of a recorded OOM: its event (``oom``), the snapshot after it and
    the device's figures (``device``)."""
    snap = snapshot_from_dict(rec, tracking=True)
    resolver = SiteResolver(RecordedCells(rec), rec["library_dirs"])
    held = holdings(snap, 0, [Reference(*r) for r in rec["refs"]], resolver)
    after = recorded_device_after(rec)
    event = OomEvent(*rec["oom"])
    return explain_oom(event, after, snap.segments, held, (), snap.settings)


def recorded_device_after(record: Mapping[str, Any]) -> DeviceSample:
    """The device as it was after a recorded OOM: allocator figures from the recorded
    segments, device figures as recorded."""
    from ..model import AllocatorStats

    segments = record["segments"]
    reserved = sum(s["total_size"] for s in segments)
    allocated = sum(
        b["size"] for s in segments for b in s["blocks"] if b["state"] == "active_allocated"
    )
    stats = AllocatorStats(
        allocated=allocated,
        reserved=reserved,
        active=allocated,
        requested=allocated,
        inactive_split=0,
        peak_allocated=allocated,
        peak_reserved=reserved,
        device_allocs=0,
        device_frees=0,
        alloc_retries=0,
        ooms=1,
        segments=len(segments),
        blocks=0,
    )
    d = record["device"]
    return DeviceSample(
        0, "recorded", "cuda", True, stats, d["total"], d["device_used"], d["process_used"]
    )
