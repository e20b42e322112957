"""``%gpumem who [-d N] [-n N] [--by variable|line|cell]``: who holds the live GPU memory."""

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
    check_device(session.collector, device)
    try:
        reports = session.who.who(device, args.by, args.n)
    except ActionRefused as e:
        print(f"gpumem: {e}")
        return
    display(bundles.marked(bundles.who(reports), session.collector.replay), raw=True)
