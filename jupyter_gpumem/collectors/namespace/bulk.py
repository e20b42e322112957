"""The bulk path: a long list of plain tensors recorded at once, with C loops.

Stored activations and caches are lists of hundreds of tensors without gradients or
autograd graphs. :meth:`BulkPath._plain_tensors` records such a list with ``map`` and
``compress`` instead of a Python step per tensor, and :meth:`BulkPath._known` takes the
devices and sizes of their storages from the allocator's snapshot when it can. Its
contract: exactly the references, in the order, that the walk taking each tensor in turn
records; for anything else it records nothing and returns False, and the walk goes on one
item at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import compress, repeat
from operator import attrgetter, itemgetter, methodcaller
from typing import TYPE_CHECKING, Any

from ...model import Reference, Via
from .kinds import TENSOR, TorchTensors
from .paths import Path, spell

if TYPE_CHECKING:
    from .walk import Walk

_GRAD_FN, _GRAD = attrgetter("grad_fn"), attrgetter("grad")
_UNTYPED_STORAGE, _GET_DEVICE = methodcaller("untyped_storage"), methodcaller("get_device")
_DATA_PTR, _NBYTES = methodcaller("data_ptr"), methodcaller("nbytes")
_REQUESTED = itemgetter("requested_size")


class BulkPath:
    """The bulk path, a part of :class:`~.walker.NamespaceWalker` (which provides the
    tensors' helper ``t``, the classifier's cache ``_kinds`` and ``kind``, and the
    snapshot's blocks ``_blocks`` for the walk in progress)."""

    t: TorchTensors
    _kinds: dict[type, int]
    _blocks: Sequence[tuple[int, Mapping[int, Mapping[str, Any]]]]

    kind: Callable[[type], int]

    def _known(self, addresses: list[int]) -> tuple[list[int], list[int]] | None:
        """Devices and sizes of storages that all start a known block of one device (a
        list of tensors made on one device, the common case), or None: then torch is
        asked."""
        for device, blocks in self._blocks:
            found: list[Any] = list(map(blocks.get, addresses))
            misses = found.count(None)
            if misses == 0:
                try:
                    return [device] * len(found), list(map(_REQUESTED, found))
                except (KeyError, TypeError):  # a recorded snapshot without the sizes
                    return None
            if misses < len(found):
                return None  # on several devices, or some not in a block: ask torch
        return None

    def _plain_tensors(
        self,
        items: Any,
        path: Path,
        via: Via,
        owner: str,
        order: int,
        out: Walk,
    ) -> bool:
        """A list of plain tensors (no gradient, no autograd graph: stored activations, a
        cache) recorded at once, with C loops (map, compress) in place of a Python step per
        tensor: the same references, in the order the walk would record them (it pops the
        last item first). Returns False, having recorded nothing, for anything else: the
        walk then takes the items one by one. The tensors are not marked seen: for a
        tensor, seen only spares a second look at its gradient and graph, which a plain
        tensor has not (every path to it is recorded either way)."""
        kinds = self._kinds
        for tp in set(map(type, items)):
            if kinds.get(tp) is None:
                self.kind(tp)
            if kinds[tp] != TENSOR:
                return False
        n = len(items)
        try:
            if list(map(_GRAD_FN, items)).count(None) != n:
                return False  # a graph to walk
            # no grad_fn: every one is a leaf, whose .grad can be read without a warning
            if list(map(_GRAD, items)).count(None) != n:
                return False
            include = list(map(self.t.include, items))
            kept = list(compress(items, include))
            storages = list(map(_UNTYPED_STORAGE, kept))  # raises for sparse tensors
            addresses = list(map(_DATA_PTR, storages))
            known = self._known(addresses) if self._blocks else None
            if known is not None:
                devices, sizes = known
            else:
                sizes = list(map(_NBYTES, storages))
                devices = list(map(_GET_DEVICE, kept))
        except Exception:
            return False
        parent = spell(path)
        indices = list(compress(range(n), include))
        if not (all(addresses) and all(sizes)):  # storages without memory (meta, empty)
            has = [bool(a and b) for a, b in zip(addresses, sizes, strict=True)]
            indices, addresses, sizes, devices = (
                list(compress(column, has)) for column in (indices, addresses, sizes, devices)
            )
        if devices and min(devices) < 0:  # CPU tensors that count (tests): device 0
            devices = [max(0, d) for d in devices]
        # Reference records made by C loops (one Python step per tensor costs twice as
        # much; Reference._make is one too), in the walk's order: it pops the last first.
        paths = [f"{parent}[{i}]" for i in reversed(indices)]
        out.refs.extend(
            map(
                tuple.__new__,
                repeat(Reference),
                zip(
                    reversed(devices),
                    reversed(addresses),
                    reversed(sizes),
                    repeat(owner),
                    repeat(via),
                    paths,
                    repeat(order),
                ),
            )
        )
        return True
