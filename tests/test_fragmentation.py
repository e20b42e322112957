"""Free space and "would it fit" on plain segment records (PyTorch's snapshot shape)."""

from __future__ import annotations

from jupyter_gpumem.analysis.allocator_rules import allocation_size, round_size
from jupyter_gpumem.analysis.fragmentation import free_runs, free_space, would_fit

MiB = 1 << 20
GiB = 1 << 30
BASE = 0x7F00_0000_0000  # 2 MiB aligned


def segment(sizes_states, address=BASE, small=False, device=0, expandable=False):
    blocks, a = [], address
    for size, state in sizes_states:
        blocks.append(
            {"address": a, "size": size, "requested_size": size, "state": state, "frames": []}
        )
        a += size
    return {
        "device": device,
        "address": address,
        "total_size": a - address,
        "segment_type": "small" if small else "large",
        "is_expandable": expandable,
        "blocks": blocks,
    }


def planted(n=16, size=64 * MiB):
    """A 1 GiB segment split into 16 blocks; every other one freed."""
    return segment([(size, "inactive" if i % 2 == 0 else "active_allocated") for i in range(n)])


def test_rounding_follows_the_allocator():
    assert round_size(1) == 512
    assert round_size(513) == 1024
    assert allocation_size(1000) == 2 * MiB  # small pool
    assert allocation_size(3 * MiB) == 20 * MiB  # < 10 MiB: a 20 MiB segment
    assert allocation_size(100 * MiB + 1) == 102 * MiB  # rounded up to 2 MiB


def test_planted_fragmentation_pieces_and_largest_block():
    space = free_space([planted()])
    assert space.pieces == 8
    assert space.pieces_bytes == 8 * 64 * MiB
    assert space.largest_free_block == 64 * MiB
    assert space.releasable == 0
    assert space.allocated == 8 * 64 * MiB
    assert space.fragmentation == 1.0


def test_adjacent_free_blocks_merge_and_a_whole_free_segment_is_releasable():
    seg = segment([(10 * MiB, "inactive"), (6 * MiB, "inactive"), (4 * MiB, "active_allocated")])
    free = segment([(20 * MiB, "inactive")], address=BASE + GiB)
    runs = free_runs([seg, free])
    assert [(r.size, r.releasable) for r in runs] == [(16 * MiB, False), (20 * MiB, True)]
    space = free_space([seg, free])
    assert space.releasable == 20 * MiB and space.largest_piece == 16 * MiB


def test_freeing_blocks_merges_them_with_their_free_neighbours():
    seg = planted()
    live = [b["address"] for b in seg["blocks"] if b["state"] == "active_allocated"]
    assert max(r.size for r in free_runs([seg], freed=live[:1])) == 3 * 64 * MiB


def test_would_fit_under_a_cap_only_with_expandable_segments():
    seg = planted()
    reserved = seg["total_size"]
    cap = reserved + 32 * MiB
    assert not would_fit([seg], 128 * MiB, device_free=100 * GiB, cap=cap)
    assert would_fit([seg], 64 * MiB, device_free=100 * GiB, cap=cap)  # one piece is enough
    assert would_fit([seg], 128 * MiB, device_free=100 * GiB, cap=cap, expandable=True)
    live = [b["address"] for b in seg["blocks"] if b["state"] == "active_allocated"]
    assert would_fit([seg], 128 * MiB, device_free=100 * GiB, cap=cap, freed=live[:1])
    assert would_fit([seg], 128 * MiB, device_free=100 * GiB, cap=None)  # no cap: cudaMalloc


def test_small_requests_need_small_pool_blocks():
    large_free = segment([(20 * MiB, "inactive"), (1 * MiB, "active_allocated")])
    assert not would_fit([large_free], 4096, device_free=0, cap=None)
    small_free = segment(
        [(1 * MiB, "inactive"), (1 * MiB, "active_allocated")], small=True, address=BASE + GiB
    )
    assert would_fit([large_free, small_free], 4096, device_free=0, cap=None)


def test_device_memory_of_other_processes_limits_new_segments():
    seg = segment([(64 * MiB, "active_allocated")])
    assert not would_fit([seg], 256 * MiB, device_free=100 * MiB, cap=None)
    assert would_fit([seg], 256 * MiB, device_free=300 * MiB, cap=None)
