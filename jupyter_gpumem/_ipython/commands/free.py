"""``%gpumem free NAME [NAME ...] [--dry]``: let go of everything that keeps the named
objects' GPU memory alive, give it back to the driver and say what came back."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ...reporters.free import free_bundle

if TYPE_CHECKING:
    from ..session import Session


def run(session: Session, args: argparse.Namespace) -> None:
    from IPython.display import display

    report = session.frees.free(args.names, dry=args.dry)
    display(free_bundle(report), raw=True)
