"""What a dry run records, as plain records: every storage it allocated (:class:`Alloc`)
and freed (:class:`Free`) in order, what the breakdown's hooks saw beside them
(:class:`Seen`: claims, phase marks, saved tensors, module names, with positions that are
indices into the events), why it stopped early (:class:`Stopped`), and the whole run
(:class:`FakeRun`). Made by ``collectors/fake_run.record``; read by ``core/dry_run.py``,
``analysis/dry_breakdown.py`` and the reporters. No torch."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

StopKind = Literal[
    "value read",  # .item(), bool(), int(), .tolist(): a value the dry run does not have
    "dynamic shape",  # unique, repeat_interleave by a tensor: a shape that depends on values
    "no fake kernel",  # an op (custom, extension) the fake mode can't run
    "no cuda build",  # a CPU-only torch asked for a CUDA dry run
    "no gpu visible",  # a CUDA build that sees no GPU, where torch's autograd needs one
    "refused",  # a write outside the process, or a change to a real tensor, refused
    "time",  # the run went past its time (state.MAX_SECONDS)
    "syntax",  # the cell does not compile
    "error",  # anything else the code raised
]
AllocKind = Literal["tensor", "cublas workspace", "cublaslt workspace", "cudnn workspace"]


@dataclass(frozen=True, slots=True)
class Alloc:
    """One storage the run allocated: ``nbytes`` exactly as requested (the allocator's
    model rounds). ``thread`` numbers threads in the order they first allocated (0: the
    one that called ``fake_run.record``; autograd's device threads come later)."""

    key: int
    nbytes: int
    device: int
    stream: int
    thread: int
    op: str  # the op that made it: "aten.mm.default"
    kind: AllocKind = "tensor"
    # the innermost module whose forward was running (an index into Seen.modules; -1: none,
    # or a thread other than the run's)
    module: int = -1


@dataclass(frozen=True, slots=True)
class Free:
    key: int


Event = Alloc | Free

PhaseName = Literal["forward", "backward", "backward done", "optimizer step", "other"]


class PhaseMark(NamedTuple):
    """The phase that begins after ``events[:at]`` (``backward done``: the backward pass
    that began last is over, its saved tensors are let go)."""

    at: int
    phase: PhaseName


class Saved(NamedTuple):
    """Autograd saved the storage allocated under ``key`` for backward, after
    ``events[:at]``, while ``module`` (an index into :attr:`Seen.modules`, -1: none) ran."""

    key: int
    at: int
    module: int


# what a storage can be claimed as, first wins (as model.planning.CATEGORIES orders them)
CLAIMS: tuple[str, ...] = ("parameters", "buffers", "gradients", "optimizer state")


@dataclass(slots=True)
class Seen:
    """What the breakdown's hooks saw during a dry run, beside its events: plain records,
    with positions that are indices into the run's events."""

    marks: list[PhaseMark] = field(default_factory=list)
    # allocation key -> what it was seen as: parameters, buffers, gradients, optimizer state
    # (a storage seen as two is the first of :data:`CLAIMS`)
    claims: dict[int, str] = field(default_factory=dict)
    saved: list[Saved] = field(default_factory=list)  # activations, in the order saved
    modules: list[str] = field(default_factory=list)  # qualified names, "model.h.3.attn"


class Events(list[Event]):
    """A run's events (a list of :data:`Event`) that carry the run's :class:`Seen`, so
    that whoever is handed the events (``core/dry_run.predict``) has it too."""

    __slots__ = ("seen",)

    def __init__(self, events: Iterable[Event] = (), seen: Seen | None = None) -> None:
        super().__init__(events)
        self.seen = seen


@dataclass(frozen=True, slots=True)
class Stopped:
    """Why the run stopped before its end: ``where`` is the user's line (``In[7] line 3``
    or ``train.py:42``), ``inside`` the innermost line outside torch when it is another
    (a library's: ``modeling_bert.py:1020``)."""

    kind: StopKind
    op: str | None
    message: str
    where: str | None = None
    inside: str | None = None

    @property
    def line(self) -> str:
        """The stop as one plain line."""
        at = f" at {self.where}" if self.where else ""
        if self.inside and self.inside != self.where:
            at += f" (in {self.inside})"
        return f"{self.message}{at}"


@dataclass(slots=True)
class FakeRun:
    """What a dry run saw: its allocations and frees in order, what it could not see
    (``notes``, one line each), and why it stopped early (``error``)."""

    device_type: str
    events: list[Event] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: Stopped | None = None
    seconds: float = 0.0
    ops: int = 0  # ops the run dispatched
    input_bytes: int = 0  # storages of the user's real tensors the run read or wrote
    cuda_initialized: bool = False  # whether the run started CUDA (it should not)
    libraries: frozenset[str] = frozenset()  # "cudnn", "nccl": what its ops would load
    # what the run's ops take that it could not size (cuDNN's convolution workspaces):
    # the peaks are a lower bound by that much
    unseen: frozenset[str] = frozenset()
    seen: Seen | None = None  # what the breakdown's hooks saw (None: they did not run)
    # the user's real tensors on the device that the cell used: allocated first in
    # ``events`` (op ``held before the cell``), as a fresh process holds them at its start
    held: list[Alloc] = field(default_factory=list)
    held_owners: dict[int, str] = field(default_factory=dict)  # held key -> who holds it
    # PyTorch's allocated on each device when the run ended (the kernel's own tensors);
    # empty where CUDA does not run
    kernel_allocated: dict[int, int] = field(default_factory=dict)

    @property
    def peak(self) -> int:
        """The largest sum of live bytes (exact sizes: no allocator rounding)."""
        live: dict[int, int] = {}
        now = peak = 0
        for e in self.events:
            if isinstance(e, Alloc):
                live[e.key] = e.nbytes
                now += e.nbytes
                peak = max(peak, now)
            else:
                now -= live.pop(e.key, 0)
        return peak

    def live_at_end(self) -> list[Alloc]:
        """The allocations still alive when the run ended (what it leaves behind)."""
        freed = {e.key for e in self.events if isinstance(e, Free)}
        return [e for e in self.events if isinstance(e, Alloc) and e.key not in freed]
