"""``%gpumem`` (no command): now, a table per device (``-d N``: device N only)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TYPE_CHECKING

from ..parsers import check_device

if TYPE_CHECKING:
    from ..session import Session


def run(session: Session, args: argparse.Namespace) -> None:
    from IPython.display import display

    check_device(session.collector, args.device)
    m = session.collector.measure()
    if args.device is not None:
        m = replace(m, devices=tuple(d for d in m.devices if d.index == args.device))
    display(m)  # the measurement shows itself
