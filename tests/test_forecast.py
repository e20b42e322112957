"""A forecast before the OOM (analysis/forecast.py): the pure rule on hand-made series with
ground truth, then a real IPython shell whose cells leak an exact number of bytes each
on the counting test backend (tests/gpu/test_forecast_gpu.py checks the forecast against
a real OOM on a GPU)."""

from __future__ import annotations

import random
import timeit

import jsonschema
import pytest

from jupyter_gpumem._ipython import current
from jupyter_gpumem.analysis.forecast import (
    HORIZON_CELLS,
    HORIZON_SECONDS,
    WINDOW,
    Point,
    forecast,
    forecasts,
    growth,
    limit_for,
    series,
)
from jupyter_gpumem.model import (
    AllocatorStats,
    CellReport,
    DeviceRow,
    DeviceSample,
    Forecast,
    HistoryRow,
    Limit,
    Measurement,
    WorkerDevice,
    WorkerReport,
)
from jupyter_gpumem.protocol import schema
from jupyter_gpumem.protocol.convert import to_protocol
from jupyter_gpumem.reporters._rows import compact_line, duration, forecast_line, forecast_text
from jupyter_gpumem.reporters.html import cell_report_html
from jupyter_gpumem.reporters.text import cell_report_text
from jupyter_gpumem.testing import counting
from tests.conftest import run

GiB = 1 << 30
MiB = 1 << 20
LEAK = 64 * MiB
CAP = 8 * GiB


def leak_points(n: int, start: int = 1 * GiB, step: int = LEAK, every: float = 30.0):
    """n cells, each keeping exactly ``step`` more bytes, ``every`` seconds apart."""
    return [Point(10 + i, 1000.0 + every * i, start + step * (i + 1)) for i in range(n)]


# -- the rule ---------------------------------------------------------------------------
@pytest.mark.parametrize("n", [3, 4, 5, 10, 25])
def test_an_exact_leak_under_a_cap_forecasts_the_exact_cells_left(n):
    pts = leak_points(n)
    f = forecast(pts, CAP, "cap")
    assert f is not None
    last = pts[-1].allocated
    assert f.bytes_per_cell == LEAK
    assert f.cells_left == (CAP - last) // LEAK and (CAP - last) % LEAK == 0
    assert f.seconds_left == pytest.approx(f.cells_left * 30.0)
    assert (f.limit, f.limit_kind, f.allocated) == (CAP, "cap", last)
    assert f.cells == min(n, WINDOW)  # fitted on the last 10 cells at most
    assert f.first_cell == pts[-f.cells].cell
    assert (f.device, f.worker, f.who) == (0, None, None)


def test_fewer_than_three_cells_get_nothing():
    assert forecast([], CAP, "cap") is None
    assert forecast(leak_points(1), CAP, "cap") is None
    assert forecast(leak_points(2), CAP, "cap") is None
    assert forecast(leak_points(3), CAP, "cap") is not None


def test_noise_within_one_percent_gets_nothing():
    rng = random.Random(7)
    base = 4 * GiB
    noisy = [Point(i, float(i), base + rng.randint(-base // 200, base // 200)) for i in range(30)]
    for end in range(3, 31):
        assert forecast(noisy[:end], CAP, "cap") is None
    # a steady creep that stays within 1 % of allocated over the window: nothing either
    creep = leak_points(10, start=base, step=4 * MiB)  # 40 MiB on 4 GiB: 0.98 %
    assert growth(creep) is None
    # the same creep, larger: a forecast
    assert growth(leak_points(10, start=base, step=8 * MiB)) is not None


def test_a_cell_that_freed_memory_restarts_the_window():
    pts = leak_points(6)
    freed = Point(16, 1180.0, 1 * GiB)  # a cell that freed memory
    after = [Point(17 + i, 1210.0 + 30 * i, 1 * GiB + LEAK * (i + 1)) for i in range(3)]
    assert forecast([*pts, freed], CAP, "cap") is None
    assert forecast([*pts, freed, after[0]], CAP, "cap") is None  # two cells since
    f = forecast([*pts, freed, *after[:2]], CAP, "cap")
    assert f is not None and f.cells == 3 and f.first_cell == 16
    assert f.bytes_per_cell == LEAK and f.cells_left == (CAP - after[1].allocated) // LEAK


def test_a_single_jump_is_not_a_steady_growth():
    flat = [Point(i, float(i), 1 * GiB) for i in range(5)]
    assert forecast([*flat, Point(5, 5.0, 2 * GiB)], CAP, "cap") is None  # R² < 0.9
    assert forecast(flat, CAP, "cap") is None  # no growth at all


def test_a_staircase_leak_is_steady():
    # every other cell keeps 128 MiB: 64 MiB a cell on average
    pts = [Point(i, 10.0 * i, 1 * GiB + 128 * MiB * ((i + 1) // 2)) for i in range(10)]
    f = forecast(pts, CAP, "cap")
    assert f is not None and abs(f.bytes_per_cell - LEAK) < 8 * MiB


def test_the_limit_is_the_cap_else_reserved_plus_free():
    assert limit_for(reserved=3 * GiB, cap=CAP, total=80 * GiB, device_used=4 * GiB) == (
        CAP,
        "cap",
    )
    # no cap: what allocated can grow into, reserved + the device's free memory
    assert limit_for(3 * GiB, None, 80 * GiB, 4 * GiB) == (79 * GiB, "device")
    # a cap the device can no longer give (other processes fill it): the device binds
    assert limit_for(3 * GiB, CAP, 80 * GiB, 78 * GiB) == (5 * GiB, "device")
    assert limit_for(3 * GiB, CAP, None, None) == (CAP, "cap")
    assert limit_for(3 * GiB, None, None, None) is None


def test_who_grows_is_the_last_line_the_history_names():
    pts = [p._replace(who=f"In[{p.cell}] line 2 `keep.append(x)`") for p in leak_points(4)]
    f = forecast(pts, CAP, "cap")
    assert f is not None and f.who == "In[13] line 2 `keep.append(x)`"


# -- from the history's rows -------------------------------------------------------------
def row(cell: int, *devices: DeviceRow, time: float | None = None) -> HistoryRow:
    return HistoryRow(
        cell, 1000.0 + 30 * cell if time is None else time, "x", 0.01, False, 0, devices
    )


def dev(
    allocated: int,
    delta: int,
    device: int = 0,
    worker: str | None = None,
    kept_at: str | None = None,
    reserved: int | None = None,
) -> DeviceRow:
    reserved = allocated if reserved is None else reserved
    return DeviceRow(
        device, allocated, delta, reserved, None, allocated, delta, None, None, kept_at, worker
    )


def sample(index: int, allocated: int, reserved: int, cap: int | None = None, used: int = 0):
    stats = AllocatorStats(
        allocated, reserved, allocated, allocated, 0, allocated, reserved, 0, 0, 0, 0, 1, 1
    )
    limit = Limit(cap / (80 * GiB), cap) if cap is not None else None
    return DeviceSample(index, "Counting GPU", "cuda", True, stats, 80 * GiB, used, None, limit)


def report(devices=(), workers=()) -> CellReport:
    m = Measurement(0.0, 0.0, "ok", "", "2.11", None, True, tuple(devices))
    return CellReport(None, "", m, m, (), 0.0, False, None, workers=tuple(workers))


def test_kernel_rows_a_cell_that_did_not_touch_the_device_keeps_its_value():
    rows = [row(1, dev(1 * GiB + LEAK, LEAK)), row(2), row(3, dev(1 * GiB + 2 * LEAK, LEAK))]
    assert [p.allocated for p in series(rows, 0)] == [GiB + LEAK, GiB + LEAK, GiB + 2 * LEAK]
    rows = [row(i, dev(GiB + i * LEAK, LEAK, kept_at="line 1 `k.append(x)`")) for i in range(1, 6)]
    last = GiB + 5 * LEAK
    (f,) = forecasts(rows, report([sample(0, last, last, cap=CAP)]))
    assert (f.cells_left, f.limit_kind, f.who) == (
        (CAP - last) // LEAK,
        "cap",
        "In[5] line 1 `k.append(x)`",
    )
    # without a cap: reserved + the device's free memory (80 GiB total, 10 GiB used)
    (f,) = forecasts(rows, report([sample(0, last, last + GiB, used=10 * GiB)]))
    assert (f.limit, f.limit_kind) == (last + GiB + 70 * GiB, "device")
    # a last cell that did not grow gets nothing
    flat = [*rows, row(6, dev(last, 0))]
    assert forecasts(flat, report([sample(0, last, last, cap=CAP)])) == ()


def worker_report(label_pid: int, index: int, allocated: int, reserved: int, host: str = "h"):
    d = WorkerDevice(index, "Counting GPU", 0, allocated, reserved, allocated, reserved, 0, 1, True)
    return WorkerReport(label_pid, 1, 2, host, "running", False, 0.1, (d,))


def test_a_workers_series_is_its_own():
    w = "rank 1 (pid 42)"
    rows = [
        # the kernel's own device 0 stays flat; the worker's device 0 leaks per report
        row(
            i,
            dev(GiB, 0),
            dev(2 * GiB + i * LEAK, LEAK, worker=w, reserved=2 * GiB + i * LEAK + MiB),
        )
        for i in range(1, 5)
    ]
    assert [p.allocated for p in series(rows, 0, w)] == [2 * GiB + i * LEAK for i in range(1, 5)]
    assert [p.allocated for p in series(rows, 0)] == [GiB] * 4
    last, reserved = 2 * GiB + 4 * LEAK, 2 * GiB + 4 * LEAK + MiB
    wr = worker_report(42, 0, last, reserved)
    # the kernel reads the worker's device (same index and name, this host): 10 GiB used
    (f,) = forecasts(rows, report([sample(0, GiB, GiB, used=10 * GiB)], [wr]), host="h")
    assert (f.device, f.worker, f.bytes_per_cell) == (0, w, LEAK)
    assert (f.limit, f.limit_kind) == (reserved + 70 * GiB, "device")
    assert f.cells_left == (reserved + 70 * GiB - last) // LEAK
    # on another host the kernel's reading says nothing of its device
    assert forecasts(rows, report([sample(0, GiB, GiB, used=10 * GiB)], [wr]), host="other") == ()
    # no reading of the device in the kernel: what `room` reads (NVML), asked once
    asked = []

    def room(index, name):
        asked.append((index, name))
        return 80 * GiB, 20 * GiB

    (f,) = forecasts(rows, report([], [wr]), host="h", room=room)
    assert asked == [(0, "Counting GPU")] and f.limit == reserved + 60 * GiB
    assert forecasts(rows, report([], [wr]), host="h") == ()  # nothing known: no forecast


def test_words():
    assert [duration(s) for s in (0.2, 45, 12 * 60, 3.5 * 3600, 60 * 3600)] == [
        "1 s",
        "45 s",
        "12 min",
        "3.5 h",
        "2.5 days",
    ]
    f = Forecast(0, None, LEAK, 112, 3.5 * 3600, CAP, "cap", GiB, 5)
    assert forecast_text(f) == "at this rate, out of memory in about 112 cells (about 3.5 h)"
    from dataclasses import replace

    assert forecast_text(replace(f, cells_left=1, seconds_left=None)) == (
        "at this rate, out of memory in about 1 cell"
    )
    assert forecast_text(replace(f, cells_left=0)) == "at this rate, out of memory in the next cell"


# -- a real shell, the counting backend -------------------------------------------------------
@pytest.fixture
def counted(ip, monkeypatch):
    monkeypatch.setattr(counting, "_state", counting._State())  # this test's own allocator
    current().collector.backend = counting.backend()
    ip.user_ns["counting"] = counting
    ip.run_cell("counting.allocate(1 << 30)")  # 1 GiB before the loop
    yield ip
    run(ip, "%gpumem auto off")
    ip.user_ns.pop("rep", None)


def lines_of(ip, code: str) -> list[str]:
    _, texts, _ = run(ip, code)
    return texts


def test_a_shell_whose_cells_leak_says_the_exact_cells_left(counted):
    ip = counted
    run(ip, "%gpumem limit 8GiB")
    cap = counting._state.fractions[0] * counting.TOTAL
    assert cap == CAP
    run(ip, "%gpumem auto on")
    outputs = []
    for _ in range(5):
        (line,) = lines_of(ip, f"counting.allocate({LEAK})")
        outputs.append(line)
    assert all("at this rate" not in line for line in outputs[:2])  # two cells: too few
    for i, line in enumerate(outputs[2:], start=3):
        allocated = GiB + i * LEAK
        assert line.endswith(
            f" | at this rate, out of memory in about {(CAP - allocated) // LEAK} cells (about 1 s)"
        ), line
    run(ip, "%gpumem auto off")
    (text,) = lines_of(ip, f"%%gpumem -o rep\ncounting.allocate({LEAK})")
    allocated = GiB + 6 * LEAK
    left = (CAP - allocated) // LEAK
    assert (
        f"  forecast cuda:0: at this rate, out of memory in about {left} cells (about 1 s): "
        f"+64.00 MiB a cell over the last 6 cells (1.38 GiB allocated), against the cap of 8.00 GiB"
    ) in text.splitlines()
    rep = ip.user_ns["rep"]
    (f,) = rep.forecasts
    assert (f.cells_left, f.bytes_per_cell, f.limit, f.limit_kind) == (left, LEAK, CAP, "cap")
    assert f.seconds_left is not None and f.seconds_left >= 0
    html = cell_report_html(rep)
    assert 'class="jp-GpuMem-forecast"' in html and "var(--jp-warn-color0" in html
    assert f"out of memory in about {left} cells" in html
    # the panel's cell marker carries it, as the schema says
    marker = to_protocol(rep)
    S = schema()
    jsonschema.validate(marker, {**S, "$ref": "#/$defs/cell_marker"})
    assert marker["forecasts"][0]["cells_left"] == left
    assert marker["forecasts"][0]["limit_kind"] == "cap"


def test_a_flat_loop_gets_no_forecast(counted):
    ip = counted
    run(ip, "%gpumem limit 8GiB")
    run(ip, "%gpumem auto on")
    for _ in range(6):
        (line,) = lines_of(ip, f"counting.allocate({LEAK}); counting.free({LEAK})")
        assert "at this rate" not in line
    run(ip, "%gpumem auto off")
    (text,) = lines_of(ip, f"%%gpumem -o rep\ncounting.allocate({LEAK}); counting.free({LEAK})")
    assert "forecast" not in text and ip.user_ns["rep"].forecasts == ()
    assert "forecasts" not in to_protocol(ip.user_ns["rep"])


def test_without_a_cap_the_forecast_is_against_the_devices_free_memory(counted):
    ip = counted
    run(ip, "%gpumem auto on")
    step = 4 * GiB
    for _ in range(3):
        (line,) = lines_of(ip, f"counting.allocate({step})")
    allocated = GiB + 3 * step
    # the counting device: 80 GiB, this process's reserved used
    assert line.endswith(
        f"out of memory in about {(counting.TOTAL - allocated) // step} cells (about 1 s)"
    ), line
    run(ip, "%gpumem auto off")
    rep = current().last_report
    (f,) = rep.forecasts
    assert (f.limit, f.limit_kind) == (counting.TOTAL, "device")
    assert "reserved + the device's free memory" in cell_report_text(rep)


def test_the_forecast_costs_microseconds_a_cell(counted):
    """The added cost of a measured cell: the forecast after a cell that grew (the fit),
    and after one that did not (the check of its row)."""
    session = current()
    ip = counted
    run(ip, "%gpumem limit 8GiB")
    for _ in range(WINDOW):
        run(ip, f"%%gpumem -q\ncounting.allocate({LEAK})")
    grew = session.last_report
    assert grew.forecasts
    n = 2000
    per_cell = timeit.timeit(lambda: session._forecast(grew), number=n) / n
    assert per_cell < 100e-6, per_cell  # tens of microseconds on a slow CI machine at most
    run(ip, f"%%gpumem -q\ncounting.allocate({LEAK}); counting.free({LEAK})")
    flat = session.last_report
    assert flat.forecasts == ()
    flat_cost = timeit.timeit(lambda: session._forecast(flat), number=n) / n
    assert flat_cost < 100e-6, flat_cost
    print(f"forecast per cell: {per_cell * 1e6:.1f} us (grew), {flat_cost * 1e6:.1f} us (flat)")
    # the line of the compact mode is made from the same record
    assert "at this rate" in compact_line(grew)


# A worker that leaks one step each time a cell asks, then waits until the kernel has its
# report (it sends at most every 0.25 s): each measured cell sees exactly one step.
START_LEAKER = """\
import multiprocessing as mp, os, time
from jupyter_gpumem.collectors import workers as _workers
def _leaker(conn):
    os.environ["RANK"] = "1"
    while True:
        step = conn.recv()
        if step is None:
            break
        counting.allocate(step, device=0)
        conn.send("ok")
_parent, _child = mp.Pipe()
_w = mp.get_context("fork").Process(target=_leaker, args=(_child,), daemon=True)
_w.start()
"""

STEP = """\
_parent.send({step}); _parent.recv()
_t = time.monotonic()
while time.monotonic() - _t < 20 and not any(
    d.allocated >= {target} for w in _workers.live() if w.pid == _w.pid for d in w.devices
):
    time.sleep(0.02)
"""


def test_a_worker_that_leaks_per_step_gets_its_forecast(counted, monkeypatch):
    monkeypatch.setenv("JUPYTER_GPUMEM_BACKEND", "jupyter_gpumem.testing.counting:backend")
    ip = counted
    step = GiB
    run(ip, "%gpumem auto on")
    try:
        run(ip, START_LEAKER)
        pid = ip.user_ns["_w"].pid
        lines = [lines_of(ip, STEP.format(step=step, target=step * k))[0] for k in range(1, 5)]
    finally:
        ip.user_ns["_parent"].send(None)
        ip.user_ns["_w"].join(10)
        run(ip, "%gpumem auto off")
    label = f"rank 1 (pid {pid})"
    assert all("at this rate" not in line for line in lines[:2]), lines
    # the worker's reserved (its own) plus its device's free memory as the kernel reads it:
    # 80 GiB, of which the kernel's own 1 GiB is used (the counting backend's device does
    # not count the worker's memory as used: the room left stays 79 GiB)
    for line in lines[2:]:
        left = (counting.TOTAL - GiB) // step
        assert f"| {label} cuda:0: at this rate, out of memory in about {left} cells" in line, line
    (f,) = current().last_report.forecasts
    assert (f.worker, f.device, f.bytes_per_cell, f.limit_kind) == (label, 0, step, "device")
    assert f.limit == 4 * step + counting.TOTAL - GiB
    assert f"forecast {label} cuda:0: at this rate" in cell_report_text(current().last_report)


def test_a_workers_device_read_from_nvml_when_the_kernel_has_no_reading(ip):
    """The session's fallback for a worker's device (the kernel has no context there): NVML's
    total and used of the device of the same index, through the backend's NVML session."""
    from types import SimpleNamespace

    session = current()
    nvml = SimpleNamespace(
        nvml_index=lambda i: {0: 3}.get(i),
        read=lambda i, with_process: (
            SimpleNamespace(name="NVIDIA H100 80GB HBM3", total=80 * GiB, used=9 * GiB)
            if i == 3
            else None
        ),
    )
    backend = session.collector.backend
    session.collector.backend = SimpleNamespace(nvml=nvml)  # type: ignore[assignment]
    try:
        assert session._device_room(0, "NVIDIA H100 80GB HBM3") == (80 * GiB, 9 * GiB)
        assert session._device_room(1, "NVIDIA H100 80GB HBM3") is None  # not visible
        assert session._device_room(0, "Counting GPU") is None  # another device
    finally:
        session.collector.backend = backend


# -- growth that accelerates; forecasts too far ahead to mean anything ------------------
def test_memory_that_doubles_each_cell_gets_a_geometric_forecast():
    pts = [Point(i, 30.0 * i, MiB << i) for i in range(10)]  # 1 MiB .. 512 MiB
    f = forecast(pts, CAP, "cap")
    assert f is not None
    # 512 MiB -> 1, 2, 4, 8 GiB: four more cells fit under 8 GiB, the fifth does not
    assert (f.cells_left, f.seconds_left, f.factor) == (4, 120.0, pytest.approx(2.0))
    assert f.bytes_per_cell == 512 * MiB  # what the next cell would add
    assert forecast_line(f) == (
        "forecast cuda:0: at this rate, out of memory in about 4 cells (about 2 min): "
        "×2.00 a cell over the last 10 cells (512.00 MiB allocated), against the cap of 8.00 GiB"
    )


def test_growth_of_twenty_percent_a_cell_forecasts_the_cells_the_series_reaches():
    pts = [Point(i, 30.0 * i, round(GiB * 1.2**i)) for i in range(10)]
    limit = 80 * GiB
    truth = max(k for k in range(1000) if GiB * 1.2 ** (9 + k) <= limit)
    f = forecast(pts, limit, "device")
    assert f is not None and truth == 15
    assert (f.cells_left, f.factor) == (truth, pytest.approx(1.2))


def test_a_linear_leak_stays_linear():
    # a line fits it exactly: no factor, the exact slope (a geometric fit is worse)
    f = forecast(leak_points(10), CAP, "cap")
    assert f is not None and (f.factor, f.bytes_per_cell) == (None, LEAK)


def test_a_forecast_beyond_the_horizon_says_nothing():
    # 1 MiB growing 0.1 MiB a cell against 80 GiB: 819,181 cells (284 days) away
    tiny = [Point(i, 30.0 * i, MiB + i * MiB // 10) for i in range(10)]
    assert forecast(tiny, 80 * GiB, "device") is None
    # within the cells but cells a day apart: 125 days away
    daily = leak_points(10, every=86400.0)
    assert forecast(daily, CAP, "cap") is None
    # just inside both: a forecast; one cell further: nothing
    step = CAP // (HORIZON_CELLS + 10)
    f = forecast(leak_points(10, start=0, step=step, every=1.0), CAP, "cap")
    assert f is not None and f.cells_left == (CAP - 10 * step) // step == HORIZON_CELLS
    slower = CAP // (HORIZON_CELLS + 11)
    assert (CAP - 10 * slower) // slower == HORIZON_CELLS + 1
    assert forecast(leak_points(10, start=0, step=slower, every=1.0), CAP, "cap") is None
    assert (HORIZON_CELLS, HORIZON_SECONDS) == (10_000, 7 * 86400)
    # 102 cells left: at 1/103 of the horizon a cell, a forecast; at 1/101, nothing
    f = forecast(leak_points(10, every=HORIZON_SECONDS / 103), CAP, "cap")
    assert f is not None and f.cells_left == 102
    assert f.seconds_left == pytest.approx(HORIZON_SECONDS * 102 / 103)
    assert forecast(leak_points(10, every=HORIZON_SECONDS / 101), CAP, "cap") is None
