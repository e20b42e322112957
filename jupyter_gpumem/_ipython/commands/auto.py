"""``%gpumem auto on|off [--breakdown]``: a one-line report after every cell (and with
``--breakdown``, each cell's breakdown recorded: what ``jupyter-gpumem run --breakdown-all``
asks for)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from IPython.core.error import UsageError

if TYPE_CHECKING:
    from ..session import Session


def run(session: Session, args: argparse.Namespace) -> None:
    on = args.state == "on"
    if args.breakdown and not on:
        raise UsageError("%gpumem auto off --breakdown: --breakdown goes with `on`")
    session.auto = on
    session.auto_breakdown = on and args.breakdown
    print(
        f"gpumem: auto mode {args.state}"
        + (", each cell's peak broken down" if args.breakdown else "")
    )
