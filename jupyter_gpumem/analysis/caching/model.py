"""One device's caching allocator, rule by rule: :class:`CachingAllocatorModel` takes
``malloc`` and ``free`` as ``DeviceCachingAllocator`` does (pools per stream, best fit,
splitting and merging, releasing the cache before running out, expandable segments) and
keeps PyTorch's counters. Each method's docstring names the function it mirrors in
``c10/cuda/CUDACachingAllocator.cpp``. The settings and size rules are
``config``'s, the blocks ``blocks``'s; what the
model leaves out is listed in ``replay``, whose :func:`replay` feeds it a program's
requests."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Hashable, Iterable, Iterator

from ..allocator_rules import (
    LARGE_BUFFER,
    MIN_BLOCK_SIZE,
    ROUND_LARGE,
    SIZE_MAX,
    SMALL_BUFFER,
    SMALL_SIZE,
    allocation_size,
    round_size,
)
from .blocks import SHIFT, Block, Expandable, FreeBlocks, expandable_size
from .config import AllocatorConfig
from .records import BlockRecord, ModelOutOfMemory, OutOfMemoryRecord, SegmentRecord

_TOP_ADDRESS = 1 << 56  # synthetic segments are placed downwards from here
_UNBOUNDED_RANGE = 1 << 44  # an expandable segment's address range when device_total is None


class CachingAllocatorModel:
    """One device's ``DeviceCachingAllocator``, fed with :meth:`malloc` and :meth:`free`.

    Counters (PyTorch's names in brackets): ``allocated`` / ``peak_allocated``
    (allocated_bytes.all), ``reserved`` / ``peak_reserved`` (reserved_bytes.all),
    ``requested`` / ``peak_requested`` (requested_bytes.all), ``device_allocs``
    (num_device_alloc), ``device_frees`` (num_device_free), ``alloc_retries``
    (num_alloc_retries), ``ooms`` (num_ooms), ``inactive_split`` and
    ``inactive_split_bytes`` (inactive_split*.all.current); ``segment_allocations`` lists
    the size of each cudaMalloc (or expandable mapping)."""

    def __init__(
        self,
        config: AllocatorConfig | None = None,
        segment_addresses: Iterable[int] | None = None,
    ) -> None:
        cfg = config or AllocatorConfig()
        if cfg.garbage_collection_threshold > 0 and cfg.cap is not None:
            raise ValueError("garbage_collection_threshold with a cap is not modelled")
        self.config = cfg
        self._divisions = cfg.divisions()
        self._max_split = SIZE_MAX if cfg.max_split_size is None else cfg.max_split_size
        self._rounding = cfg.max_non_split_rounding_size
        self._expandable = cfg.expandable_segments
        self._cap = cfg.cap
        if cfg.device_total is None:
            self._range = _UNBOUNDED_RANGE
        else:
            self._range = cfg.device_total + cfg.device_total // 8
        self._addresses: Iterator[int] | None = (
            None if segment_addresses is None else iter(segment_addresses)
        )
        self._next_address = _TOP_ADDRESS
        self._free: dict[tuple[bool, int], FreeBlocks] = {}
        self._unmapped: dict[tuple[bool, int], list[Block]] = {}
        self._live: dict[Hashable, Block | None] = {}
        self._total = 0  # total_allocated_memory: what the cap is checked against
        self.allocated = 0
        self.peak_allocated = 0
        self.reserved = 0
        self.peak_reserved = 0
        self.requested = 0
        self.peak_requested = 0
        self.device_allocs = 0
        self.device_frees = 0
        self.alloc_retries = 0
        self.ooms = 0
        self.inactive_split = 0
        self.inactive_split_bytes = 0
        self.segment_allocations: list[int] = []

    # -- public ------------------------------------------------------------------------

    def malloc(self, key: Hashable, size: int, stream: int = 0) -> int:
        """Allocate ``size`` bytes under ``key``; returns the block's (model) address.
        Mirrors ``DeviceCachingAllocator::malloc``: round, pick the pool, best fit from the
        cache, else a new segment, else release oversize cached blocks and retry
        (``release_available_cached_blocks``), else release every unsplit cached block
        and retry (``release_cached_blocks``), else :class:`ModelOutOfMemory`. A request
        of 0 bytes takes no block (``allocate`` returns a null pointer)."""
        if key in self._live:
            raise ValueError(f"key {key!r} is already allocated")
        if size == 0:
            self._live[key] = None
            return 0
        rounded = round_size(size, self._divisions)
        small = rounded <= SMALL_SIZE
        block = self._get_free_block(small, stream, rounded)
        if block is None:
            alloc_size = allocation_size(rounded)
            block = self._alloc_block(small, stream, rounded, alloc_size, False)
            if block is None and self._release_available_cached_blocks(small, stream, rounded):
                block = self._alloc_block(small, stream, rounded, alloc_size, False)
            if block is None:
                self._release_cached_blocks()
                block = self._alloc_block(small, stream, rounded, alloc_size, True)
            if block is None:
                self.ooms += 1
                raise ModelOutOfMemory(
                    OutOfMemoryRecord(
                        request=-1,
                        requested=size,
                        allocation_size=alloc_size,
                        allocated=self.allocated,
                        reserved=self.reserved,
                        cap=self._cap,
                    )
                )
        block = self._alloc_found_block(block, rounded, size, stream)
        self._live[key] = block
        return block.addr

    def free(self, key: Hashable) -> None:
        """Free the block allocated under ``key`` (``DeviceCachingAllocator::free`` for a
        block no other stream uses, then ``free_block``)."""
        block = self._live.pop(key)
        if block is None:
            return
        block.allocated = False
        self.allocated -= block.size
        self._free_block(block)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()`` (``emptyCache`` -> ``release_cached_blocks``)."""
        self._release_cached_blocks()

    def segments(self) -> tuple[SegmentRecord, ...]:
        """The segments now held, by address, as ``snapshot()`` reports them: one record
        per segment, and for an expandable segment one per contiguous mapped range."""
        every: list[Block] = [b for b in self._live.values() if b is not None]
        for free in self._free.values():
            every.extend(free.blocks)
        out: list[SegmentRecord] = []
        for head in every:
            if head.prev is not None and head.prev.mapped:
                continue
            blocks: list[BlockRecord] = []
            b: Block | None = head
            total = 0
            while b is not None and b.mapped:
                blocks.append(BlockRecord(b.size, b.requested, b.allocated))
                total += b.size
                b = b.next
            out.append(
                SegmentRecord(
                    address=head.addr,
                    size=total,
                    pool="small" if head.small else "large",
                    stream=head.stream,
                    expandable=head.segment is not None,
                    blocks=tuple(blocks),
                )
            )
        out.sort(key=lambda s: s.address)
        return tuple(out)

    # -- the allocator's rules ---------------------------------------------------------

    def _get_free_block(self, small: bool, stream: int, size: int) -> Block | None:
        """``get_free_block``: the smallest cached block of the pool and stream with at
        least ``size`` bytes (lowest address among equals), refused when it is oversize
        (>= max_split_size) for a request under max_split_size, or more than
        max_non_split_rounding_size larger than an oversize request. With expandable
        segments a block's size counts what it could grow into (``expandable_size``)."""
        free = self._free.get((small, stream))
        if free is None:
            return None
        keys = free.keys
        i = bisect_left(keys, size << SHIFT)
        if i == len(keys):
            return None
        blocks = free.blocks
        b = blocks[i]
        if b.segment is not None:
            n = len(keys)
            while b.segment is not None and i + 1 < n:
                nb = blocks[i + 1]
                if expandable_size(nb) < expandable_size(b):
                    i += 1
                    b = nb
                else:
                    break
        ms = self._max_split
        if size < ms and b.size >= ms:
            return None
        if size >= ms and b.size >= size + self._rounding:
            return None
        del keys[i]
        del blocks[i]
        return b

    def _alloc_block(
        self, small: bool, stream: int, size: int, alloc_size: int, retry: bool
    ) -> Block | None:
        """``alloc_block``: a new segment of ``alloc_size`` bytes (cudaMalloc), unless the
        cap would be passed (``total_allocated_memory + size > allowed_memory_maximum``);
        with expandable segments, map pages instead (``try_allocate_expandable_block``).
        A retry counts in ``alloc_retries`` whether it succeeds or not."""
        if retry:
            self.alloc_retries += 1
        if self._cap is not None and self._total + alloc_size > self._cap:
            return None
        if self._expandable:
            return self._try_allocate_expandable_block(small, stream, size)
        block = Block(self._new_address(alloc_size), alloc_size, small, stream)
        self._total += alloc_size
        self.reserved += alloc_size
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
        self.device_allocs += 1
        self.segment_allocations.append(alloc_size)
        return block

    def _alloc_found_block(self, block: Block, size: int, orig: int, stream: int) -> Block:
        """``should_split`` then ``alloc_found_block``. Split when the rest is worth
        keeping: small pool (or expandable segments) at least 512 bytes left; large pool
        a request under max_split_size leaving more than 1 MiB. The front part is handed
        out, the rest stays cached. Inactive-split counting skips expandable blocks."""
        remaining_size = block.size - size
        if block.small or self._expandable:
            split = remaining_size >= MIN_BLOCK_SIZE
        else:
            split = size < self._max_split and remaining_size > SMALL_SIZE
        expandable = block.segment is not None
        already_split = block.prev is not None or block.next is not None
        if split:
            rest = block
            block = Block(rest.addr, size, rest.small, stream, rest.segment)
            block.prev = rest.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = rest
            rest.prev = block
            rest.addr += size
            rest.size = remaining_size
            self._pool(rest.small, rest.stream).add(rest)
            if not expandable:
                if already_split:
                    self.inactive_split_bytes -= size
                else:
                    self.inactive_split_bytes += remaining_size
                    self.inactive_split += 1
        elif already_split and not expandable:
            self.inactive_split_bytes -= block.size
            self.inactive_split -= 1
        block.allocated = True
        block.requested = orig
        self.allocated += block.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        self.requested += orig
        if self.requested > self.peak_requested:
            self.peak_requested = self.requested
        return block

    def _free_block(self, block: Block) -> None:
        """``free_block``: merge with free neighbours of the same segment
        (``try_merge_blocks``), cache the result, and count inactive split blocks (free
        blocks of a segment that also holds others)."""
        self.requested -= block.requested
        net_blocks = 0
        net_bytes = 0
        prev, nxt = block.prev, block.next
        if prev is not None:
            merged = self._try_merge(block, prev)
            if merged:
                net_blocks -= 1
                net_bytes -= merged
        if nxt is not None:
            merged = self._try_merge(block, nxt)
            if merged:
                net_blocks -= 1
                net_bytes -= merged
        self._pool(block.small, block.stream).add(block)
        if block.prev is not None or block.next is not None:
            net_blocks += 1
            net_bytes += block.size
        if block.segment is None:
            self.inactive_split += net_blocks
            self.inactive_split_bytes += net_bytes

    def _try_merge(self, dst: Block, src: Block | None) -> int:
        """``try_merge_blocks``: absorb ``src`` (a free neighbour, mapped alike) into
        ``dst``; returns the bytes absorbed, 0 when it cannot."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        if src.mapped:
            self._pool(src.small, src.stream).remove(src)
        else:
            self._unmapped[(src.small, src.stream)].remove(src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    def _release_available_cached_blocks(self, small: bool, stream: int, size: int) -> bool:
        """``release_available_cached_blocks`` (only with max_split_size): cudaFree the
        smallest oversize cached block of at least max(size, max_split_size) bytes, or
        else oversize blocks from the largest down until that many bytes are freed; true
        when enough was freed. Expandable blocks are never released here."""
        if self._max_split == SIZE_MAX:
            return False
        free = self._free.get((small, stream))
        if free is None or not free.keys:
            return False
        target = max(size, self._max_split)
        i = bisect_left(free.keys, target << SHIFT)
        if i < len(free.keys) and free.blocks[i].segment is None:
            self._release_block(free.blocks[i])
            return True
        released = 0
        j = len(free.keys) - 1
        while j >= 0 and released < target:
            b = free.blocks[j]
            if b.size < self._max_split or b.segment is not None:
                break
            released += b.size
            self._release_block(b)
            j -= 1
        return released >= target

    def _release_cached_blocks(self) -> None:
        """``release_cached_blocks`` -> ``release_blocks`` for the large pool, then the
        small one: cudaFree every cached block that is a whole segment; for expandable
        segments, unmap every whole free page (``unmap_block``) and drop a segment left
        with nothing mapped (``release_expandable_segment``)."""
        for small in (False, True):
            to_unmap: list[Block] = []
            for (pool_small, _), free in sorted(self._free.items(), key=lambda kv: kv[0][1]):
                if pool_small != small:
                    continue
                for b in list(free.blocks):
                    if b.segment is not None:
                        to_unmap.append(b)
                    elif b.prev is None and b.next is None:
                        self._release_block(b)
            for b in to_unmap:
                self._unmap_block(b)
                if b.prev is None and b.next is None and not b.mapped:
                    self._unmapped[(b.small, b.stream)].remove(b)

    def _release_block(self, block: Block) -> None:
        """``release_block``: cudaFree a cached segment."""
        self._pool(block.small, block.stream).remove(block)
        self._total -= block.size
        self.reserved -= block.size
        self.device_frees += 1

    # -- expandable segments -----------------------------------------------------------

    def _try_allocate_expandable_block(self, small: bool, stream: int, size: int) -> Block | None:
        """``try_allocate_expandable_block``: find room (``find_expandable_block``), map
        pages until the candidate holds ``size`` bytes (``map_block``), take it."""
        candidate = self._find_expandable_block(small, stream, size)
        if not candidate.mapped:
            self._map_block(candidate, min(candidate.size, size))
        while candidate.size < size:
            nxt = candidate.next
            assert nxt is not None and not nxt.mapped
            self._map_block(nxt, min(size - candidate.size, nxt.size))
            candidate = nxt
        self._pool(small, stream).remove(candidate)
        return candidate

    def _find_expandable_block(self, small: bool, stream: int, size: int) -> Block:
        """``find_expandable_block``: the lowest unmapped range of the stream's segments
        (with the free block just before it) with room for ``size``; else a new segment
        whose address range is 9/8 of the device's memory, in pages of 2 MiB (small pool)
        or 20 MiB (large pool)."""
        unmapped = self._unmapped.setdefault((small, stream), [])
        for u in sorted(unmapped, key=lambda b: b.addr):
            c = u
            if c.prev is not None and not c.prev.allocated:
                c = c.prev
            room = 0
            b: Block | None = c
            while room < size and b is not None and not b.allocated:
                room += b.size
                b = b.next
            if room >= size:
                return c
        page = SMALL_BUFFER if small else LARGE_BUFFER
        span = -(-self._range // page) * page
        segment = Expandable(self._new_address(span), span, page)
        candidate = Block(segment.base, span, small, stream, segment, mapped=False)
        unmapped.append(candidate)
        return candidate

    def _map_block(self, block: Block, size: int) -> None:
        """``map_block``: map whole pages from the start of an unmapped block, split off
        the rest, merge with free mapped neighbours and cache the result. Each mapping
        counts as a device allocation and adds to reserved."""
        seg = block.segment
        assert seg is not None
        offset = block.addr - seg.base
        begin = offset // seg.page
        end = -(-(offset + size) // seg.page)
        mapped = (end - begin) * seg.page
        self._unmapped[(block.small, block.stream)].remove(block)
        block.mapped = True
        if mapped < block.size:
            rest = Block(
                block.addr + mapped, block.size - mapped, block.small, block.stream, seg, False
            )
            rest.prev = block
            rest.next = block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            self._unmapped[(block.small, block.stream)].append(rest)
            block.size = mapped
        self._try_merge(block, block.prev)
        self._try_merge(block, block.next)
        self._pool(block.small, block.stream).add(block)
        self._total += mapped
        self.reserved += mapped
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
        self.device_allocs += 1
        self.segment_allocations.append(mapped)

    def _unmap_block(self, block: Block) -> None:
        """``unmap_block``: unmap the whole pages inside a free expandable block; the
        partial pages at either end stay mapped as free blocks of their own."""
        seg = block.segment
        assert seg is not None
        page = seg.page
        begin = -(-(block.addr - seg.base) // page)
        end = (block.addr + block.size - seg.base) // page
        if begin >= end:
            return
        pool = self._pool(block.small, block.stream)
        pool.remove(block)
        start = seg.base + begin * page
        length = (end - begin) * page
        before = start - block.addr
        if before > 0:
            head = Block(block.addr, before, block.small, block.stream, seg)
            head.prev = block.prev
            if block.prev is not None:
                block.prev.next = head
            head.next = block
            block.prev = head
            pool.add(head)
        after = block.size - before - length
        if after > 0:
            tail = Block(start + length, after, block.small, block.stream, seg)
            tail.next = block.next
            if block.next is not None:
                block.next.prev = tail
            tail.prev = block
            block.next = tail
            pool.add(tail)
        block.addr = start
        block.size = length
        block.mapped = False
        self._try_merge(block, block.prev)
        self._try_merge(block, block.next)
        self._unmapped.setdefault((block.small, block.stream), []).append(block)
        self._total -= length
        self.reserved -= length
        self.device_frees += 1

    # -- helpers -----------------------------------------------------------------------

    def _pool(self, small: bool, stream: int) -> FreeBlocks:
        free = self._free.get((small, stream))
        if free is None:
            free = self._free[(small, stream)] = FreeBlocks()
        return free

    def _new_address(self, size: int) -> int:
        if self._addresses is not None:
            return next(self._addresses)
        self._next_address -= -(-size // ROUND_LARGE) * ROUND_LARGE
        return self._next_address
