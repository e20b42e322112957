"""The reachability pre-pass: skip the walk of a root from which no tensor is reachable.

Most of a notebook's names hold no tensor (numbers, strings, data frames, lists of
them). :meth:`ReachabilityPrepass._tensor_free` proves that for a root a level at a time
with C calls (``gc.get_referents``, ``map``, ``set``) before the walk, which spells a path
for every object, looks into it; a root it clears is not walked. Its contract: it never
clears a root from which the walk would find a tensor (it follows a superset of the
walk's edges, and any doubt says "not free"), and it counts what it looked at in the
walk's ``visited``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from itertools import compress
from typing import TYPE_CHECKING, Any

from .kinds import TENSOR, TRAVERSABLE

if TYPE_CHECKING:
    from .walk import Limits, Walk

_HAVE_GC = 1 << 14  # Py_TPFLAGS_HAVE_GC: the type lists its references (tp_traverse)


class ReachabilityPrepass:
    """The pre-pass, a part of :class:`~.walker.NamespaceWalker` (which provides
    ``limits`` and ``kind``)."""

    limits: Limits
    kind: Callable[[type], int]

    def _tensor_free(self, obj: Any, out: Walk) -> bool:
        """True when no tensor is reachable from ``obj`` within the walk's depth: then the
        walk below, which spells a path for every object, can be skipped.

        A level at a time through ``gc.get_referents`` (C), keeping what the walk would
        look into (containers, objects, modules, optimizers): a superset of the walk's
        edges (a dict's keys and values, a sequence's items, an object's ``__dict__`` and
        slots), so a tensor the walk would find is found here too; any doubt (a type
        without GC support, whose references can't be listed) says "not free". About 6x
        cheaper per object than the walk (no paths, no per-object Python in the common
        case). Shared objects are not told apart: the depth and the object cap bound the
        levels, and a structure past either is walked as before (which says so). Objects
        looked at here are not marked seen: they hold no tensors, so a later root loses
        nothing."""
        kind = self.kind
        get_referents, is_tracked = gc.get_referents, gc.is_tracked
        limits = self.limits
        level = [obj]
        looked = 0
        try:
            # Per level the work is done by C (map, set, get_referents) on whole lists;
            # Python touches each object only where a level mixes kinds and must be
            # filtered.
            for depth in range(limits.max_depth + 1):
                present = set(map(type, level))
                inner_types = set()
                for tp in present:
                    k = kind(tp)
                    if k == TENSOR:
                        return False
                    if k in TRAVERSABLE:
                        if not tp.__flags__ & _HAVE_GC:
                            return False  # its references can't be listed: walk it
                        inner_types.add(tp)
                if not inner_types:
                    return True
                if len(inner_types) < len(present):
                    if not any(tp.__flags__ & _HAVE_GC for tp in present - inner_types):
                        # The others are atomic (ints, strings): what the collector tracks
                        # is what we look into, less the containers it stopped tracking
                        # because they hold only atomic objects (no tensor). Twice as
                        # fast as filtering by type.
                        level = list(filter(is_tracked, level))
                    else:
                        # [o for o in level if type(o) in inner_types], in C
                        level = list(
                            compress(level, map(inner_types.__contains__, map(type, level)))
                        )
                looked += len(level)  # as the walk counts: what it looks into
                if depth == limits.max_depth or looked > limits.max_objects:
                    return False  # past a limit: the walk runs and says where it stopped
                level = get_referents(*level)
            return True
        finally:
            out.visited += looked
