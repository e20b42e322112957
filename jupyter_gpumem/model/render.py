"""Records that show themselves: ``_repr_mimebundle_`` looks up the view registered for
the record's type.

The model sits below the views, so it cannot import them: the reporters register their
views here when they are imported (``reporters/bundles.py``), as IPython's front end,
the kernel and the CLI do before they show anything. A record shown before any view was
registered (no front end loaded) falls back to its plain repr.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Bundle = dict[str, str]
_VIEWS: dict[type, Callable[[Any], Bundle]] = {}


def register(kind: type, view: Callable[[Any], Bundle]) -> None:
    """Show records of ``kind`` with ``view`` (text/plain and text/html)."""
    _VIEWS[kind] = view


def mimebundle(record: Any) -> Bundle:
    view = _VIEWS.get(type(record))
    if view is None:
        return {"text/plain": repr(record)}
    return view(record)


class ShowsItself:
    """Mixin: Jupyter shows the record through its registered view."""

    __slots__ = ()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Bundle:
        return mimebundle(self)
