"""``%gpumem release-traceback``: drop the frames the last error's traceback keeps alive."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ...collectors.torch_build import imported_torch
from ...reporters.actions import release_traceback_line

if TYPE_CHECKING:
    from ..session import Session


def run(session: Session, args: argparse.Namespace) -> None:
    if imported_torch() is not None:
        held = session.postmortems.traceback_holdings()
    else:
        held = None
    r = session.postmortems.release_traceback()
    print(release_traceback_line(r.frames, r.freed, held.bytes if held is not None else None))
