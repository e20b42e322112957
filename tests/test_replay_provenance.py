"""A replay says so wherever it shows: the record of where the replayed figures were
recorded, read once per backend, carried by every measurement, shown by each view of a
real IPython shell and sent in the protocol's sample; live figures carry none."""

from __future__ import annotations

import json
import sys
import types
from html import escape

import jsonschema
import pytest

from jupyter_gpumem._ipython import current
from jupyter_gpumem.collectors import Collector
from jupyter_gpumem.model import Replay
from jupyter_gpumem.protocol import schema
from jupyter_gpumem.protocol.convert import to_protocol
from jupyter_gpumem.testing import counting
from jupyter_gpumem.testing.replay import ReplayBackend, env, recording_of
from tests.conftest import run
from tests.fakes import FIXTURES

META = json.loads(FIXTURES.read_text())["meta"]
S = schema()


def check(instance, ref):
    jsonschema.validate(instance, {**S, "$ref": f"#/$defs/{ref}"})


@pytest.fixture
def kernel_torch(monkeypatch):
    """This kernel has imported a torch of its own (not the recording's)."""
    fake = types.ModuleType("torch")
    fake.__version__ = "9.9.9+here"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake)
    return fake.__version__


@pytest.fixture
def replayed(shell, monkeypatch):
    """The extension loaded in a real shell whose backend the environment names: the
    replay of the recorded readings, as `jupyter-gpumem demo` starts its kernels."""
    for k, v in env(str(FIXTURES)).items():
        monkeypatch.setenv(k, v)
    shell.run_line_magic("load_ext", "jupyter_gpumem")
    assert isinstance(current().collector.backend, ReplayBackend)
    yield shell
    shell.run_line_magic("unload_ext", "jupyter_gpumem")


def displays(shell, code):
    """Each display of a cell as (text/plain, text/html)."""
    from IPython.utils.capture import capture_output

    with capture_output() as cap:
        res = shell.run_cell(code)
    assert res.success, res.error_in_exec
    return [(o.data.get("text/plain", ""), o.data.get("text/html", "")) for o in cap.outputs]


# -- the record ----------------------------------------------------------------------------
def test_the_replay_names_the_recordings_gpu_torch_and_day():
    backend = ReplayBackend(str(FIXTURES))
    assert backend.replay() == Replay(META["device"], META["torch"], META["recorded"])
    assert backend.read().message == ""  # the state is ok: nothing to explain


def test_a_recording_without_meta_is_named_by_its_first_reading():
    data = json.loads(FIXTURES.read_text())
    del data["meta"]
    first = data["timeline"][0]
    assert recording_of(data) == Replay(first["devices"][0]["name"], first["torch_version"], None)


def test_the_sentence_names_the_recording_and_this_kernels_torch(kernel_torch):
    from jupyter_gpumem.reporters.replay import replay_sentence

    r = Replay("NVIDIA H200", "2.11.0+cu130", "2026-11-21")
    assert replay_sentence(r) == (
        "replay: readings recorded on an NVIDIA H200 with torch 2.11.0+cu130 on 2026-11-21 "
        "are replayed; nothing here is measured on this machine (this kernel: torch "
        f"{kernel_torch})"
    )
    assert replay_sentence(Replay("Tesla T4", None)).startswith(
        "replay: readings recorded on a Tesla T4 are replayed;"
    )


def kernel_torch_now():
    from jupyter_gpumem.collectors.torch_build import torch_version

    return torch_version()


def test_the_sentence_never_imports_torch(monkeypatch):
    from jupyter_gpumem.reporters.replay import replay_sentence

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    text = replay_sentence(Replay("NVIDIA H200", "2.11.0+cu130"))
    assert text.endswith("nothing here is measured on this machine")
    assert "torch" not in sys.modules


# -- the collector -------------------------------------------------------------------------
class Asked(ReplayBackend):
    def __init__(self) -> None:
        super().__init__(str(FIXTURES))
        self.asked = 0

    def replay(self) -> Replay:
        self.asked += 1
        return super().replay()


def test_the_collector_asks_once_per_backend_and_every_measurement_carries_it():
    backend = Asked()
    c = Collector(backend)
    readings = [c.measure(), c.measure(False, False), c.measure(True, False), c.measure()]
    assert backend.asked == 1
    assert {m.replay for m in readings} == {backend.replay()}
    assert c.replay is readings[0].replay and backend.asked == 2  # the line above asked
    c.backend = counting.backend()  # a new backend is asked again
    assert c.measure().replay is None and c.replay is None
    c.backend = second = Asked()
    assert c.replay == second.replay() and c.measure().replay is not None


def test_a_backend_without_the_method_measures():
    class Old(counting.CountingBackend):
        replay = None  # plugged in by import path, written before the method existed

    assert Collector(Old()).measure().replay is None  # type: ignore[arg-type]


# -- the protocol ----------------------------------------------------------------------------
def test_the_sample_carries_the_replay_only_when_replayed(kernel_torch):
    sample = to_protocol(Collector(ReplayBackend(str(FIXTURES))).measure())
    check(sample, "sample")
    assert sample["replay"] == {
        "gpu": META["device"],
        "torch_version": META["torch"],
        "recorded": META["recorded"],
        "description": Replay(META["device"], META["torch"], META["recorded"]).describe(
            kernel_torch
        ),
    }
    assert f"(this kernel: torch {kernel_torch})" in sample["replay"]["description"]
    live = to_protocol(Collector(counting.backend()).measure())
    check(live, "sample")
    assert "replay" not in live


# -- the views, in a real shell ---------------------------------------------------------------
def test_each_cell_report_says_it_is_a_replay(replayed, kernel_torch):
    ((text, html),) = displays(replayed, "%%gpumem\nx = 1")
    lines = text.splitlines()
    assert lines[0].startswith("gpumem: cell [")
    line = (
        f"  replay: readings recorded on an {META['device']} with torch {META['torch']} on "
        f"{META['recorded']} are replayed; nothing here is measured on this machine "
        f"(this kernel: torch {kernel_torch})"
    )
    assert lines[1] == line  # first, under the header
    assert sum("replay:" in x for x in lines) == 1
    banner = '<div class="jp-GpuMem-replay" style="'
    assert html.count(banner) == 1
    start = html.index(banner)
    assert escape(line.strip()) in html[start : html.index("</div>", start)]
    assert start == html.index("</div>") + len("</div>")  # under the header, above the rest


def test_auto_mode_marks_its_line_and_now_and_history_say_it(replayed):
    run(replayed, "%gpumem auto on")
    ((text, html),) = displays(replayed, "k = 1")
    assert text.startswith("gpumem [") and text.endswith(" [replay]")
    assert escape(text) in html
    run(replayed, "%gpumem auto off")
    sentence = current().collector.replay.describe(kernel_torch_now())
    ((text, html),) = displays(replayed, "%gpumem")
    assert text.splitlines()[0] == sentence
    assert 'class="jp-GpuMem-replay"' in html and escape(sentence) in html
    ((text, html),) = displays(replayed, "%gpumem history")
    assert text.splitlines()[0] == sentence and text.splitlines()[1].startswith("cell")
    assert escape(sentence) in html
    ((text, html),) = displays(replayed, "%gpumem history --plot")
    assert html.startswith('<div class="jp-GpuMem-replay"') and escape(sentence) in html


def test_live_figures_say_nothing_of_a_replay(ip, monkeypatch):
    monkeypatch.setattr(counting, "_state", counting._State())  # this test's own allocator
    current().collector.backend = counting.backend()
    ip.user_ns["counting"] = counting
    outputs = displays(ip, "%%gpumem\ncounting.allocate(1 << 20)")
    run(ip, "%gpumem auto on")
    outputs += displays(ip, "counting.free(1 << 20)")
    run(ip, "%gpumem auto off")
    outputs += displays(ip, "%gpumem")
    outputs += displays(ip, "%gpumem history")
    assert len(outputs) == 4 and "cuda:0" in outputs[0][0] and "cuda:0" in outputs[1][0]
    for text, html in outputs:
        assert "replay" not in text and "replay" not in html


def test_who_and_the_segment_map_say_they_are_replayed(replayed):
    """`who` and the segment map answer from the recording (its namespace and snapshot):
    each says so above its rows."""
    sentence = current().collector.replay.describe(kernel_torch_now())
    meta = json.loads(FIXTURES.read_text())["meta"]
    assert meta["device"] in sentence
    for command in ("%gpumem who", "%gpumem segments"):
        ((text, html),) = displays(replayed, command)
        assert text.splitlines()[0] == sentence, command
        assert html.startswith('<div class="jp-GpuMem-replay"') and escape(sentence) in html
        assert "cuda:0" in text  # the recorded device's rows follow
