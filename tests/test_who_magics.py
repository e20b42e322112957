"""`%gpumem who`, `track` and `release-traceback` without a GPU: a sentence for every state
that has nothing to attribute, a UsageError for bad flags, and never a traceback."""

from __future__ import annotations

import sys

import pytest
from IPython.core.error import UsageError

from tests.conftest import run

torch = pytest.importorskip("torch")


@pytest.fixture
def no_torch(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch")


def test_who_without_torch_says_so(ip, no_torch):
    res, texts, cap = run(ip, "%gpumem who")
    assert res.success and not texts
    assert (
        cap.stdout == "gpumem: torch is not imported in this kernel: PyTorch holds no GPU memory\n"
    )


def test_who_with_a_cpu_only_torch_says_so(ip):
    res, _, cap = run(ip, "%gpumem who --by line")
    assert res.success
    assert (
        f"torch {torch.__version__} is a CPU-only build: PyTorch holds no GPU memory" in cap.stdout
    )


def test_who_api_raises_a_sentence(ip):
    import jupyter_gpumem

    with pytest.raises(jupyter_gpumem.NoGpuError, match="CPU-only build"):
        jupyter_gpumem.who()
    with pytest.raises(ValueError, match="by must be"):
        jupyter_gpumem.who(by="size")


def test_who_api_without_the_extension():
    import jupyter_gpumem

    with pytest.raises(RuntimeError, match="not loaded"):
        jupyter_gpumem.who()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("who --by size", "invalid choice: 'size'"),
        ("who -n 0", "must be at least 1"),
        ("who -n many", "not a whole number"),
        ("who -d 3", "no device 3"),
        ("track maybe", "invalid choice: 'maybe'"),
        ("release-traceback now", "unrecognized arguments"),
    ],
)
def test_bad_flags_are_usage_errors(ip, line, message):
    res, _, _ = run(ip, f"%gpumem {line}")
    assert isinstance(res.error_in_exec, UsageError)
    assert message in str(res.error_in_exec)


def test_track_on_a_cpu_only_torch_is_refused_with_a_reason(ip):
    res, _, _ = run(ip, "%gpumem track on")
    assert isinstance(res.error_in_exec, UsageError)
    assert "CPU-only build: there is no GPU allocator to track" in str(res.error_in_exec)
    res, _, cap = run(ip, "%gpumem track off")
    assert res.success and cap.stdout == "gpumem: allocation tracking was off\n"


def test_track_on_before_torch_waits_for_the_import(ip, no_torch):
    res, _, cap = run(ip, "%gpumem track on")
    assert res.success and "as soon as torch is imported" in cap.stdout
    from jupyter_gpumem._ipython import current

    assert current().who.recording.wanted
    run(ip, "%gpumem track off")
    assert not current().who.recording.wanted


def test_release_traceback_with_nothing_kept(ip):
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    res, _, cap = run(ip, "%gpumem release-traceback")
    assert res.success
    assert "no kept traceback with frames of its own: nothing to release" in cap.stdout


def test_help_names_the_new_commands(ip):
    from jupyter_gpumem._ipython.magics import GpuMemMagics

    doc = GpuMemMagics.gpumem.__doc__
    for text in (
        "%gpumem who",
        "--by variable|line|cell",
        "%gpumem track on|off",
        "%gpumem release-traceback",
    ):
        assert text in doc


def test_segments_with_a_cpu_only_torch_says_so(ip):
    res, _, cap = run(ip, "%gpumem segments")
    assert res.success and "CPU-only build" in cap.stdout


def test_segments_draws_the_largest_200_unless_asked(ip, monkeypatch):
    from jupyter_gpumem._ipython import current

    asked = []
    monkeypatch.setattr(
        current().who,
        "segment_maps",
        lambda device, max_segments: asked.append(max_segments) or [],
    )
    for line in ("%gpumem segments", "%gpumem segments --max 3", "%gpumem segments --all"):
        assert run(ip, line)[0].success
    assert asked == [200, 3, None]
    for bad in ("%gpumem segments --max 0", "%gpumem segments --max x"):
        with pytest.raises(UsageError):
            ip.run_line_magic("gpumem", bad.split(" ", 1)[1])


def test_history_plot_draws_each_measured_cell(ip):
    from jupyter_gpumem._ipython import current
    from tests.fakes import ScriptedBackend, scenario

    before, after, _ = scenario("transient_spike")
    current().collector.backend = ScriptedBackend(before, after)
    counts = [
        ip.run_cell(f"%%gpumem -q\nv = {i}", store_history=True).execution_count for i in range(3)
    ]
    _, _, cap = run(ip, "%gpumem history --plot")
    html = next(o.data["text/html"] for o in cap.outputs)
    text = next(o.data["text/plain"] for o in cap.outputs)
    assert html.count("<circle") == 3 and html.count("<polyline") == 2
    for n in counts:
        assert f">[{n}]</text>" in html
    assert "<script" not in html and "v = 2" in text  # the table stays the text twin
    res, _, _ = run(ip, "%gpumem history --plot -d 3")
    assert res.success
