"""The caching allocator model's memory: blocks linked to their neighbours inside a
segment (:class:`Block`), one pool's free blocks sorted as PyTorch's
``BlockComparatorSize`` sorts them (size, then address), and expandable segments' address
ranges. Internal to :class:`~jupyter_gpumem.analysis.caching.CachingAllocatorModel`,
which links, splits and merges them; each class mirrors the ``CUDACachingAllocator.cpp``
structure it names."""

from __future__ import annotations

from bisect import bisect_left

SHIFT = 64  # a free block's sort key is size << 64 | address


class Expandable:
    """One ``ExpandableSegment``: an address range mapped in pages from its start."""

    __slots__ = ("base", "page", "size")

    def __init__(self, base: int, size: int, page: int) -> None:
        self.base = base
        self.size = size
        self.page = page


class Block:
    """``Block``: a piece of a segment, linked to its neighbours in the segment."""

    __slots__ = (
        "addr",
        "allocated",
        "mapped",
        "next",
        "prev",
        "requested",
        "segment",
        "size",
        "small",
        "stream",
    )

    def __init__(
        self,
        addr: int,
        size: int,
        small: bool,
        stream: int,
        segment: Expandable | None = None,
        mapped: bool = True,
    ) -> None:
        self.addr = addr
        self.size = size
        self.small = small
        self.stream = stream
        self.segment = segment
        self.mapped = mapped
        self.requested = 0
        self.allocated = False
        self.prev: Block | None = None
        self.next: Block | None = None


class FreeBlocks:
    """One pool's free blocks of one stream, ordered as ``BlockComparatorSize`` orders them
    (size, then address; the stream is the list's). Two parallel lists: sort keys and
    blocks."""

    __slots__ = ("blocks", "keys")

    def __init__(self) -> None:
        self.keys: list[int] = []
        self.blocks: list[Block] = []

    def add(self, b: Block) -> None:
        key = b.size << SHIFT | b.addr
        i = bisect_left(self.keys, key)
        self.keys.insert(i, key)
        self.blocks.insert(i, b)

    def remove(self, b: Block) -> None:
        i = bisect_left(self.keys, b.size << SHIFT | b.addr)
        del self.keys[i]
        del self.blocks[i]


def expandable_size(b: Block) -> int:
    """``expandable_size`` in ``get_free_block``: a block followed by unmapped address
    space counts as large as it could grow."""
    n = b.next
    return b.size + (n.size if n is not None and not n.mapped else 0)
