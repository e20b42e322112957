"""What a namespace walk starts from (:class:`Root`), its limits (:class:`Limits`) and what
it returns (:class:`Walk`): shared by the walker and its parts (``reach.py``, ``bulk.py``),
which import them from here and never the walker. Also the places ``%gpumem free`` lets go
of (:class:`Place`), each walked from its roots."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...model import Reference, Via


@dataclass(frozen=True, slots=True)
class Root:
    """Where a walk starts: a name and the object it is bound to."""

    owner: str  # how rows name it: "acts", "Out[7]", "traceback: f() h"
    obj: Any
    via: Via | None = None  # fixed for everything under it ("output history", "traceback")
    path: str | None = None  # the first path component (default: owner)


@dataclass(frozen=True, slots=True)
class Place:
    """A place that keeps objects alive (``%gpumem free`` lets go of places): a user's
    name, an output-history entry, the kept traceback; with the roots a walk of it starts
    from."""

    owner: str  # "model", "Out[7]", "_7", "_", "the kept traceback"
    kind: str  # "name", "output", "traceback"
    roots: tuple[Root, ...]

    @property
    def obj(self) -> Any:
        return self.roots[0].obj if len(self.roots) == 1 else None


@dataclass(frozen=True, slots=True)
class Limits:
    max_objects: int = 200_000
    max_graph_nodes: int = 100_000
    max_depth: int = 12
    time_budget: float = 2.0  # seconds


@dataclass
class Walk:
    refs: list[Reference] = field(default_factory=list)
    visited: int = 0  # objects looked at
    graph_nodes: int = 0
    truncated: list[str] = field(default_factory=list)  # why the walk stopped early
    errors: int = 0  # objects whose attributes raised
    elapsed: float = 0.0
