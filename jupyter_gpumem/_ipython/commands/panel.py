"""``%gpumem panel [--interval MS]``: live bars and buttons as an ipywidgets widget."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

if TYPE_CHECKING:
    from ..session import Session


def run(session: Session, args: argparse.Namespace) -> Any:
    if args.interval < 100:
        raise UsageError("--interval must be at least 100 ms")
    from ...widget import GpuMemWidget
    from ..sessions import is_loaded

    return GpuMemWidget.create(
        session, interval_ms=args.interval, loaded=lambda: is_loaded(session)
    )
