"""Where memory was allocated (sites, lines) and who holds it (references, rows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from .render import ShowsItself

SiteKind = Literal["cell", "file", "library", "no_stack", "before_tracking"]


@dataclass(frozen=True, slots=True)
class Site:
    """Where a block was allocated, in the user's words.

    ``cell``: ``In[7] line 3``; ``file``: the user's own module, ``train.py:42``;
    ``library``: no user frame at all (the outermost library frame); ``no_stack``: the
    block has no Python frames (allocated by autograd's backward thread or C++ code);
    ``before_tracking``: alive since before tracking began.
    """

    kind: SiteKind
    filename: str = ""
    line: int = 0
    function: str = ""
    execution_count: int | None = None  # for cells
    text: str = ""  # the source line, stripped
    # the library frame this user line called into: "torch/nn/functional.py:2380 linear"
    library: str = ""

    @property
    def label(self) -> str:
        if self.kind == "cell":
            return f"In[{self.execution_count}] line {self.line}"
        if self.kind in ("file", "library"):
            return f"{short_path(self.filename)}:{self.line}"
        if self.kind == "before_tracking":
            return "allocated before tracking began"
        return "no Python stack (backward pass or C++)"


def short_path(path: str, parts: int = 2) -> str:
    """The last ``parts`` components of a path: ``torch/nn/functional.py``."""
    pieces = path.replace("\\", "/").split("/")
    return "/".join(pieces[-parts:]) if len(pieces) > parts else path


@dataclass(frozen=True, slots=True)
class LineShare:
    """Bytes alive at the end of a cell that one of its lines allocated."""

    line: int
    text: str
    bytes: int
    blocks: int
    site: Site  # the innermost user frame (may be a function defined elsewhere)


@dataclass(frozen=True, slots=True)
class DeviceAttribution:
    """Where the blocks a cell allocated and left alive on one device come from."""

    device: int
    new_bytes: int  # bytes in blocks allocated during the cell and still alive
    lines: tuple[LineShare, ...]  # by line of the cell, largest first
    elsewhere: int  # new blocks whose stack does not pass through this cell's code
    no_stack: int  # new blocks without Python frames (backward pass, C++)


# -- who holds the memory -----------------------------------------------------------------
Via = Literal[
    "tensor",
    "parameters",
    "buffers",
    "attribute",
    "container",
    "gradients",
    "optimizer state",
    "autograd graph",
    "optimizer params",
    "output history",
    "traceback",
]
# How an owner reaches a storage; lower ranks win when several owners reach the same one.
VIA_RANK: dict[Via, int] = {
    "tensor": 0,
    "parameters": 1,
    "buffers": 1,
    "attribute": 1,
    "container": 1,
    "gradients": 2,
    "optimizer state": 2,
    "autograd graph": 3,
    "optimizer params": 4,
    "output history": 5,
    "traceback": 6,
}


class Reference(NamedTuple):
    """One path from a name in the user's namespace to a tensor's storage. (A named tuple:
    a walk makes one per tensor it meets, tens of thousands.)"""

    device: int
    address: int  # untyped_storage().data_ptr()
    nbytes: int  # storage size (the allocator's block may be larger)
    owner: str  # "acts", "Out[7]", "traceback: f() h"
    via: Via
    path: str  # "acts[3]", "model.fc1.weight.grad", "total.grad_fn._saved_self"
    order: int  # position of the owner's root in the walk (ties between equal ranks)

    @property
    def rank(self) -> tuple[int, int]:
        return (VIA_RANK.get(self.via, 9), self.order)


# owner: a name; site: a line; cell: a cell; unreachable: no name reaches it; untracked:
# allocated before tracking; rest: the rows past n, summed
WhoRowKind = Literal["owner", "site", "cell", "unreachable", "untracked", "rest", ""]


@dataclass(frozen=True, slots=True)
class WhoRow:
    key: str  # a variable ("acts"), a line ("In[7] line 3"), a cell ("In[7]")
    detail: str  # how it holds the memory, the line's text, ...
    bytes: int
    blocks: int
    example: str = ""  # a path to one of the tensors, or the top holder of a line
    kind: WhoRowKind = ""
    site: str = ""  # by owner, with tracking: the line that allocated most of it


@dataclass(frozen=True, slots=True)
class WhoReport(ShowsItself):
    """Live GPU memory of one device, split by owner, allocation line or cell.

    The rows add up to ``allocated`` (the allocator's live blocks): what no name reaches,
    or what has no recorded site, is a row of its own.
    """

    device: int
    by: Literal["variable", "line", "cell"]
    allocated: int
    explained: int  # bytes of the rows that name an owner / a site
    rows: tuple[WhoRow, ...]
    tracking: bool
    notes: tuple[str, ...] = ()
    outside_allocator: int = 0  # reachable tensors whose memory the allocator doesn't own
    elapsed: float = 0.0  # seconds it took

    @property
    def explained_share(self) -> float:
        return self.explained / self.allocated if self.allocated else 1.0
