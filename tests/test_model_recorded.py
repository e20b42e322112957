"""Collector -> model -> cell report, on allocator readings recorded on an H200.

Each scenario in jupyter_gpumem/testing/recorded/gpu_readings.json was produced by real
allocations of known size (tests/gpu/record_fixtures.py); the report must give back exactly
those sizes.
"""

from __future__ import annotations

import pytest

from jupyter_gpumem.collectors import Collector
from jupyter_gpumem.collectors.readings import stats_from_flat, stats_from_nested
from jupyter_gpumem.core.tracker import CellTracker
from jupyter_gpumem.protocol.convert import to_protocol
from tests.fakes import RECORDED, ScriptedBackend, scenario

MiB = 1 << 20


def report_for(name: str, **end_kw):
    before, after, truth = scenario(name)
    backend = ScriptedBackend(before, after)
    t = CellTracker(Collector(backend))
    t.begin()
    return t.end(**end_kw), truth, backend


def test_nested_and_flat_stats_agree():
    nf = RECORDED["nested_vs_flat"]
    assert stats_from_nested(nf["nested"]) == stats_from_flat(nf["flat"])


def test_keep_n_bytes():
    r, truth, backend = report_for("keep_n_bytes")
    d = r.device(0)
    assert d.allocated_delta == truth["n"] == 256 * MiB
    assert d.reserved_delta == truth["n"]
    assert d.peak_allocated == truth["n"]
    assert d.peak_above_start == truth["n"]
    assert d.device_allocs == 1 and d.device_frees == 0
    assert backend.resets == [[0]]  # peak reset on the initialised device before the cell


def test_transient_spike_peak_is_exact():
    r, truth, _ = report_for("transient_spike")
    d = r.device(0)
    assert d.allocated_delta == truth["kept"]
    assert d.peak_above_start == truth["kept"] + truth["spike"]
    assert d.reserved_delta == truth["kept"] + truth["spike"]  # the spike stays cached
    assert any(h.startswith("Reserved grew by") for h in r.hints)
    assert any(h.startswith("Temporaries peaked 576.00 MiB") for h in r.hints)


def test_empty_cache_released():
    r, truth, _ = report_for("empty_cache")
    d = r.device(0)
    assert d.reserved_delta == -truth["released"]
    assert d.allocated_delta == 0
    assert d.device_frees >= 1
    # NVML sees the same bytes leave this process
    assert d.process_used_delta == -truth["released"]


def test_fragmentation_non_releasable():
    r, _, _ = report_for("fragmentation")
    a = r.device(0).after.allocator
    assert a.inactive_split > 0
    assert a.inactive_split == r.after.device(0).allocator.inactive_split


def test_caching_off_outside_torch_delta_is_exact():
    r, truth, _ = report_for("caching_off")
    d = r.device(0)
    assert r.after.caching is False
    assert d.allocated_delta == 0 and d.reserved_delta == 0  # counters miss it
    assert d.outside_torch_delta == truth["n"]  # the device level does not
    assert any(h.startswith("Caching is off: 128.00 MiB") for h in r.hints)


def test_oom_at_cap():
    r, truth, _ = report_for("oom_at_cap", error=MemoryError("CUDA out of memory"))
    d = r.device(0)
    assert d.ooms == 1
    assert r.failed and r.error == "MemoryError: CUDA out of memory"
    assert d.after.limit is not None
    assert d.after.limit.bytes == truth["cap"]


def test_context_created_in_cell():
    r, _, _ = report_for("context_created")
    d = r.device(0)
    assert not d.before.initialized and d.after.initialized
    assert d.allocated_delta == 0
    ctx = d.after.process_used
    assert d.after.outside_torch == ctx  # nothing reserved yet: all of it is the context
    assert any(h.startswith("This cell started CUDA on cuda:0") for h in r.hints)


def test_keep_peak_upper_bound_when_no_new_peak():
    before, after, _ = scenario("empty_cache")  # peak 832 MiB set earlier, not exceeded
    t = CellTracker(Collector(ScriptedBackend(before, after)))
    t.begin(keep_peak=True)
    d = t.end().device(0)
    assert t.collector.backend.resets == []
    assert not d.peak_exact


def test_keep_peak_exact_when_new_peak():
    before, after, _ = scenario("transient_spike")
    t = CellTracker(Collector(ScriptedBackend(before, after)))
    t.begin(keep_peak=True)
    d = t.end().device(0)
    assert d.peak_exact and d.peak_allocated == 832 * MiB


def test_untouched_device_is_left_out_unless_asked():
    before, _, _ = scenario("keep_n_bytes")
    t = CellTracker(Collector(ScriptedBackend(before, before)))
    t.begin()
    assert t.end().devices == ()
    t.begin()
    assert [d.index for d in t.end(device=0).devices] == [0]


def test_sample_dict_matches_model():
    _, after, truth = scenario("keep_n_bytes")
    m = Collector(ScriptedBackend(after)).measure()
    s = to_protocol(m)
    dev = s["devices"][0]
    assert dev["allocated"] == truth["n"]
    assert dev["process_used"] == after["devices"][0]["nvml"]["process_used"]
    assert dev["limit"] is None and s["state"] == "ok"


def test_timeline_frames_are_consistent():
    from jupyter_gpumem.testing.replay import reading_from_raw

    for raw in RECORDED["timeline"]:
        d = reading_from_raw(raw).devices[0]
        a = d.allocator
        assert a.allocated <= a.reserved <= d.process_used <= d.device_used <= d.total
        assert a.peak_allocated >= a.allocated


@pytest.mark.parametrize("name", list(RECORDED["scenarios"]))
def test_every_scenario_reports_without_error(name):
    from jupyter_gpumem.reporters import cell_report_html, cell_report_text, compact_line

    r, _, _ = report_for(name)
    assert "gpumem: cell" in cell_report_text(r)
    assert cell_report_html(r).startswith('<div class="jp-GpuMem-report">')
    assert compact_line(r).startswith("gpumem ")


def test_caching_off_cell_touched_without_process_figures():
    """The cheap bracket readings carry no NVML figure: the device-level change alone must
    mark the device and give the uncached bytes."""
    before, after, truth = scenario("caching_off")
    strip = lambda raw: {**raw, "devices": [{**d, "nvml": None} for d in raw["devices"]]}  # noqa: E731
    t = CellTracker(Collector(ScriptedBackend(strip(before), strip(after))))
    t.begin()
    d = t.end().device(0)
    assert d is not None and d.process_used_delta is None
    assert truth["n"] <= d.outside_torch_delta <= truth["n"] + 2 * MiB


def _outside_row(r):
    from jupyter_gpumem.reporters._rows import cell_sections

    return next(row for row in cell_sections(r)[0].rows if row.label == "outside PyTorch")


def test_outside_pytorch_takes_both_ends_from_one_source():
    """A before reading without NVML's per-process figure and an after reading with it
    must not be mixed: the row then uses the whole device at both ends."""
    import copy

    before, after, _ = scenario("keep_n_bytes")
    before = copy.deepcopy(before)
    before["devices"][0]["nvml"]["process_used"] = None  # as a -q reading takes it
    t = CellTracker(Collector(ScriptedBackend(before, after)))
    t.begin()
    r = t.end()
    d = r.device(0)
    row = _outside_row(r)
    assert row.note.endswith("whole device: all processes")
    b, a = d.before, d.after
    expected_before = b.device_used - b.allocator.reserved
    expected_after = a.device_used - a.allocator.reserved
    from jupyter_gpumem.units import format_bytes, format_delta

    assert row.value == (
        f"{format_bytes(expected_before)} -> {format_bytes(expected_after)} "
        f"({format_delta(expected_after - expected_before)})"
    )
    assert d.outside_torch_delta == expected_after - expected_before
    # with the figure at both ends: this process's at both ends
    r2, _, _ = report_for("keep_n_bytes")
    row2 = _outside_row(r2)
    assert row2.note.endswith("this process (NVML)")
    d2 = r2.device(0)
    assert row2.value.endswith(f"({format_delta(d2.outside_torch_delta)})")


def test_replay_peak_is_never_below_the_start_of_the_cell():
    """The test-only replay moves through its frames with time: a cell whose start reading
    and peak reset fall in two frames must still have its peak at or above what was
    allocated at its start, as a real allocator's (every start frame, every next frame)."""
    from jupyter_gpumem.testing.replay import ReplayBackend
    from tests.fakes import FIXTURES

    t = [0.0]
    backend = ReplayBackend(str(FIXTURES), clock=lambda: t[0])
    frames = len(backend.timeline)
    for i in range(frames):
        tracker = CellTracker(Collector(backend))
        t[0] = i * backend.period
        tracker.begin()
        t[0] = (i + 1) * backend.period  # the reset reads the next frame
        backend.reset_peaks()
        for d in tracker.end().devices:
            if d.peak_allocated is not None and d.before.allocator is not None:
                assert d.peak_allocated >= d.before.allocator.allocated


class _Observed(ScriptedBackend):
    """Attaches the OOM observer on the second reading (CUDA started in between)."""

    def __init__(self, *raws, attach_at: int = 2) -> None:
        super().__init__(*raws)
        self.asked = 0
        self.attach_at = attach_at
        self.callbacks: list = []

    def attach_oom_observer(self, callback) -> bool:
        self.asked += 1
        if self.asked < self.attach_at:
            return False
        self.callbacks.append(callback)
        return True


def test_oom_observer_asked_until_attached_then_never_again_and_again_for_a_new_backend():
    before, after, _ = scenario("keep_n_bytes")
    first = _Observed(before, after)
    c = Collector(first)
    for _ in range(5):
        c.measure(with_process=False, full=False)
    # asked at the first reading (not attachable yet) and the second (attached); then not
    assert (first.asked, len(first.callbacks)) == (2, 1)
    second = _Observed(before, after, attach_at=1)
    c.backend = second  # tests and the replay swap backends: the new one is asked
    c.measure(with_process=False, full=False)
    c.measure(with_process=False, full=False)
    assert (second.asked, len(second.callbacks)) == (1, 1)
    second.callbacks[0](0, 2 * MiB, 0, 0)  # the allocator calls it before raising
    assert c.oom_count == 1 and c.ooms[-1].requested == 2 * MiB
