"""The caching allocator's size rules (analysis/allocator_rules.py) against PyTorch's
numbers, and the analyses that follow them: the trace replay's ``Heap`` writes the
rounding and the split rule out for speed, and must give the rules' answers."""

from __future__ import annotations

import pytest

from jupyter_gpumem.analysis.allocator_rules import (
    LARGE_BUFFER,
    MIN_BLOCK_SIZE,
    SIZE_MAX,
    SMALL_BUFFER,
    SMALL_SIZE,
    allocation_size,
    round_size,
    should_split,
)
from jupyter_gpumem.analysis.blocks import Heap
from jupyter_gpumem.units import GiB, KiB, MiB

SIZES = [1, 4, 511, 512, 513, 1000, 4 * KiB, MiB - 1, MiB, MiB + 1, 3 * MiB, 10 * MiB - 1]
SIZES += [10 * MiB, 10 * MiB + 1, 100 * MiB + 1, GiB - 1, GiB]


def test_constants_are_pytorchs():
    # CUDACachingAllocator.cpp: kMinBlockSize, kSmallSize, kSmallBuffer, kLargeBuffer
    assert (MIN_BLOCK_SIZE, SMALL_SIZE, SMALL_BUFFER, LARGE_BUFFER) == (
        512,
        1048576,
        2097152,
        20971520,
    )


def test_round_size_and_allocation_size():
    assert [round_size(n) for n in (0, 1, 512, 513, MiB + 1)] == [512, 512, 512, 1024, MiB + 512]
    assert allocation_size(round_size(MiB)) == 2 * MiB  # the small pool's segment
    assert allocation_size(round_size(MiB + 1)) == 20 * MiB  # 1-10 MiB: 20 MiB
    assert allocation_size(round_size(10 * MiB - 1)) == 10 * MiB  # rounds to 10 MiB first
    assert allocation_size(round_size(100 * MiB + 1)) == 102 * MiB  # to 2 MiB
    # roundup_power2_divisions:4 rounds 1.1 GiB to the next quarter of its power of two
    assert round_size(GiB + GiB // 10, (4,) * 16) == GiB + GiB // 4


def test_should_split():
    assert should_split(True, 512, 512, SIZE_MAX)
    assert not should_split(True, 512, 511, SIZE_MAX)
    assert should_split(False, 2 * MiB, MiB + 1, SIZE_MAX)
    assert not should_split(False, 2 * MiB, MiB, SIZE_MAX)  # more than 1 MiB must remain
    assert not should_split(False, 200 * MiB, 100 * MiB, 200 * MiB)  # max_split_size


@pytest.mark.parametrize("max_split", [1 << 63, 40 * MiB])
def test_the_replay_heap_follows_the_rules(max_split):
    for requested in SIZES:
        size = round_size(requested)
        for whole in {size, size + 511, size + 512, size + MiB, size + MiB + 512, 4 * size}:
            heap = Heap(max_split=max_split)
            heap.segment_alloc(0, whole)
            got = heap.alloc(0, requested)
            split = should_split(size <= SMALL_SIZE, size, whole - size, max_split)
            assert got == (size if split else whole), (requested, whole)
