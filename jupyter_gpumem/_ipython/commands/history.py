"""``%gpumem history [-n N] [--csv PATH] [--clear] [--plot] [-d N] [--diff FILE
[--tolerance TOL]]``: one row per measured cell, written to a new CSV file, forgotten,
drawn, or compared with a saved run."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from IPython.core.error import UsageError

from ...model import HistoryRow
from ...reporters import bundles
from ...reporters.history_table import HEADER, history_rows, worker_oom_lines
from ..command_parsers import device_of

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..session import Session


def run(session: Session, args: argparse.Namespace) -> None:
    from IPython.display import display

    h = session.history
    if args.clear:
        h.clear()
        print("gpumem: history cleared")
        return
    if args.csv:
        _write_csv(session, args)
        return
    if args.tolerance is not None and args.diff is None:
        raise UsageError("--tolerance goes with --diff FILE")
    if args.diff is not None:
        _diff(session, args)
        return
    rows = h.last(args.n)
    if not rows:
        print("gpumem: no measured cells yet (use %%gpumem or %gpumem auto on)")
        return
    device = device_of(args)
    plot = None
    if args.plot:
        device, plot = _plot(session, rows, device)
    replay = session.collector.replay
    display(bundles.history(HEADER, history_rows(rows), plot, device or 0, replay), raw=True)
    for line in worker_oom_lines(rows):
        print(line)


def _diff(session: Session, args: argparse.Namespace) -> None:
    """The cells this kernel measured against a saved run: each cell's latest run, matched
    by its code."""
    from IPython.display import display

    from ...analysis.run_diff import compare
    from ...analysis.run_documents import DEFAULT_TOLERANCE, parse_tolerance, session_document
    from ...core.saved_runs import load_document
    from ...errors import DiffInputError
    from ..cells import cell_sources

    try:
        tolerance = parse_tolerance(args.tolerance or DEFAULT_TOLERANCE)
        saved = load_document(args.diff)
    except DiffInputError as e:
        raise UsageError(str(e)) from None
    rows = session.history.last(args.n)
    mine = session_document(rows, cell_sources(session.shell))
    if not mine["cells"]:
        print("gpumem: no measured cells yet to compare (use %%gpumem or %gpumem auto on)")
        return
    name = os.path.basename(os.path.expanduser(args.diff))
    display(compare(saved, mine, tolerance, (name, "this kernel"), order_matters=False))


def _write_csv(session: Session, args: argparse.Namespace) -> None:
    path = os.path.expanduser(args.csv)
    try:
        n = session.history.write_csv(path, args.n)
    except FileExistsError:
        raise UsageError(f"{path} exists: choose a new file name") from None
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror}") from None
    print(f"gpumem: wrote {n} rows to {path}")


def _plot(
    session: Session, rows: Sequence[HistoryRow], device: int | None
) -> tuple[int, Sequence[HistoryRow] | None]:
    """The device drawn (the one asked, else the kernel's first measured) and the rows to
    draw, or None with the reason printed."""
    from ...reporters.history_plot import no_plot_reason

    if device is None:
        devices = [
            d.device
            for r in rows
            for d in r.devices
            if d.worker is None and d.allocated is not None
        ]
        device = devices[0] if devices else 0
    why = no_plot_reason(rows, device, session.collector.measure(False))
    if why is None:
        return device, rows
    print(f"gpumem: no plot: {why}")
    return device, None
