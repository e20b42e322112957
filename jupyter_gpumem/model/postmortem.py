"""After a failure: what the kept traceback holds, why an allocation failed, the fixes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .attribution import WhoRow
from .process import ProcessMemory


@dataclass(frozen=True, slots=True)
class TracebackHolding:
    frame: str  # "f() at In[9] line 4"
    name: str  # the local variable
    bytes: int
    blocks: int


@dataclass(frozen=True, slots=True)
class TracebackHoldings:
    """Tensors that the frames of the kept traceback (sys.last_traceback) hold."""

    holdings: tuple[TracebackHolding, ...]

    @property
    def bytes(self) -> int:
        return sum(h.bytes for h in self.holdings)


FixKind = Literal[
    "fragmentation",
    "cap",
    "traceback",
    "output_history",
    "graph",
    "other_process",
    "delete",
    "empty_cache",
    "smaller",
]


@dataclass(frozen=True, slots=True)
class Fix:
    kind: FixKind
    text: str  # the whole sentence, numbers included
    frees: int | None  # bytes it would make available (None: not a matter of bytes)
    # Judged against what the cell needs, not the failed request alone: True when the whole
    # cell's need is known (a scan of it) and fits after this; None ("maybe") when it covers
    # what the cell needed up to the failure, or can't be told; False when it does not.
    fits: bool | None
    command: str = ""  # what to run, when there is one
    # A first step before any retry, not a fix: it frees memory of the failed run itself
    # (the kept traceback, names the failed cell bound), which a re-run allocates again.
    first_step: bool = False
    shortfall: int | None = None  # bytes still missing after it (when it does not fit)
    # The names ``%gpumem free`` would let go of to do it (a ``del`` of variables): the
    # panel's one click; empty when the fix is no such deletion.
    free_names: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PostMortem:
    """Why an allocation failed, with numbers, and the fixes ranked by whether the failed
    request would fit after them."""

    device: int
    requested: int
    free: int  # free device memory (all processes) when it failed
    total: int | None
    cap: int | None  # the per-process cap, when one is set
    reserved: int
    allocated: int
    cached_free: int  # reserved - allocated
    releasable: int  # what empty_cache would return now (fully free segments)
    free_pieces: int  # free blocks inside segments that also hold live blocks
    free_pieces_bytes: int
    largest_free_block: int
    outside_torch: int | None  # this process beyond PyTorch (context, libraries)
    other_processes: tuple[ProcessMemory, ...]
    owners: tuple[WhoRow, ...]  # allocated by owner (top rows)
    lines: tuple[WhoRow, ...]  # allocated by line (top rows; empty without tracking)
    fixes: tuple[Fix, ...]  # first steps, then the best fix first
    execution_count: int | None = None  # the cell that failed
    time: float = 0.0  # when (unix seconds)
    # What the cell needs, against which every fix is judged: what it had allocated above
    # its start when it failed plus the failed request; the whole cell's need when a scan
    # of it says; and what PyTorch can use for it after the first steps.
    need: int | None = None
    need_full: int | None = None
    room: int | None = None
    hint: str = ""  # the largest value that fits (after a scan), or the scan to run
    # Whether PyTorch's allocator had expandable_segments on, as the failure shows it (the
    # snapshot's allocator_settings, or an expandable segment); None when it does not say.
    expandable_segments: bool | None = None
