"""PyTorch's caching allocator in numbers: its constants and the size rules every request
goes through, as ``c10/cuda/CUDACachingAllocator.cpp`` (torch 2.x) has them.

The one statement of these rules for every analysis that reasons about blocks and
segments: the free space and "would it fit" of a post-mortem (``fragmentation``), the
replay of a cell's trace (``blocks``), the model of the allocator the dry run drives
(``caching/config.py`` and ``caching/model.py``). Pure functions of sizes in bytes.

- A request becomes a block of :func:`round_size` bytes: at least 512, a multiple of
  512 (or a power-of-two division when ``roundup_power2_divisions`` asks for one).
- Blocks up to 1 MiB (``SMALL_SIZE``) come from the small pool, larger ones from the
  large pool; a new segment is cudaMalloc'd at :func:`allocation_size`: 2 MiB for the
  small pool, 20 MiB for blocks under 10 MiB, else the block rounded up to 2 MiB.
- A cached free block serves a request whole, or split when the rest is worth keeping
  (:func:`should_split`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..units import MiB

MIN_BLOCK_SIZE = 512  # kMinBlockSize: every block is a multiple of it
SMALL_SIZE = 1 * MiB  # kSmallSize: the largest request served by the small pool
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: a small segment, and an expandable small page
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: a segment for 1-10 MiB, an expandable large page
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc
ROUND_LARGE = 2 * MiB  # kRoundLarge
SIZE_MAX = (1 << 64) - 1  # max_split_size when unset (std::numeric_limits<size_t>::max())
ROUNDUP_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: 1 MiB, 2 MiB, ... 32 GiB and above


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
    interval; the default asks for none)."""
    if size < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    log = size.bit_length() - 1
    div = divisions[min(log - 20, ROUNDUP_INTERVALS - 1) if log > 20 else 0]
    if div > 1 and size > MIN_BLOCK_SIZE * div:
        return _roundup_power2_next_division(size, div)
    return -(-size // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def allocation_size(size: int) -> int:
    """What a new segment is cudaMalloc'd at for a block of ``size`` bytes, already
    rounded by :func:`round_size` (``get_allocation_size``): 2 MiB for the small pool (up
    to 1 MiB), 20 MiB under 10 MiB, else the size rounded up to 2 MiB."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def should_split(small: bool, size: int, remaining: int, max_split: int) -> bool:
    """Whether a cached free block handed out for a block of ``size`` bytes is split,
    ``remaining`` bytes staying cached (``should_split``): in the small pool (and in
    expandable segments) when at least 512 bytes remain; in the large pool when the block
    is under ``max_split`` (``max_split_size``; :data:`SIZE_MAX` when unset) and more than
    1 MiB remains. Otherwise the whole free block is handed out."""
    if small:
        return remaining >= MIN_BLOCK_SIZE
    return size < max_split and remaining > SMALL_SIZE
