"""Hints and post-mortems under PyTorch's expandable_segments setting (analysis/hints.py,
analysis/postmortem.py), on plain records: with the setting off they suggest it, with it
on they say what helps instead. The setting comes from the caller, the post-mortem, or
the environment, in that order."""

from __future__ import annotations

import sys

import pytest

from jupyter_gpumem.analysis.hints import expandable_in_conf, hints_for
from jupyter_gpumem.analysis.postmortem import explain_oom
from jupyter_gpumem.model import (
    AllocatorStats,
    CellReport,
    DeviceCellReport,
    DeviceSample,
    Limit,
    Measurement,
    OomEvent,
)

MiB, GiB = 1 << 20, 1 << 30
CONF = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")

RETRIES_OFF = (
    "The allocator ran short 3 time(s), flushed its cache and retried cudaMalloc (slow): "
    "memory is nearly full or fragmented. PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
    "often helps."
)
PIECES_OFF = (
    "1.00 GiB of the cache is free pieces of split blocks, which empty_cache can't return "
    "(fragmentation). expandable_segments:True avoids it."
)
RETRIES_ON = (
    "The allocator ran short 3 time(s), released its cached memory and retried (slow). "
    "expandable_segments is already on, which avoids most fragmentation: memory is nearly "
    "full. Free tensors you no longer need (`del`), or use a smaller batch."
)
PIECES_ON = (
    "1.00 GiB of the cache is free pieces of split blocks, which empty_cache can't return "
    "(fragmentation). expandable_segments is on, and PyTorch counts no expandable segment in "
    "this figure, so these pieces are in ordinary segments: made before it was turned on (a "
    "kernel started with it set makes every segment expandable) or for CUDA graphs and "
    "memory pools, which don't use expandable segments. `%gpumem segments` shows them."
)


@pytest.fixture(autouse=True)
def no_conf(monkeypatch: pytest.MonkeyPatch) -> None:
    """No allocator settings in the environment unless a test sets them; and no torch:
    the hints must not import it (they run after every cell, torch or not)."""
    for name in CONF:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)  # an import of torch would fail


def stats(retries: int, inactive_split: int) -> AllocatorStats:
    return AllocatorStats(
        allocated=1 * GiB,
        reserved=2 * GiB,
        active=1 * GiB,
        requested=1 * GiB,
        inactive_split=inactive_split,
        peak_allocated=1 * GiB,
        peak_reserved=2 * GiB,
        device_allocs=10,
        device_frees=0,
        alloc_retries=retries,
        ooms=0,
        segments=10,
        blocks=20,
    )


def report(limit: Limit | None = None, postmortems: tuple = ()) -> CellReport:
    """A cell after which the allocator had retried 3 times and held 1 GiB of free pieces
    of split blocks in its 2 GiB cache; nothing else worth a hint."""

    def sample(s: AllocatorStats) -> DeviceSample:
        return DeviceSample(0, "gpu", "cuda", True, s, 80 * GiB, None, None, limit)

    before, after = sample(stats(0, 1 * GiB)), sample(stats(3, 1 * GiB))

    def measurement(d: DeviceSample) -> Measurement:
        return Measurement(0.0, 0.0, "ok", "", "2.11.0", None, True, (d,))

    return CellReport(
        1,
        "x = f()",
        measurement(before),
        measurement(after),
        (DeviceCellReport(before, after, None, None, True),),
        0.1,
        False,
        None,
        postmortems=postmortems,
    )


def test_with_the_setting_off_the_hints_suggest_it():
    assert hints_for(report()) == (RETRIES_OFF, PIECES_OFF)
    assert hints_for(report(), {"expandable_segments": False}) == (RETRIES_OFF, PIECES_OFF)


def test_with_the_setting_on_in_the_environment_the_hints_say_what_helps_instead(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128, expandable_segments:True")
    hints = hints_for(report())
    assert hints == (RETRIES_ON, PIECES_ON)
    assert not any("expandable_segments:True" in h for h in hints)
    # PyTorch's newer name for the variable counts too
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    assert hints_for(report()) == (RETRIES_ON, PIECES_ON)


def test_with_a_cap_the_retry_hint_names_it(monkeypatch):
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    hints = hints_for(report(limit=Limit(0.15, 12 * GiB)))
    assert hints[0] == RETRIES_ON.replace(
        "(`del`), or", "(`del`), lift the cap of 12.00 GiB (`%gpumem limit off`), or"
    )


def test_the_callers_settings_come_before_the_environment(monkeypatch):
    # allocator_settings say what the allocator runs with; the environment may have been
    # set after PyTorch read it
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert hints_for(report(), {"expandable_segments": False}) == (RETRIES_OFF, PIECES_OFF)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    assert hints_for(report(), {"expandable_segments": True}) == (RETRIES_ON, PIECES_ON)


def test_the_post_mortem_of_the_device_says_what_the_snapshot_showed():
    seg = segment(
        [("active_allocated", 64 * MiB), ("inactive", 8 * MiB), ("active_allocated", 64 * MiB)]
    )
    event = OomEvent(0, 12 * MiB, 80 * GiB, 0)
    after = DeviceSample(0, "gpu", "cuda", True, None, 80 * GiB, 80 * GiB, None)
    on = explain_oom(event, after, [seg], None, settings={"expandable_segments": True})
    off = explain_oom(event, after, [seg], None, settings={"expandable_segments": False})
    unsaid = explain_oom(event, after, [seg], None)
    seen = explain_oom(event, after, [{**seg, "is_expandable": True}], None)
    assert (on.expandable_segments, off.expandable_segments) == (True, False)
    assert (unsaid.expandable_segments, seen.expandable_segments) == (None, True)
    assert hints_for(report(postmortems=(on,))) == (RETRIES_ON, PIECES_ON)
    assert hints_for(report(postmortems=(off,))) == (RETRIES_OFF, PIECES_OFF)
    assert hints_for(report(postmortems=(unsaid,))) == (RETRIES_OFF, PIECES_OFF)


def test_what_a_settings_string_says():
    assert expandable_in_conf("expandable_segments:True") is True
    assert expandable_in_conf(" expandable_segments : True ") is True  # spaces ignored
    assert expandable_in_conf("expandable_segments:True,expandable_segments:False") is False
    assert expandable_in_conf("expandable_segments:true") is False  # PyTorch takes True only
    assert expandable_in_conf("roundup_power2_divisions:[256:1,>:4],max_split_size_mb:64") is None
    assert expandable_in_conf("") is None


def segment(blocks: list[tuple[str, int]]) -> dict:
    address = 1 << 32
    out = []
    for state, size in blocks:
        out.append(
            {
                "address": address,
                "size": size,
                "requested_size": size,
                "state": state,
                "frames": [],
            }
        )
        address += size
    total = sum(size for _, size in blocks)
    live = sum(size for state, size in blocks if state == "active_allocated")
    return {
        "device": 0,
        "address": 1 << 32,
        "total_size": total,
        "allocated_size": live,
        "blocks": out,
    }


def test_a_fragmentation_fix_with_the_setting_on_does_not_suggest_it_or_max_split_size():
    # 16 MiB free in two 8 MiB pieces between live blocks; 12 MiB requested; the device full
    seg = segment(
        [
            ("active_allocated", 16 * MiB),
            ("inactive", 8 * MiB),
            ("active_allocated", 16 * MiB),
            ("inactive", 8 * MiB),
            ("active_allocated", 16 * MiB),
        ]
    )
    event = OomEvent(0, 12 * MiB, 80 * GiB, 0)
    after = DeviceSample(0, "gpu", "cuda", True, None, 80 * GiB, 80 * GiB, None)
    off = explain_oom(event, after, [seg], None, settings={"expandable_segments": False})
    frag = next(f for f in off.fixes if f.kind == "fragmentation")
    assert frag.command == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    on = explain_oom(event, after, [seg], None, settings={"expandable_segments": True})
    frag = next(f for f in on.fixes if f.kind == "fragmentation")
    assert frag.command == "" and frag.fits is None and frag.frees == 16 * MiB
    assert frag.text == (
        "largest free block 8.00 MiB < 12.00 MiB requested while 16.00 MiB is free in 2 "
        "pieces: fragmentation, although expandable_segments is on (PyTorch unmapped the free "
        "pages of its segments before raising): what is left lies in pages shared with live "
        "blocks or in segments made without it (before it was turned on, CUDA graphs' pools); "
        "freeing the live blocks around them helps, max_split_size_mb does not (it does not "
        "stop splitting while expandable segments are on); `%gpumem segments` shows where "
        "they are"
    )
