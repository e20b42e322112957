"""``%gpumem track on|off``: record where each live block is allocated."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..session import Session


def run(session: Session, args: argparse.Namespace) -> None:
    print("gpumem: " + session.who.set_tracking(args.state == "on"))
