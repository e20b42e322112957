"""%gpumem panel: the ipywidgets panel for frontends without the JupyterLab extension."""

from __future__ import annotations

import time

import pytest

from jupyter_gpumem._ipython import current
from jupyter_gpumem.testing.replay import ReplayBackend
from jupyter_gpumem.units import format_bytes
from jupyter_gpumem.widget import GpuMemWidget
from tests.conftest import run
from tests.fakes import FIXTURES, RECORDED


@pytest.fixture
def panel(ip):
    clock = [0.0]
    current().collector.backend = ReplayBackend(str(FIXTURES), clock=lambda: clock[0])
    res, _, _ = run(ip, "%gpumem panel --interval 100")
    assert res.success
    w = GpuMemWidget._current[id(current())]
    w.clock = clock
    yield w
    w.close()


def test_bars_show_recorded_figures(panel):
    html = panel.bars.value
    assert "cuda:0 NVIDIA H200" in html
    assert "replaying recorded samples (test mode)" in html
    frame0 = RECORDED["timeline"][0]["devices"][0]["memory_stats"]
    assert f"allocated {format_bytes(frame0['allocated_bytes.all.current'])} ·" in html
    assert f"reserved {format_bytes(frame0['reserved_bytes.all.current'])} ·" in html


def test_bars_update_from_the_stream(panel):
    first = panel.bars.value
    panel.clock[0] = 1.0  # the replay moves to frame 10
    time.sleep(0.4)
    assert panel.bars.value != first


def test_buttons(panel):
    panel.empty.click()
    assert panel.status.value.startswith("released to the driver: cuda:0 ")
    panel.caching.value = False
    assert panel.status.value == "caching allocator is now off"
    assert panel.caching.description == "Caching off"
    panel.reset.click()
    assert panel.status.value == "peak counters reset"
    panel.cap.value = "12XB"
    panel.set_cap.click()
    assert "not a size: '12XB'" in panel.status.value
    panel.cap.value = "0.25"
    panel.set_cap.click()
    assert panel.status.value.startswith("cap on cuda:0: ")
    assert "cap " in panel.bars.value
    panel.clear_cap.click()
    assert panel.status.value == "cap removed on cuda:0"


def test_second_panel_replaces_the_first(ip, panel):
    run(ip, "%gpumem panel")
    second = GpuMemWidget._current[id(current())]
    assert second is not panel
    assert panel.stream.state()["active"] is False
    second.close()


def test_bars_list_worker_processes(panel, monkeypatch):
    """A forked worker of a measured cell shows under the bars with its own figures."""
    import multiprocessing as mp
    import os

    from jupyter_gpumem.collectors import workers
    from jupyter_gpumem.testing import counting

    monkeypatch.setenv("JUPYTER_GPUMEM_BACKEND", "jupyter_gpumem.testing.counting:backend")

    def worker(r):
        os.environ["RANK"] = str(r)
        counting.allocate(3 << 30, device=1)
        time.sleep(60)

    session = current()
    session.tracker.begin()
    p = mp.get_context("fork").Process(target=worker, args=(2,))
    p.start()
    try:
        session.tracker.end()
        want = f"rank 2 (pid {p.pid}) · cuda:1</b> allocated 3.00 GiB · peak 3.00 GiB"
        deadline = time.monotonic() + 10  # the worker's first report, then the stream's
        while want not in panel.bars.value and time.monotonic() < deadline:
            time.sleep(0.05)
        assert workers.live() and want in panel.bars.value
    finally:
        p.kill()
        p.join()
