"""``%gpumem segments [-d N] [--max N | --all] [--rank N | --pid PID]``: every segment the
allocator holds and its blocks, to scale; of this kernel, or of a worker process."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ...errors import ActionRefused
from ...reporters import bundles
from ..command_parsers import device_of
from ..parsers import check_device

if TYPE_CHECKING:
    from ..session import Session


def run(session: Session, args: argparse.Namespace) -> None:
    from IPython.display import display

    device = device_of(args)
    if args.rank is not None or args.pid is not None:
        _worker_segments(args, device)
        return
    check_device(session.collector, device)
    try:
        maps = session.who.segment_maps(device, None if args.all else args.max_segments)
    except ActionRefused as e:
        print(f"gpumem: {e}")
        return
    display(bundles.marked(bundles.segments(maps), session.collector.replay), raw=True)


def _worker_segments(args: argparse.Namespace, device: int | None) -> None:
    """A worker's map: the same analysis and views as the kernel's own, titled with
    the worker (its devices are its own: not checked against the kernel's)."""
    from IPython.display import display

    from ...core.worker_segments import worker_segment_maps

    try:
        found, maps = worker_segment_maps(
            args.rank, args.pid, device, None if args.all else args.max_segments
        )
    except ActionRefused as e:
        print(f"gpumem: {e}")
        return
    if found.note:
        print(f"gpumem: {found.note}")
    if found.trimmed:
        print(
            f"gpumem: {found.worker.label}'s snapshot was trimmed to fit the hand-over: "
            "each run of adjacent live blocks is drawn as one block"
        )
    if not maps:
        print(f"gpumem: {found.title} holds no segment: its cache is empty")
        return
    display(bundles.segments(maps), raw=True)
