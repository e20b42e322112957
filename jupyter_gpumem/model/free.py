"""Getting memory back without a restart (``%gpumem free``): what holds a named object's
GPU memory, what will be let go, what that should return, and what came back.

Made by ``analysis/free_plan.py`` (the plan, from a walk of each holder and the allocator's
snapshot) and ``core/free.py`` (the act and its measurement); read by ``reporters/free.py``
and the panel protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .render import ShowsItself

# How a holder is let go:
# delete   - the name is deleted (``del model``)
# forget   - an output-history entry is dropped (``Out[7]``, ``_7``, ``_``)
# release  - the kept traceback is released (``%gpumem release-traceback``)
# detach   - a tensor keeps its value and drops its autograd graph (``loss.detach_()``)
# unhook   - a hook or a closure on another object is removed
# teardown - a library's own teardown (accelerate's prepared lists, vLLM's engine)
LetGoAction = Literal["delete", "forget", "release", "detach", "unhook", "teardown"]


@dataclass(frozen=True, slots=True)
class LetGo:
    """One reference that will be (or was) let go."""

    holder: str  # "model", "Out[7]", "_", "the kept traceback", "accelerator._models"
    action: LetGoAction
    why: str  # "the name you gave", "another name for model", "optimizer of model"
    bytes: int  # bytes of the named objects (and what goes with them) it reaches
    code: str  # the Python that does the same: "del model", "total_loss.detach_()"


@dataclass(frozen=True, slots=True)
class Holder:
    """Something that keeps part of the named objects' memory and is not let go: before
    acting, a name that also holds other GPU memory; after, whatever still holds it."""

    holder: str  # "results", "thread 'loader': worker() at In[4] line 3", "a C extension"
    bytes: int  # bytes of the named objects it keeps alive
    example: str  # a path to one of them: "results['model'].fc.weight"
    why: str  # why it is not let go / what it is
    fix: str = ""  # what the user can do: "del results['model']"


@dataclass(frozen=True, slots=True)
class DeviceFree:
    """One device's figures: expected before acting, measured after."""

    device: int
    held: int  # bytes (allocator blocks) of the named objects themselves
    expected_freed: int  # bytes of blocks expected to be freed (they and what goes with them)
    expected_returned: int  # bytes expected back to the driver after empty_cache
    cached_free: int  # of those, free in the cache already (empty_cache returns them too)
    freed: int | None = None  # allocated before - after
    returned: int | None = None  # cudaMemGetInfo: free after - free before
    still_held: int | None = None  # bytes of the expected blocks still live after


@dataclass(frozen=True, slots=True)
class FreeReport(ShowsItself):
    """What ``%gpumem free NAME...`` plans and, unless a dry run, did."""

    names: tuple[str, ...]
    let_go: tuple[LetGo, ...]
    kept: tuple[Holder, ...]  # holders that are not let go (before acting)
    devices: tuple[DeviceFree, ...]
    done: bool = False  # acted (not a dry run)
    still: tuple[Holder, ...] = ()  # after acting: what still holds the rest
    notes: tuple[str, ...] = ()
    elapsed: float = 0.0  # seconds, walk to measurement

    @property
    def held(self) -> int:
        return sum(d.held for d in self.devices)

    @property
    def expected_returned(self) -> int:
        return sum(d.expected_returned for d in self.devices)

    @property
    def returned(self) -> int | None:
        got = [d.returned for d in self.devices if d.returned is not None]
        return sum(got) if got else None


__all__ = ["DeviceFree", "FreeReport", "Holder", "LetGo", "LetGoAction"]
