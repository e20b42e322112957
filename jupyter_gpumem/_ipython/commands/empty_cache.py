"""``%gpumem empty-cache``: gc.collect() + torch.cuda.empty_cache(); the bytes released."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ...core import actions
from ...reporters.actions import empty_cache_lines

if TYPE_CHECKING:
    from ..session import Session


def run(session: Session, args: argparse.Namespace) -> None:
    r = actions.empty_cache(session.collector)
    for line in empty_cache_lines(r.released, r.gc_collected):
        print(line)
