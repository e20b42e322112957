"""What a step's peak is made of (analysis/breakdown.py, analysis/blocks.py), on plain
records: hand-made traces with known answers, and traces recorded on an H100
(tests/fixtures/breakdown.json, made by tests/gpu/record_planning.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_gpumem.analysis.blocks import Heap, settings_notes
from jupyter_gpumem.analysis.breakdown import analyze, events_from_trace
from jupyter_gpumem.model import Mark, ModuleCall, Observed

MiB = 1 << 20
RECORDED = json.loads((Path(__file__).parent / "fixtures" / "breakdown.json").read_text())


def seg(address: int, size: int, blocks=()) -> dict:
    blocks = list(blocks) or [{"address": address, "size": size, "state": "inactive"}]
    return {"device": 0, "address": address, "total_size": size, "blocks": blocks}


def timed(events):
    """Events as the trace has them: the n-th at n x 10 us on the trace's clock."""
    return [(*e, 10 * i) if len(e) == 3 else e for i, e in enumerate(events, 1)]


def run(events, begin=(), observations=(), marks=(), calls=(), base=0, **kw):
    alive = kw.pop("alive", None)
    return analyze(
        0,
        timed(events),
        list(begin),
        alive if alive is not None else [],
        list(observations),
        list(marks),
        list(calls),
        base=base,
        base_reserved=kw.pop("base_reserved", 0),
        counter_peak=kw.pop("counter_peak", None),
        end_position=kw.pop("end_position", None),
        **kw,
    )


# -- the allocator's block sizes ---------------------------------------------------------
def test_a_request_is_rounded_and_split_off_a_free_block():
    h = Heap.from_segments([seg(0, 20 * MiB)], 1 << 63)
    assert h.alloc(0, 4) == 512  # a 4-byte scalar takes a 512-byte block
    assert h.alloc(512, 3 * MiB) == 3 * MiB
    assert h.free == {512 + 3 * MiB: 20 * MiB - 512 - 3 * MiB}


def test_a_free_block_is_handed_out_whole_when_the_rest_would_be_under_1_mib():
    # GIVEN a large-pool segment of 4 MiB, free
    h = Heap.from_segments([seg(0, 4 * MiB)], 1 << 63)
    # WHEN 3.5 MiB is asked for: 0.5 MiB would remain, too small to keep
    size = h.alloc(0, 3 * MiB + MiB // 2)
    # THEN the whole 4 MiB block is used, as allocated_bytes counts it
    assert size == 4 * MiB
    assert h.free == {}


def test_small_pool_blocks_split_down_to_512_bytes():
    h = Heap.from_segments([seg(0, MiB + 1024)], 1 << 63)
    assert h.alloc(0, MiB) == MiB  # small pool: the 1024 B that remain stay free
    assert h.free == {MiB: 1024}
    h2 = Heap.from_segments([seg(0, 2 * MiB)], 1 << 63)
    assert h2.alloc(0, 2 * MiB - 1024) == 2 * MiB  # large pool: 1024 B is too little to keep


def test_freed_blocks_merge_with_free_neighbours_of_their_segment_only():
    h = Heap.from_segments([seg(0, 4 * MiB), seg(4 * MiB, 4 * MiB)], 1 << 63)
    a = h.alloc(0, 1 * MiB)
    h.alloc(MiB, 1 * MiB)
    h.free_requested(0, a)
    h.free_completed(0)
    assert h.free[0] == MiB  # not merged across the live block at 1 MiB
    h.free_requested(MiB, MiB)
    h.free_completed(MiB)
    assert h.free[0] == 4 * MiB  # the whole first segment again
    assert h.free[4 * MiB] == 4 * MiB  # its neighbour segment stays apart


def test_blocks_larger_than_max_split_size_are_not_split():
    h = Heap.from_segments([seg(0, 64 * MiB)], max_split=32 * MiB)
    assert h.alloc(0, 40 * MiB) == 64 * MiB
    limit, notes = settings_notes({"max_split_size": 32 * MiB})
    assert limit == 32 * MiB and notes == []
    assert settings_notes({"max_split_size": -1})[0] == 1 << 63


def test_settings_that_change_the_rules_are_named():
    _, notes = settings_notes({"expandable_segments": True, "roundup_power2_divisions": {"1": 4}})
    assert len(notes) == 2


# -- the peak and its categories ----------------------------------------------------------
def test_categories_add_up_to_the_replayed_peak_with_block_slack():
    # GIVEN a 4 MiB free segment; a parameter of 3.5 MiB gets the whole 4 MiB block
    events = [("alloc", 0, 3 * MiB + MiB // 2), ("alloc", 1 << 30, 512)]
    begin = [seg(0, 4 * MiB), seg(1 << 30, 2 * MiB)]
    obs = [Observed(1, 0, 0, 3 * MiB + MiB // 2, "parameters")]
    b = run(
        events,
        begin,
        obs,
        counter_peak=4 * MiB + 512,
        end_position=2,
        alive=[(0, 4 * MiB), (1 << 30, 512)],
    )
    assert b.exact, b.note
    assert b.peak == 4 * MiB + 512
    assert b.bytes_of("parameters") == 3 * MiB + MiB // 2
    assert b.bytes_of("block slack") == MiB // 2  # the allocator's, not the parameter's
    assert b.bytes_of("temporaries") == 512
    assert sum(c.bytes for c in b.categories) == b.peak


def test_an_observation_names_only_the_block_alive_when_it_was_made():
    # GIVEN address A holds a saved tensor, is freed, then a temporary lands on A
    A = 1 << 30
    events = [
        ("alloc", A, 8 * MiB),  # 1: saved for backward
        ("free_requested", A, 8 * MiB),  # 2
        ("free_completed", A, 8 * MiB),
        ("alloc", A, 8 * MiB),  # 3: a temporary at the same address
        ("alloc", A + 8 * MiB, 4 * MiB),  # 4: the peak
    ]
    obs = [Observed(1, 0, A, 8 * MiB, "activations", "model.0")]
    b = run(
        events,
        [seg(A, 20 * MiB)],
        obs,
        end_position=4,
        alive=[(A, 8 * MiB), (A + 8 * MiB, 4 * MiB)],
    )
    # THEN at the peak the block at A is the temporary, not the old activation
    assert b.peak_event == 4
    assert b.bytes_of("activations") == 0
    assert b.bytes_of("temporaries") == 12 * MiB


def test_a_parameter_that_autograd_saved_is_a_parameter():
    A = 1 << 30
    obs = [
        Observed(0, 0, A, 4 * MiB, "activations", "model.0"),
        Observed(0, 0, A, 4 * MiB, "parameters"),
    ]
    begin = [seg(A, 4 * MiB, [{"address": A, "size": 4 * MiB, "state": "active_allocated"}])]
    b = run([], begin, obs, base=4 * MiB, alive=[(A, 4 * MiB)])
    assert b.bytes_of("parameters") == 4 * MiB and b.bytes_of("activations") == 0
    assert b.exact


def test_saved_tensors_stop_being_activations_when_their_backward_is_done():
    # GIVEN the input x (kept from before) saved in the forward, then backward done,
    # then an optimizer step that peaks
    X, T = 1 << 30, 1 << 31
    begin = [
        seg(X, 2 * MiB, [{"address": X, "size": 2 * MiB, "state": "active_allocated"}]),
        seg(T, 20 * MiB),
    ]
    obs = [Observed(0, 0, X, 2 * MiB, "activations", "model.0")]
    marks = [
        Mark({0: 0}, "forward"),
        Mark({0: 0}, "other"),
        Mark({0: 0}, "backward"),
        Mark({0: 0}, "backward done"),
        Mark({0: 0}, "optimizer step"),
    ]
    b = run(
        [("alloc", T, 8 * MiB)],
        begin,
        obs,
        marks,
        base=2 * MiB,
        end_position=1,
        alive=[(X, 2 * MiB), (T, 8 * MiB)],
    )
    assert b.phase == "optimizer step"
    assert b.bytes_of("activations") == 0
    assert b.bytes_of("kept from before") == 2 * MiB
    # WITHOUT the backward pass, x is still saved at the peak
    b2 = run(
        [("alloc", T, 8 * MiB)],
        begin,
        obs,
        marks[:2],
        base=2 * MiB,
        end_position=1,
        alive=[(X, 2 * MiB), (T, 8 * MiB)],
    )
    assert b2.bytes_of("activations") == 2 * MiB


def test_temporaries_go_to_the_innermost_module_running_when_allocated():
    T = 1 << 30
    events = [("alloc", T, MiB * 2), ("alloc", T + 2 * MiB, MiB * 4), ("alloc", T + 6 * MiB, MiB)]
    us = 1000  # ns: the calls are on Python's clock, between the events (at 10, 20, 30 us)
    calls = [
        ModuleCall("model", 5 * us, 35 * us),
        ModuleCall("model.0", 5 * us, 15 * us),
        ModuleCall("model.1", 15 * us, 25 * us),
    ]
    b = run(
        events,
        [seg(T, 20 * MiB)],
        calls=calls,
        end_position=3,
        alive=[(T, 2 * MiB), (T + 2 * MiB, 4 * MiB), (T + 6 * MiB, MiB)],
    )
    by = {m.module: m.temporaries for m in b.modules}
    assert by == {"model.1": 4 * MiB, "model.0": 2 * MiB, "model": MiB}
    assert [m.module for m in b.modules] == ["model.1", "model.0", "model"]


def test_a_wrapped_ring_buffer_or_a_wrong_replay_is_not_called_exact():
    b = run([("alloc", 0, MiB)], [seg(0, 2 * MiB)], end_position=5, alive=[(0, MiB)])
    assert not b.exact and "ring buffer wrapped" in b.note
    b = run(
        [("alloc", 0, MiB)],
        [seg(0, 2 * MiB)],
        counter_peak=3 * MiB,
        end_position=1,
        alive=[(0, MiB)],
    )
    assert not b.exact and "differs from the allocator's" in b.note
    b = run([("alloc", 0, MiB)], [seg(0, 2 * MiB)], end_position=1, alive=[(0, 2 * MiB)])
    assert not b.exact and "end state" in b.note


def test_events_from_a_raw_trace_keep_what_the_replay_needs():
    raw = [
        {"action": "alloc", "addr": 1, "size": 2, "frames": [], "time_us": 7},
        {"action": "oom", "addr": 0, "size": 9},
        {"action": "segment_alloc", "addr": 0, "size": 4, "time_us": 5},
    ]
    assert events_from_trace(raw) == [("alloc", 1, 2, 7), ("segment_alloc", 0, 4, 5)]


def test_a_saved_tensor_stamped_by_the_clock_is_placed_by_the_traces_clock():
    # GIVEN address A reused: a temporary (events 1-2), then the saved tensor (event 3)
    A = 1 << 30
    events = [
        ("alloc", A, 8 * MiB, 10),
        ("free_requested", A, 8 * MiB, 20),
        ("free_completed", A, 8 * MiB, 20),
        ("alloc", A, 8 * MiB, 30),
        ("alloc", A + 8 * MiB, 4 * MiB, 40),
    ]
    # WHEN the module that saved it ended at 35 us (Python's clock, in ns)
    saved = Observed(-1, 0, A, 8 * MiB, "activations", "model.0", 35_000)
    b = run(
        events,
        [seg(A, 20 * MiB)],
        [saved],
        end_position=4,
        alive=[(A, 8 * MiB), (A + 8 * MiB, 4 * MiB)],
    )
    # THEN the block alive then is the saved one; the earlier block at A is not
    assert b.bytes_of("activations") == 8 * MiB
    assert [m.module for m in b.modules] == ["model.0", "(outside any module)"]


# -- recorded on an H100 ------------------------------------------------------------------
def replay(case: dict):
    def positions(d):
        return {int(k): v for k, v in d.items()}

    return analyze(
        0,
        [tuple(e) for e in case["events"]],
        case["begin_segments"],
        [tuple(a) for a in case["alive_at_end"]],
        [Observed(*o) for o in case["observations"]],
        [Mark(positions(p), phase) for p, phase in case["marks"]],
        [ModuleCall(*c) for c in case["calls"]],
        base=case["base"],
        base_reserved=case["base_reserved"],
        counter_peak=case["counter_peak"],
        end_position=int(case["end_positions"]["0"]),
        settings=case["settings"],
    )


@pytest.mark.parametrize("name", sorted(RECORDED["cases"]))
def test_recorded_steps_add_up_to_the_allocators_peak(name):
    case = RECORDED["cases"][name]
    b = replay(case)
    assert b.exact, b.note
    assert b.peak == case["counter_peak"]
    assert sum(c.bytes for c in b.categories) == case["counter_peak"]
    assert b.bytes_of("parameters") == case["truth"]["parameters"]
    truth = case["truth"]["breakdown"]
    assert {c.category: c.bytes for c in b.categories} == {
        c["category"]: c["bytes"] for c in truth["categories"]
    }


def test_recorded_first_adamw_step_is_params_grads_and_twice_the_state():
    case = RECORDED["cases"]["first_adamw_step"]
    b = replay(case)
    P = case["truth"]["parameters"]
    assert b.phase == "optimizer step"
    assert (b.bytes_of("parameters"), b.bytes_of("gradients")) == (P, P)
    assert b.bytes_of("optimizer state") == case["truth"]["optimizer_state"] == 2 * P
    assert b.bytes_of("activations") == 0


def test_recorded_forward_peak_holds_the_saved_activations():
    b = replay(RECORDED["cases"]["forward"])
    B = 256
    r = lambda n: -(-n // 512) * 512  # noqa: E731
    assert b.phase == "forward"
    assert b.bytes_of("activations") == r(B * 1024 * 4) + 2 * r(B * 4096 * 4)
