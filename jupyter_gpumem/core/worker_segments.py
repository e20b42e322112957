"""A worker's segment map (``%gpumem segments --rank N``, the panel's rank chooser).

The worker is asked through the channel's private directory (collectors/workers/segment_requests.py)
and its snapshot goes through the same analysis as the kernel's own map
(``analysis.segments.segment_map``); each map is titled with the worker. The kernel pays
nothing unless asked; asked, it waits for the worker at most 2 s.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from ..analysis.segments import segment_map
from ..collectors import workers
from ..errors import ActionRefused
from ..model import SegmentMap, WorkerSegments
from ..units import cuda_label


def worker_segment_maps(
    rank: int | None,
    pid: int | None,
    device: int | None = None,
    max_segments: int | None = None,
) -> tuple[WorkerSegments, list[SegmentMap]]:
    """The worker's segments and its map of each device (or of ``device``). Raises
    :class:`ActionRefused` with one sentence when the worker can't be asked or did not
    answer in time."""
    if "ray" in sys.modules:  # Ray workers' reports, so that one is named as such
        from ..collectors import ray_workers

        ray_workers.poll(workers.channel(), ray_workers.WAIT)
    found = workers.segments_of(rank, pid)
    snap = found.snapshot
    devices = snap.devices()
    if device is not None:
        reported = {d.index for d in found.worker.devices}
        if device not in devices and device not in reported:
            uses = ", ".join(f"{cuda_label(i)}" for i in sorted(reported | set(devices))) or "none"
            raise ActionRefused(
                f"{found.worker.label} has no device {cuda_label(device)} (it uses: {uses})"
            )
        devices = [device]
    maps = [replace(segment_map(snap, d, None, max_segments), owner=found.title) for d in devices]
    return found, maps
