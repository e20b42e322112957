"""Which names hold GPU tensors: a bounded walk from roots (the user's variables, ``Out``,
the kept traceback's frames) to tensor storages.

- :mod:`.walker`: :class:`NamespaceWalker` (the walk) and :func:`collection_paused`;
- :mod:`.walk`: what a walk starts from, its limits and what it returns (:class:`Root`,
  :class:`Limits`, :class:`Walk`);
- :mod:`.kinds`: the classifier (what the walk does with each type) and
  :class:`TorchTensors` (what it needs of torch);
- :mod:`.reach`: the pre-pass that skips roots from which no tensor is reachable;
- :mod:`.bulk`: long lists of plain tensors, recorded with C loops;
- :mod:`.paths`: paths from a root, spelled out only for tensors (:func:`spell`).

Matching the references with the allocator's blocks is ``analysis/who.py``'s job.
"""

from __future__ import annotations

from .kinds import ATOMIC, SKIP_PACKAGES, TorchTensors
from .paths import spell
from .walk import Limits, Place, Root, Walk
from .walker import NamespaceWalker, collection_paused

__all__ = [
    "ATOMIC",
    "SKIP_PACKAGES",
    "Limits",
    "NamespaceWalker",
    "Place",
    "Root",
    "TorchTensors",
    "Walk",
    "collection_paused",
    "spell",
]
