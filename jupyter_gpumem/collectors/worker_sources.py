"""The worker sources the front end hands the collector and the cell tracker.

The measurement core knows nothing of how workers report: :class:`~.collector.Collector`
asks the :class:`~.collector.WorkerSource` s it is given at each full reading, and
:class:`~jupyter_gpumem.core.tracker.CellTracker` calls the cell feeds it is given at a
measured cell's begin and end. Here are the live ones, composed by
``jupyter_gpumem._ipython.compose``: the kernel's worker channel (forked and spawned
workers, :mod:`.workers`) and Ray (:mod:`.ray_workers`), which is asked only where the user
imported Ray (``ray`` is never imported here, nor :mod:`.ray_workers` without it).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..model import WorkerReport
from .workers import live

if TYPE_CHECKING:
    from .collector import WorkerSource
    from .workers import WorkerChannel


def ray_news() -> tuple[WorkerReport, ...]:
    """What Ray workers sent since the last look, taken into the kernel's channel (never
    waited for) when Ray is imported. Their reports come out of the channel (:func:`live`,
    the next source), so this one adds none itself."""
    if "ray" in sys.modules:
        from .ray_workers import poll

        poll()
    return ()


def ray_cell(channel: WorkerChannel, begin: bool) -> None:
    """A measured cell's begin or end: the Ray workers' news (``ray_workers.cell``). The
    tracker calls it only where Ray is imported (:data:`CELL_FEEDS`)."""
    from .ray_workers import cell

    cell(channel, begin)


# The tracker's cell feeds: (the module whose import wakes the feed, the feed).
CELL_FEEDS: tuple[tuple[str, Callable[[WorkerChannel, bool], None]], ...] = (("ray", ray_cell),)


def sources() -> tuple[WorkerSource, ...]:
    """The collector's worker sources, in order: Ray's news first, then the workers alive."""
    return (ray_news, live)
