"""The room an out-of-memory failure leaves, and whether a fix makes the need fit in it.

For :func:`~jupyter_gpumem.analysis.postmortem.explain_oom` and the fixes it weighs
(``postmortem_fixes.py``), on plain records:

- :class:`Need`: what the failed cell (or worker) needs, and what is known about it;
- :class:`FirstSteps`: the memory the failed run holds itself (the kept traceback's
  frames, names the failed cell bound), which a retry would allocate again while the old
  copy is still held: releasing it comes before any retry;
- :class:`Room`: what PyTorch can use on the device, within the cap, once the first steps
  are done (free memory plus its own cache plus what they free, less what stays
  allocated), and :meth:`Room.judge`, the verdict on a fix: "fits" (True) only when the
  whole need fits after the fix and the first steps, "maybe" (None) when the need known so
  far does, otherwise "no" (False) with the shortfall. The failed request is also checked
  block by block (``would_fit``: fragmentation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..model import FreeSpace, OomEvent, Segment
from .fragmentation import would_fit
from .who import DeviceHoldings

# The references through which a name holds the user's data (not a view of it in the
# output history or a traceback's frame): deleting such a name frees it.
KEEP_DATA_VIAS = (
    "tensor",
    "container",
    "attribute",
    "parameters",
    "buffers",
    "gradients",
    "optimizer state",
    "optimizer params",
    "autograd graph",
)

# owner -> (the addresses of its live blocks, the references it holds them through)
Owners = dict[str, tuple[list[int], set[str]]]


@dataclass(frozen=True, slots=True)
class Need:
    """What the failed cell needs, and what is known about it."""

    so_far: int  # allocated above the cell's start when it failed, plus the failed request
    full: int | None = None  # the whole cell, when a scan of it says
    bound: frozenset[str] = frozenset()  # names the failed cell binds: its own memory
    hint: str = ""  # the largest value that fits, or the scan to run
    # A worker process's failure (its own snapshot, taken at the failure): "the rank"
    # in the wording; everything it holds comes back when it restarts (nothing is kept),
    # and neither the kernel's magics nor empty_cache can reach it.
    who: str = "the cell"

    @property
    def remote(self) -> bool:
        return self.who != "the cell"


def by_owner(held: DeviceHoldings) -> Owners:
    """The live blocks grouped by the owner who holds them, with the references it
    holds them through."""
    out: Owners = {}
    for address, ref in held.owners.items():
        addrs, vias = out.setdefault(ref.owner, ([], set()))
        addrs.append(address)
        vias.add(ref.via)
    return out


def size_of(held: DeviceHoldings | None, addresses: Sequence[int]) -> int:
    """The bytes of these live blocks (0 without holdings)."""
    if held is None:
        return 0
    return sum(held.blocks[a]["size"] for a in addresses)


@dataclass(frozen=True, slots=True)
class FirstSteps:
    """The failed run's own memory, to release before any retry."""

    traceback: list[int]  # addresses the kept traceback's frames hold
    names: list[str]  # names the failed cell bound that hold data, sorted
    bound: list[int]  # the addresses those names hold
    bytes: int  # what releasing both frees

    @property
    def present(self) -> bool:
        """There is something to release first."""
        return bool(self.traceback or self.names)


def first_steps(held: DeviceHoldings | None, owners: Owners, need: Need) -> FirstSteps:
    """What the kept traceback and the names the failed cell bound hold (nothing without
    holdings)."""
    tb = [a for o, (addrs, _) in owners.items() if o.startswith("traceback:") for a in addrs]
    names = sorted(
        o for o, (_, vias) in owners.items() if o in need.bound and vias & set(KEEP_DATA_VIAS)
    )
    own = [a for o in names for a in owners[o][0]]
    first_bytes = size_of(held, tb) + size_of(held, own) if held is not None else 0
    return FirstSteps(tb, names, own, first_bytes)


@dataclass(frozen=True, slots=True)
class Room:
    """Where the failure leaves the device, and the limit every fix is judged against."""

    segments: list[Segment]
    space: FreeSpace  # the allocator's segments after the failure, in figures
    request: int  # the request that failed
    total: int | None  # the device's memory
    cap: int | None  # the cap on PyTorch, when it is below the device's memory
    free: int  # free device memory now (the failed op's temporaries are gone)
    limit: int  # what PyTorch may hold: free memory plus its own cache, within the cap
    kept: int  # what stays allocated after the first steps
    first: list[int]  # the addresses the first steps free
    need: Need

    @property
    def room(self) -> int:
        """What is left for the cell once the first steps are done."""
        return self.limit - self.kept

    def judge(
        self,
        frees: int = 0,
        limit: int | None = None,
        freed: Sequence[int] = (),
        expandable: bool = False,
        capped: bool = True,
        device_free: int | None = None,
    ) -> tuple[bool | None, int | None]:
        """(fits, shortfall) after a fix that frees ``frees`` bytes (beyond the first
        steps: the blocks at ``freed``) or moves the limit (``limit``; ``capped=False``:
        without the cap; ``device_free``: more free device memory; ``expandable``: with
        expandable segments)."""
        need = self.need
        avail = (self.limit if limit is None else limit) - (self.kept - frees)
        block_ok = would_fit(
            self.segments,
            self.request,
            self.free if device_free is None else device_free,
            self.cap if capped else None,
            [*self.first, *freed],
            expandable,
        )
        if need.full is not None:
            short = need.full - avail
            return (short <= 0 and block_ok), (short if short > 0 else None)
        short = need.so_far - avail
        if short > 0:
            return False, short
        return (None if block_ok else False), None


class DeviceFigures(Protocol):
    """What a post-mortem reads of the device after the failure (a DeviceSample has
    them; a worker's post-mortem makes a :class:`DeviceAfter` of what its snapshot says)."""

    @property
    def total(self) -> int | None: ...
    @property
    def device_used(self) -> int | None: ...  # all processes: total - free
    @property
    def outside_torch(self) -> int | None: ...  # this process beyond PyTorch's reservation


class DeviceAfter(NamedTuple):
    total: int | None
    device_used: int | None
    outside_torch: int | None


def measure_room(
    oom: OomEvent,
    after: DeviceFigures,
    segments: list[Segment],
    space: FreeSpace,
    first: FirstSteps,
    need: Need,
) -> Room:
    """The room from the OOM event, the device figures after the failure and the
    allocator's segments then. A worker keeps nothing: it restarts."""
    total = after.total
    cap = oom.allowed if total is None or oom.allowed < total else None
    # Free device memory now (the failed op's temporaries are gone; its frames are kept).
    free = (
        (total - after.device_used)
        if total is not None and after.device_used is not None
        else oom.free
    )
    limit = space.reserved + free if cap is None else min(cap, space.reserved + free)
    kept = 0 if need.remote else space.allocated - first.bytes
    return Room(
        segments=segments,
        space=space,
        request=oom.requested,
        total=total,
        cap=cap,
        free=free,
        limit=limit,
        kept=kept,
        first=[*first.traceback, *first.bound],
        need=need,
    )
