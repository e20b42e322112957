"""The ``%gpumem`` line commands, one module each behind the :class:`Command` protocol:
a module's ``run(session, args)`` does the command with the arguments its parser (in
``command_parsers.py``) read, prints its lines or displays its view, and may return a
value for the cell's ``Out``. A new command: its parser in ``command_parsers.py``, its
module here, its row in :data:`COMMANDS`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, Protocol

from . import (
    auto,
    caching,
    empty_cache,
    free,
    history,
    limit,
    now,
    panel,
    release_traceback,
    reset_peak,
    segments,
    track,
    who,
    workers,
)

if TYPE_CHECKING:
    from ..session import Session


class Command(Protocol):
    def run(self, session: Session, args: argparse.Namespace) -> Any:
        """Do the command; what it returns is the cell's ``Out`` (None: nothing)."""
        ...


# the parser's command name -> its module ("now": no command)
COMMANDS: dict[str, Command] = {
    "now": now,
    "auto": auto,
    "history": history,
    "empty-cache": empty_cache,
    "caching": caching,
    "limit": limit,
    "reset-peak": reset_peak,
    "who": who,
    "segments": segments,
    "track": track,
    "release-traceback": release_traceback,
    "free": free,
    "workers": workers,
    "panel": panel,
}

__all__ = ["COMMANDS", "Command"]
