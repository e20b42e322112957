"""``%gpumem caching on|off``: switch the caching allocator off and on (torch >= 2.6)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ...core import actions
from ...reporters.actions import caching_lines

if TYPE_CHECKING:
    from ..session import Session


def run(session: Session, args: argparse.Namespace) -> None:
    r = actions.set_caching(session.collector, args.state == "on")
    for line in caching_lines(r.caching, r.initialised_cuda):
        print(line)
