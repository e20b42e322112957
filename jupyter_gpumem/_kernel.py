"""ipykernel quirks, all in one place. Filled in by the panel protocol."""

from __future__ import annotations

from typing import Any


def attach(session: Any) -> None:
    return None


def detach(session: Any) -> None:
    return None
