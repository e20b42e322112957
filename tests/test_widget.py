"""%gpumem panel: the ipywidgets panel for frontends without the JupyterLab extension."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from jupyter_gpumem._ipython import current
from jupyter_gpumem.testing.replay import ReplayBackend
from jupyter_gpumem.units import format_bytes
from jupyter_gpumem.widget import GpuMemWidget
from tests.conftest import run
from tests.fakes import FIXTURES, RECORDED, ScriptedBackend, scenario

LAB = Path(__file__).parent.parent / "labextension" / "src"


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
    meta = RECORDED["meta"]
    assert f"replay: readings recorded on an {meta['device']} with torch {meta['torch']}" in html
    frame0 = RECORDED["timeline"][0]["devices"][0]["memory_stats"]
    for figure, key in (("allocated", "allocated_bytes"), ("reserved", "reserved_bytes")):
        shown = format_bytes(frame0[f"{key}.all.current"]).replace(" ", "&nbsp;")
        assert f"{figure} {shown} ·" in html  # a size never wraps inside itself


def test_bars_update_from_the_stream(panel):
    first = panel.bars.value
    panel.clock[0] = 1.0  # the replay moves to frame 10
    time.sleep(0.4)
    assert panel.bars.value != first


def test_buttons(panel):
    # GIVEN the recorded frame: cached free blocks, caching on, no cap
    d = panel.sample["devices"][0]
    cached = d["reserved"] - d["allocated"]
    assert cached > 0
    panel.empty.click()
    assert panel.status.value == f"Released {format_bytes(cached)} to the driver"
    panel.empty.click()
    assert panel.status.value == "Nothing to release: the cache held no free blocks."
    # the caching button says what a click does, and the tooltip what that means
    assert (panel.caching.description, panel.caching.tooltip) == (
        "Caching off",
        (
            "Every allocation goes straight to the driver; allocator figures stop counting "
            "new allocations"
        ),
    )
    panel.caching.click()
    assert panel.status.value == (
        "Caching is off: each allocation goes to the driver; allocator figures no longer "
        "count new allocations."
    )
    assert (panel.caching.description, panel.caching.tooltip) == (
        "Caching on",
        "Let PyTorch keep freed blocks for reuse again",
    )
    assert "caching allocator: OFF" in panel.bars.value
    panel.caching.click()
    assert panel.status.value == "Caching is on: freed blocks stay with PyTorch for reuse."
    assert panel.caching.description == "Caching off"
    panel.reset.click()
    assert panel.status.value == "Peak reset to the current allocation"
    panel.cap.value = "12XB"
    panel.set_cap.click()
    assert "Set cap refused: not a size: '12XB'" in panel.status.value
    assert panel.clear_cap.disabled and panel.clear_cap.tooltip == "No cap is set"
    panel.cap.value = "0.25"
    panel.set_cap.click()
    cap = int(0.25 * d["total"])
    assert panel.status.value == f"Capped cuda:0 at {format_bytes(cap)} (25% of the device)"
    assert f"cap {format_bytes(cap).replace(' ', '&nbsp;')}" in panel.bars.value
    assert not panel.clear_cap.disabled
    assert panel.clear_cap.tooltip == "Remove the cap"
    panel.clear_cap.click()
    assert panel.status.value == "Cap removed on cuda:0"
    panel.cap.value = "0.3"
    panel.set_cap.click()
    panel.cap.value = "off"
    panel.set_cap.click()
    assert panel.status.value == "Cap removed on cuda:0"


def _lab_strings(*files: str) -> set[str]:
    """The strings the JupyterLab panel translates (trans.__('...')) in ``files``."""
    text = "".join((LAB / f).read_text(encoding="utf-8") for f in files)
    return {m.group(2) for m in re.finditer(r"trans\.__\(\s*(['\"])(.*?)\1", text, re.DOTALL)}


@pytest.mark.skipif(not LAB.is_dir(), reason="the JupyterLab panel's sources are not here")
def test_buttons_use_the_jupyterlab_panels_words(panel):
    lab = _lab_strings(
        "views/overview/controls.tsx",
        "views/overview/capControl.tsx",
        "views/overview/deviceSection.tsx",
    ) | _lab_strings("present/messages.ts")
    labels = [panel.empty, panel.caching, panel.reset, panel.set_cap, panel.clear_cap]
    assert [b.description for b in labels] == [
        "Empty cache",
        "Caching off",
        "Reset peak",
        "Set cap",
        "Clear cap",
    ]
    shown = [b.description for b in labels] + [b.tooltip for b in labels[1:]]
    shown += [panel.scale_switch.description, panel.scale_switch.tooltip, "Caching on"]
    shown += ["Let PyTorch keep freed blocks for reuse again", "No cap is set"]
    # what a click says, and why a button is off
    from jupyter_gpumem.reporters.bars import STATE_TITLES

    panel.caching.click()
    shown.append(panel.status.value)
    panel.caching.click()
    shown.append(panel.status.value)
    panel.reset.click()
    shown.append(panel.status.value)
    shown += list(STATE_TITLES.values())
    shown += [why for _, reasons in STATES.values() for why in reasons.values() if why]
    assert [w for w in shown if w not in lab] == []


def _bar_width(html: str, segment: str) -> float:
    m = re.search(rf'data-segment="{segment}"[^>]*?width:([0-9.]+)%', html)
    assert m is not None, segment
    return float(m.group(1)) / 100


def test_the_bar_is_scaled_to_what_the_kernel_holds(panel):
    # GIVEN a recorded sample: under a GiB allocated on a 140 GiB H200
    d = panel.sample["devices"][0]
    html = panel.bars.value
    assert d["allocated"] < 1 << 30 and d["total"] > 100 << 30
    # THEN the full width is the largest of what this kernel holds, with a tenth of room
    held = max(d["reserved"], d["allocated"], d["peak_allocated"], d["process_used"])
    scale = held * 1.1
    assert _bar_width(html, "allocated") == pytest.approx(d["allocated"] / scale, abs=1e-5)
    assert _bar_width(html, "reserved") == pytest.approx(d["reserved"] / scale, abs=1e-5)
    assert _bar_width(html, "allocated") > 0.3  # not the sliver of the device's total
    shown = html.replace("&nbsp;", " ")
    assert f"Scale: 0 to {format_bytes(int(scale))}, fitted to this kernel" in shown
    # other processes' memory beyond the scale is drawn cut, and says so
    if d["device_used"] > scale:
        assert _bar_width(html, "device") == 1.0 and "(beyond the scale)" in html
    # WHEN the scale is switched THEN the bar is the device's, as the line says
    assert panel.scale_switch.description == "Show the device total"
    panel.scale_switch.click()
    html = panel.bars.value
    assert _bar_width(html, "allocated") == pytest.approx(d["allocated"] / d["total"], abs=1e-5)
    assert f"Scale: the device, {format_bytes(d['total'])}" in html.replace("&nbsp;", " ")
    assert panel.scale_switch.description == "Fit to this kernel"
    panel.scale_switch.click()
    assert "fitted to this kernel" in panel.bars.value


# -- when the buttons are off ----------------------------------------------------------
class StateBackend(ScriptedBackend):
    """A kernel in a given state, as its readings say."""

    def actionable(self):
        return None

    def caching_supported(self):
        return None


def _reading(state, message, torch_version, caching, devices=()):
    return {
        "state": state,
        "message": message,
        "torch_version": torch_version,
        "caching": caching,
        "devices": list(devices),
    }


NOT_INITIALISED = "CUDA is not initialised in this kernel"
STATES = {
    "no_torch": (
        _reading("no_torch", "torch is not imported in this kernel", None, None),
        dict.fromkeys(
            ["empty", "caching", "reset", "set_cap", "clear_cap"], "torch is not imported yet"
        ),
    ),
    "cpu_only": (
        _reading("cpu_only", "torch 2.13.0+cpu is a CPU-only build", "2.13.0+cpu", None),
        dict.fromkeys(
            ["empty", "caching", "reset", "set_cap", "clear_cap"], "This torch is a CPU-only build"
        ),
    ),
    "no_gpu": (
        _reading("no_gpu", "no GPU found", "2.11.0+cu130", True),
        dict.fromkeys(["empty", "caching", "reset", "set_cap", "clear_cap"], "No GPU"),
    ),
    "not_initialized": (
        {**scenario("context_created")[0], "state": "not_initialized"},
        {
            "empty": f"{NOT_INITIALISED}: the allocator holds nothing",
            "caching": NOT_INITIALISED,
            "reset": f"{NOT_INITIALISED}: the allocator holds nothing",
            "set_cap": NOT_INITIALISED,
            "clear_cap": NOT_INITIALISED,
        },
    ),
    "ok": (
        scenario("keep_n_bytes")[1],
        {
            "empty": None,
            "caching": None,
            "reset": None,
            "set_cap": None,
            "clear_cap": "No cap is set",
        },
    ),
}


@pytest.mark.parametrize("state", list(STATES))
def test_buttons_are_off_with_the_reason_where_actions_cannot_run(ip, state):
    raw, expected = STATES[state]
    current().collector.backend = StateBackend(raw)
    assert run(ip, "%gpumem panel")[0].success
    w = GpuMemWidget._current[id(current())]
    try:
        for name, reason in expected.items():
            button = getattr(w, name)
            assert button.disabled is (reason is not None), name
            if reason is not None:
                assert button.tooltip == reason, name
        assert w.cap.disabled is w.set_cap.disabled
    finally:
        w.close()


def _all_buttons_off_saying(ip, reason: str) -> None:
    """`%gpumem panel` on the real backend: every action button is off, with ``reason``
    as its tooltip and in bold over the bars."""
    from jupyter_gpumem.collectors.allocator import TorchBackend

    current().collector.backend = TorchBackend()
    assert run(ip, "%gpumem panel")[0].success
    w = GpuMemWidget._current[id(current())]
    try:
        buttons = [w.empty, w.caching, w.reset, w.set_cap, w.clear_cap]
        assert all(b.disabled for b in buttons)
        assert {b.tooltip for b in buttons} == {reason}
        assert f"<b>{reason}</b>" in w.bars.value
    finally:
        w.close()


def test_a_cpu_only_torch_turns_the_buttons_off(ip):
    torch = pytest.importorskip("torch")
    if torch.version.cuda or torch.version.hip:
        pytest.skip("this torch has a GPU allocator")
    _all_buttons_off_saying(ip, "This torch is a CPU-only build")


def test_without_torch_the_buttons_are_off(ip, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    _all_buttons_off_saying(ip, "torch is not imported yet")


def test_the_stream_lives_while_the_extension_is_loaded(panel, monkeypatch):
    import jupyter_gpumem._ipython as front

    panel.stream.lease_s = 0.6  # the panel renews a third of the way through

    def tick(seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            panel.clock[0] += 0.1  # a new recorded frame: a sample every interval
            time.sleep(0.1)

    tick(1.5)
    assert panel.stream.state()["active"]
    for where in (front, front.sessions):  # the extension unloaded
        monkeypatch.setattr(where, "current", lambda: None)
    tick(1.5)
    assert not panel.stream.state()["active"]


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
