"""``%gpumem auto on|off``: a one-line report after every cell."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..session import Session


def run(session: Session, args: argparse.Namespace) -> None:
    session.auto = args.state == "on"
    print(f"gpumem: auto mode {args.state}")
