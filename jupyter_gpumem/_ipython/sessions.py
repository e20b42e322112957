"""The sessions of the IPython shells the extension is loaded in (one per shell, however
loaded), for what looks its session up (:func:`current`, :func:`is_loaded`). ``load`` and
``unload`` (``_ipython/__init__.py``) keep :data:`SESSIONS`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .session import Session

SESSIONS: dict[int, Session] = {}  # id(shell) -> session; one per shell however loaded


def current() -> Session | None:
    """The session of the running IPython shell, if the extension is loaded there."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return SESSIONS.get(id(shell)) if shell is not None else None


def is_loaded(session: Session) -> bool:
    """Whether ``session`` is still the running shell's (the extension not unloaded)."""
    return current() is session
