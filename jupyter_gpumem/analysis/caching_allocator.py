"""A model of PyTorch's CUDA caching allocator: allocation requests in, the allocator's
segments, blocks and counters out, with no GPU and no torch.

It follows ``DeviceCachingAllocator`` in ``c10/cuda/CUDACachingAllocator.cpp`` and the
option parsing of ``AcceleratorAllocatorConfig`` rule by rule; each method's docstring
names the function it mirrors. Fed the requests a program made (:func:`requests_from_trace`
reads them from the allocator's own history), it predicts peak allocated and peak
reserved, every cudaMalloc (or, with expandable segments, every mapping) and its size, and
the segments left at the end. The traces in ``tests/fixtures/allocator_traces.json``
(H200, torch 2.11.0+cu130) replay to PyTorch's numbers, byte for byte.

What it leaves out, and why:

- **Addresses of new segments.** cudaMalloc chooses them, and a trace holds them only for
  segments already made. They matter: among free blocks of equal size the allocator takes
  the lowest address. The model places each new segment (and each expandable segment's
  address range) just below the previous one, as the CUDA driver mostly does; inside a
  segment, offsets are exact. On the fixture's traces this gives every number exactly;
  rising addresses instead reuse the other of two equal blocks at times, which moves
  GPT-2's peak allocated by 768 KiB. Where many blocks share a size ties are frequent:
  on a random workload recorded with ``roundup_power2_divisions:4`` the model's peak
  reserved came out 136 MiB (2.9%) high. ``segment_addresses`` replaces the synthetic
  addresses (given the recorded ones, the model hands out every block at the address
  PyTorch did, in every configuration tried).
- **Cross-stream uses** (``record_stream``): a block freed while another stream still
  uses it returns to the pool when its events complete. Requests say when a block is
  free, so a trace's ``free_completed`` (not ``free_requested``) is the free to feed.
- **Memory outside the cap.** ``AllocatorConfig.cap`` stands for
  ``set_per_process_memory_fraction`` (the allocator's ``allowed_memory_maximum``); the
  GPU's own free memory, which makes cudaMalloc fail without a cap, is not modelled:
  without a cap the model never runs out.
- **garbage_collection_threshold** (acts only with a cap), CUDA graph private pools,
  free-memory callbacks, IPC, and expandable segments turned on or off mid-run.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

__all__ = [
    "Alloc",
    "AllocatorConfig",
    "BlockRecord",
    "CachingAllocatorModel",
    "Free",
    "ModelOutOfMemory",
    "OutOfMemoryRecord",
    "Prediction",
    "SegmentRecord",
    "allocation_size",
    "replay",
    "requests_from_trace",
    "round_size",
]

MiB = 1 << 20
MIN_BLOCK_SIZE = 512  # kMinBlockSize
SMALL_SIZE = 1 * MiB  # kSmallSize: the largest request served by the small pool
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: a small segment, and an expandable small page
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: a segment for 1-10 MiB, an expandable large page
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc
ROUND_LARGE = 2 * MiB  # kRoundLarge
SIZE_MAX = (1 << 64) - 1  # max_split_size when unset (std::numeric_limits<size_t>::max())
ROUNDUP_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: 1 MiB, 2 MiB, ... 32 GiB and above

_SHIFT = 64  # a free block's sort key is size << 64 | address
_MASK = (1 << _SHIFT) - 1
_TOP_ADDRESS = 1 << 56  # synthetic segments are placed downwards from here
_UNBOUNDED_RANGE = 1 << 44  # an expandable segment's address range when device_total is None

Pool = Literal["small", "large"]


# -- configuration ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AllocatorConfig:
    """The allocator settings the model follows (``PYTORCH_CUDA_ALLOC_CONF`` and the cap).

    ``max_split_size``: bytes, or None (unset: every block may be split).
    ``roundup_power2_divisions``: one value for every size, or 16, one per power-of-two
    interval starting at 1 MiB (sizes under 1 MiB use the first; 32 GiB and up, the last).
    ``cap``: the bytes PyTorch may reserve (``set_per_process_memory_fraction`` times the
    device's memory), or None. ``device_total``: the GPU's memory, which only sizes an
    expandable segment's address range (9/8 of it, as PyTorch reserves); None: unbounded.
    ``garbage_collection_threshold`` is not modelled: a model with it set and a cap raises
    ``ValueError`` (without a cap PyTorch ignores it too)."""

    max_split_size: int | None = None
    max_non_split_rounding_size: int = LARGE_BUFFER
    expandable_segments: bool = False
    roundup_power2_divisions: int | tuple[int, ...] = 0
    cap: int | None = None
    device_total: int | None = None
    garbage_collection_threshold: float = 0.0

    @classmethod
    def from_conf(cls, conf: str, cap: int | None = None) -> AllocatorConfig:
        """Read a ``PYTORCH_CUDA_ALLOC_CONF`` string, as ``AcceleratorAllocatorConfig::
        parseArgs`` does (``max_split_size_mb``, ``max_non_split_rounding_mb``,
        ``roundup_power2_divisions`` in both forms, ``expandable_segments``,
        ``garbage_collection_threshold``; other keys are ignored)."""
        tokens = _tokens(conf)
        values: dict[str, Any] = {"cap": cap}
        i = 0
        while i < len(tokens):
            key = tokens[i]
            if i + 2 >= len(tokens) or tokens[i + 1] != ":":
                raise ValueError(f"allocator setting {key!r} has no value")
            if key == "roundup_power2_divisions" and tokens[i + 2] == "[":
                divisions, i = _parse_divisions(tokens, i + 3)
                values["roundup_power2_divisions"] = divisions
            else:
                value = tokens[i + 2]
                i += 3
                if key == "max_split_size_mb":
                    mb = int(value)
                    if mb < LARGE_BUFFER // MiB:
                        raise ValueError("max_split_size_mb must be >= 20")
                    values["max_split_size"] = mb * MiB
                elif key == "max_non_split_rounding_mb":
                    mb = int(value)
                    if mb < LARGE_BUFFER // MiB:
                        raise ValueError("max_non_split_rounding_mb must be >= 20")
                    values["max_non_split_rounding_size"] = mb * MiB
                elif key == "roundup_power2_divisions":
                    values["roundup_power2_divisions"] = int(value)
                elif key == "expandable_segments":
                    values["expandable_segments"] = value.lower() in ("true", "1")
                elif key == "garbage_collection_threshold":
                    values["garbage_collection_threshold"] = float(value)
            if i < len(tokens) and tokens[i] == ",":
                i += 1
        return cls(**values)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], cap: int | None = None) -> AllocatorConfig:
        """Read the ``allocator_settings`` of ``torch.cuda.memory._snapshot()``. They do not
        list max_non_split_rounding_size: it is read from the settings string they carry
        (``PYTORCH_CUDA_ALLOC_CONF``), else left at its default."""
        conf = settings.get("PYTORCH_CUDA_ALLOC_CONF")
        rounding = LARGE_BUFFER
        if isinstance(conf, str) and "max_non_split_rounding_mb" in conf:
            rounding = cls.from_conf(conf).max_non_split_rounding_size
        split = int(settings.get("max_split_size", -1))
        raw = settings.get("roundup_power2_divisions", 0)
        divisions: int | tuple[int, ...]
        if isinstance(raw, Mapping):
            ordered = sorted(raw.items(), key=lambda kv: int(kv[0]))
            divisions = tuple(int(v) for _, v in ordered)
        elif isinstance(raw, Sequence):
            divisions = tuple(int(v) for v in raw)
        else:
            divisions = int(raw)
        return cls(
            max_split_size=None if split < 0 or split >= SIZE_MAX else split,
            max_non_split_rounding_size=rounding,
            expandable_segments=bool(settings.get("expandable_segments", False)),
            roundup_power2_divisions=divisions,
            cap=cap,
            garbage_collection_threshold=float(settings.get("garbage_collection_threshold", 0)),
        )

    def divisions(self) -> tuple[int, ...]:
        """The 16 interval values (``roundup_power2_divisions_``)."""
        d = self.roundup_power2_divisions
        if isinstance(d, int):
            return (d,) * ROUNDUP_INTERVALS
        if len(d) != ROUNDUP_INTERVALS:
            raise ValueError("roundup_power2_divisions needs one value or 16")
        return tuple(d)


def _tokens(conf: str) -> list[str]:
    """``AcceleratorAllocatorConfig``'s tokenizer: ``,`` ``:`` ``[`` ``]`` are tokens."""
    out: list[str] = []
    word = ""
    for ch in conf:
        if ch in ",:[]":
            if word.strip():
                out.append(word.strip())
            word = ""
            out.append(ch)
        else:
            word += ch
    if word.strip():
        out.append(word.strip())
    return out


def _parse_divisions(tokens: list[str], i: int) -> tuple[tuple[int, ...], int]:
    """``parseRoundUpPower2Divisions``, list form: ``[256:1,512:2,>:4]`` (sizes in MiB)."""
    values = [0] * ROUNDUP_INTERVALS
    first, last = True, 0
    while i < len(tokens) and tokens[i] != "]":
        bound, value = tokens[i], int(tokens[i + 2])
        i += 3
        if bound == ">":
            for j in range(last + 1, ROUNDUP_INTERVALS):
                values[j] = value
        else:
            index = min(max(int(bound).bit_length() - 1, 0), ROUNDUP_INTERVALS - 1)
            if first:
                for j in range(index):
                    values[j] = value
                first = False
            values[index] = value
            last = index
        if i < len(tokens) and tokens[i] == ",":
            i += 1
    return tuple(values), i + 1


# -- sizes ----------------------------------------------------------------------------------


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    down = size & ~(step - 1)
    return size if down == size else down + step


def round_size(size: int, divisions: Sequence[int] = (0,) * ROUNDUP_INTERVALS) -> int:
    """The block size for a request of ``size`` bytes (``round_size``): at least 512, a
    multiple of 512, or the next power-of-two division when ``roundup_power2_divisions``
    asks for one (``AcceleratorAllocatorConfig::roundup_power2_divisions(size)`` picks the
    interval)."""
    if size < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    log = size.bit_length() - 1
    div = divisions[min(log - 20, ROUNDUP_INTERVALS - 1) if log > 20 else 0]
    if div > 1 and size > MIN_BLOCK_SIZE * div:
        return _roundup_power2_next_division(size, div)
    return -(-size // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def allocation_size(size: int) -> int:
    """What a new segment is cudaMalloc'd at for a block of ``size`` (rounded) bytes
    (``get_allocation_size``): 2 MiB for the small pool (up to 1 MiB), 20 MiB under 10 MiB,
    else the size rounded up to 2 MiB."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


# -- records --------------------------------------------------------------------------------


class Alloc(NamedTuple):
    """A request for ``size`` bytes on ``stream``; ``key`` names it for its :class:`Free`."""

    key: Hashable
    size: int
    stream: int = 0


class Free(NamedTuple):
    """The block allocated under ``key`` is free (``free_completed``)."""

    key: Hashable


@dataclass(frozen=True, slots=True)
class BlockRecord:
    """One block of a segment, as ``torch.cuda.memory_snapshot()`` lists it."""

    size: int
    requested: int  # of its last allocation (PyTorch keeps it after the free)
    allocated: bool


@dataclass(frozen=True, slots=True)
class SegmentRecord:
    """A segment (for an expandable segment: one mapped range) and its blocks in order."""

    address: int  # synthetic (falling) unless ``segment_addresses`` gave real ones
    size: int
    pool: Pool
    stream: int
    expandable: bool
    blocks: tuple[BlockRecord, ...]


@dataclass(frozen=True, slots=True)
class OutOfMemoryRecord:
    """A request the allocator could not serve, even after releasing its cache."""

    request: int  # index in the requests replayed (0-based); -1 outside replay
    requested: int  # bytes asked for
    allocation_size: int  # what a new segment would have needed
    allocated: int  # at the failure
    reserved: int  # at the failure, after the release
    cap: int | None


class ModelOutOfMemory(Exception):
    """Raised by :meth:`CachingAllocatorModel.malloc` where PyTorch raises
    ``OutOfMemoryError``; ``record`` holds the numbers."""

    def __init__(self, record: OutOfMemoryRecord) -> None:
        super().__init__(
            f"model out of memory: tried to allocate {record.allocation_size} bytes, "
            f"{record.reserved} reserved, cap {record.cap}"
        )
        self.record = record

    @property
    def requested(self) -> int:
        return self.record.requested

    @property
    def reserved(self) -> int:
        return self.record.reserved

    @property
    def cap(self) -> int | None:
        return self.record.cap


@dataclass(frozen=True, slots=True)
class Prediction:
    """What replaying a sequence of requests through the model gives."""

    peak_allocated: int
    peak_reserved: int
    peak_requested: int
    allocated: int  # at the end
    reserved: int
    requested: int
    peak_allocated_at: int  # the request (0-based) that first reached the peak; -1: none
    peak_reserved_at: int
    device_allocs: int  # cudaMalloc calls (expandable: mappings), as num_device_alloc
    device_frees: int  # cudaFree calls (expandable: unmappings), as num_device_free
    alloc_retries: int  # as num_alloc_retries
    inactive_split: int  # free blocks of split segments, at the end
    inactive_split_bytes: int
    segment_allocations: tuple[int, ...]  # the size of each cudaMalloc (or mapping), in order
    segments: tuple[SegmentRecord, ...]  # at the end, by address
    ooms: tuple[OutOfMemoryRecord, ...] = field(default=())


# -- the model ------------------------------------------------------------------------------


class _Expandable:
    """One ``ExpandableSegment``: an address range mapped in pages from its start."""

    __slots__ = ("base", "page", "size")

    def __init__(self, base: int, size: int, page: int) -> None:
        self.base = base
        self.size = size
        self.page = page


class _Block:
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
        segment: _Expandable | None = None,
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
        self.prev: _Block | None = None
        self.next: _Block | None = None


class _FreeBlocks:
    """One pool's free blocks of one stream, ordered as ``BlockComparatorSize`` orders them
    (size, then address; the stream is the list's). Two parallel lists: sort keys and
    blocks."""

    __slots__ = ("blocks", "keys")

    def __init__(self) -> None:
        self.keys: list[int] = []
        self.blocks: list[_Block] = []

    def add(self, b: _Block) -> None:
        key = b.size << _SHIFT | b.addr
        i = bisect_left(self.keys, key)
        self.keys.insert(i, key)
        self.blocks.insert(i, b)

    def remove(self, b: _Block) -> None:
        i = bisect_left(self.keys, b.size << _SHIFT | b.addr)
        del self.keys[i]
        del self.blocks[i]


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
        self._free: dict[tuple[bool, int], _FreeBlocks] = {}
        self._unmapped: dict[tuple[bool, int], list[_Block]] = {}
        self._live: dict[Hashable, _Block | None] = {}
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
        every: list[_Block] = [b for b in self._live.values() if b is not None]
        for free in self._free.values():
            every.extend(free.blocks)
        out: list[SegmentRecord] = []
        for head in every:
            if head.prev is not None and head.prev.mapped:
                continue
            blocks: list[BlockRecord] = []
            b: _Block | None = head
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

    def _get_free_block(self, small: bool, stream: int, size: int) -> _Block | None:
        """``get_free_block``: the smallest cached block of the pool and stream with at
        least ``size`` bytes (lowest address among equals), refused when it is oversize
        (>= max_split_size) for a request under max_split_size, or more than
        max_non_split_rounding_size larger than an oversize request. With expandable
        segments a block's size counts what it could grow into (``expandable_size``)."""
        free = self._free.get((small, stream))
        if free is None:
            return None
        keys = free.keys
        i = bisect_left(keys, size << _SHIFT)
        if i == len(keys):
            return None
        blocks = free.blocks
        b = blocks[i]
        if b.segment is not None:
            n = len(keys)
            while b.segment is not None and i + 1 < n:
                nb = blocks[i + 1]
                if _expandable_size(nb) < _expandable_size(b):
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
    ) -> _Block | None:
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
        block = _Block(self._new_address(alloc_size), alloc_size, small, stream)
        self._total += alloc_size
        self.reserved += alloc_size
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
        self.device_allocs += 1
        self.segment_allocations.append(alloc_size)
        return block

    def _alloc_found_block(self, block: _Block, size: int, orig: int, stream: int) -> _Block:
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
            block = _Block(rest.addr, size, rest.small, stream, rest.segment)
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

    def _free_block(self, block: _Block) -> None:
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

    def _try_merge(self, dst: _Block, src: _Block | None) -> int:
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
        i = bisect_left(free.keys, target << _SHIFT)
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
            to_unmap: list[_Block] = []
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

    def _release_block(self, block: _Block) -> None:
        """``release_block``: cudaFree a cached segment."""
        self._pool(block.small, block.stream).remove(block)
        self._total -= block.size
        self.reserved -= block.size
        self.device_frees += 1

    # -- expandable segments -----------------------------------------------------------

    def _try_allocate_expandable_block(self, small: bool, stream: int, size: int) -> _Block | None:
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

    def _find_expandable_block(self, small: bool, stream: int, size: int) -> _Block:
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
            b: _Block | None = c
            while room < size and b is not None and not b.allocated:
                room += b.size
                b = b.next
            if room >= size:
                return c
        page = SMALL_BUFFER if small else LARGE_BUFFER
        span = -(-self._range // page) * page
        segment = _Expandable(self._new_address(span), span, page)
        candidate = _Block(segment.base, span, small, stream, segment, mapped=False)
        unmapped.append(candidate)
        return candidate

    def _map_block(self, block: _Block, size: int) -> None:
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
            rest = _Block(
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

    def _unmap_block(self, block: _Block) -> None:
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
            head = _Block(block.addr, before, block.small, block.stream, seg)
            head.prev = block.prev
            if block.prev is not None:
                block.prev.next = head
            head.next = block
            block.prev = head
            pool.add(head)
        after = block.size - before - length
        if after > 0:
            tail = _Block(start + length, after, block.small, block.stream, seg)
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

    def _pool(self, small: bool, stream: int) -> _FreeBlocks:
        free = self._free.get((small, stream))
        if free is None:
            free = self._free[(small, stream)] = _FreeBlocks()
        return free

    def _new_address(self, size: int) -> int:
        if self._addresses is not None:
            return next(self._addresses)
        self._next_address -= -(-size // ROUND_LARGE) * ROUND_LARGE
        return self._next_address


def _expandable_size(b: _Block) -> int:
    """``expandable_size`` in ``get_free_block``: a block followed by unmapped address
    space counts as large as it could grow."""
    n = b.next
    return b.size + (n.size if n is not None and not n.mapped else 0)


# -- replay -------------------------------------------------------------------------------


def replay(
    requests: Iterable[Alloc | Free],
    config: AllocatorConfig | None = None,
    segment_addresses: Iterable[int] | None = None,
) -> Prediction:
    """Run ``requests`` through a fresh :class:`CachingAllocatorModel`. A request that
    runs out of memory is recorded in ``ooms`` and skipped, as a program that catches
    ``OutOfMemoryError`` goes on; a later :class:`Free` of its key is ignored."""
    model = CachingAllocatorModel(config, segment_addresses)
    ooms: list[OutOfMemoryRecord] = []
    failed: set[Hashable] = set()
    peak_allocated_at = peak_reserved_at = -1
    peak_allocated = peak_reserved = 0
    malloc, free = model.malloc, model.free
    for index, r in enumerate(requests):
        if type(r) is Alloc:
            try:
                malloc(r.key, r.size, r.stream)
            except ModelOutOfMemory as oom:
                rec = oom.record
                ooms.append(
                    OutOfMemoryRecord(
                        index,
                        rec.requested,
                        rec.allocation_size,
                        rec.allocated,
                        rec.reserved,
                        rec.cap,
                    )
                )
                failed.add(r.key)
                continue
            if model.peak_allocated > peak_allocated:
                peak_allocated = model.peak_allocated
                peak_allocated_at = index
            if model.peak_reserved > peak_reserved:
                peak_reserved = model.peak_reserved
                peak_reserved_at = index
        elif r.key in failed:
            failed.discard(r.key)
        else:
            free(r.key)
    return Prediction(
        peak_allocated=model.peak_allocated,
        peak_reserved=model.peak_reserved,
        peak_requested=model.peak_requested,
        allocated=model.allocated,
        reserved=model.reserved,
        requested=model.requested,
        peak_allocated_at=peak_allocated_at,
        peak_reserved_at=peak_reserved_at,
        device_allocs=model.device_allocs,
        device_frees=model.device_frees,
        alloc_retries=model.alloc_retries,
        inactive_split=model.inactive_split,
        inactive_split_bytes=model.inactive_split_bytes,
        segment_allocations=tuple(model.segment_allocations),
        segments=model.segments(),
        ooms=tuple(ooms),
    )


def requests_from_trace(entries: Iterable[Mapping[str, Any]]) -> list[Alloc | Free]:
    """The requests in an allocator history (``torch.cuda.memory._snapshot()``'s
    ``device_traces[i]``, entries with ``action``, ``addr``, ``size``, ``stream``).

    ``alloc`` becomes an :class:`Alloc` of its requested size; ``free_completed`` (the
    block is back in the cache) a :class:`Free` of the allocation at that address, which
    the next ``alloc`` there may reuse; ``oom`` an :class:`Alloc` that the model should
    refuse too (its size is already rounded; rounding again keeps it). Frees of addresses
    allocated before the history began are dropped: their blocks are unknown."""
    out: list[Alloc | Free] = []
    live: dict[int, int] = {}
    n = 0
    for e in entries:
        action = e["action"]
        if action == "alloc":
            n += 1
            live[int(e["addr"])] = n
            out.append(Alloc(n, int(e["size"]), int(e.get("stream", 0))))
        elif action == "free_completed":
            key = live.pop(int(e["addr"]), None)
            if key is not None:
                out.append(Free(key))
        elif action == "oom":
            n += 1
            out.append(Alloc(n, int(e["size"]), int(e.get("stream", 0))))
    return out
