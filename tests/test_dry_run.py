"""`%%gpumem --dry-run` and `jupyter_gpumem.dry_run`: the plumbing from a dry run's events
to the prediction, the answer against a card, the words, and what the front ends refuse.

The allocator model is checked against real traces in test_caching_allocator.py and the
fake run in test_fake_run.py; the prediction against real runs on the GPU machine
(tests/gpu/test_dry_run_gpu.py)."""

from __future__ import annotations

import sys

import pytest
from IPython.core.error import UsageError

import jupyter_gpumem
from jupyter_gpumem.analysis.targets import parse_target
from jupyter_gpumem.collectors.fake_run import Alloc, Free
from jupyter_gpumem.core.dry_run import OUTSIDE, outside_for, predict
from jupyter_gpumem.model import DryRun, DryRunCheck, DryRunDevice
from jupyter_gpumem.reporters.dry_run import dry_run_html, dry_run_text

MiB = 1 << 20


def alloc(key, nbytes, kind="tensor", device=0):
    return Alloc(key, nbytes, device, 0, 1, "aten.empty.memory_format", kind)


# -- events -> prediction -------------------------------------------------------------------
def test_large_requests_get_segments_of_their_own_size_and_the_peak_is_exact():
    # 100 MiB requests are large: a segment of exactly the request (a multiple of 2 MiB)
    events = [alloc(1, 100 * MiB), alloc(2, 100 * MiB), Free(1), alloc(3, 50 * MiB), Free(2)]
    (d,), fits, headroom = predict(events, target=None, outside=(0, "none"), conf="")
    assert (d.peak_allocated, d.peak_reserved) == (200 * MiB, 200 * MiB)
    assert d.requests == 3 and d.segments == 2  # the 50 MiB block splits the freed segment
    assert fits is None and headroom is None


def test_small_requests_share_a_2_mib_segment_rounded_to_512_bytes():
    events = [alloc(k, 1000) for k in range(10)]
    (d,), _, _ = predict(events, target=None, outside=(0, ""), conf="")
    assert d.peak_allocated == 10 * 1024  # 1000 B -> 1024 B blocks
    assert d.peak_reserved == 2 * MiB and d.segments == 1


def test_workspaces_are_counted_in_the_peaks_and_shown_apart():
    events = [alloc(1, 32 * MiB, "cublas workspace"), alloc(2, 8 * MiB)]
    (d,), _, _ = predict(events, target=None, outside=(0, ""), conf="")
    assert d.workspaces == 32 * MiB
    assert d.peak_allocated == 40 * MiB


def test_a_card_answers_yes_with_room_or_no_with_the_shortfall():
    events = [alloc(1, 4096 * MiB), alloc(2, 4096 * MiB)]
    outside = (742 * MiB, "table")
    t4 = parse_target("T4")  # 15360 MiB
    (d,), fits, headroom = predict(events, target=t4, outside=outside, conf="")
    assert fits is True and d.out_of_memory is None
    assert headroom == 15360 * MiB - 742 * MiB - 8192 * MiB
    small = parse_target("8GiB")
    (d,), fits, headroom = predict(events, target=small, outside=outside, conf="")
    assert fits is False and d.out_of_memory is not None
    assert headroom == -(8192 * MiB - (8192 * MiB - 742 * MiB))  # short by what is beside


def test_near_the_cap_the_allocator_frees_its_cache_before_it_fails():
    """Under a cap the real allocator releases cached segments and retries before it
    raises: a step whose uncapped peak reserved is over the cap can still fit."""
    events = [alloc(1, 300 * MiB), Free(1), alloc(2, 500 * MiB)]
    target = parse_target("1GiB")
    (d,), fits, headroom = predict(events, target=target, outside=(300 * MiB, ""), conf="")
    assert d.peak_reserved == 800 * MiB  # no cap: both segments stay reserved
    assert fits is True  # under the 724 MiB cap the 300 MiB segment is released first
    assert headroom == 724 * MiB - 500 * MiB


def test_the_memory_beside_pytorch_is_measured_here_or_read_from_the_table():
    h200 = parse_target("H200")
    assert outside_for(h200, (700 * MiB, "NVIDIA H200"))[0] == 700 * MiB  # this GPU
    assert outside_for(h200, None) == OUTSIDE["h200"]
    t4 = parse_target("T4")
    figure, source = outside_for(t4, (700 * MiB, "NVIDIA H200"))  # another card
    assert figure == OUTSIDE["h100-80gb"][0] and "not measured" in source
    assert outside_for(None, (700 * MiB, "NVIDIA H200"))[0] == 700 * MiB


# -- the words ------------------------------------------------------------------------------
def result(**kw):
    base = {
        "devices": (DryRunDevice(0, 5 * MiB, 20 * MiB, 0, 3, 1),),
        "outside": 742 * MiB,
        "outside_source": "measured",
        "target": parse_target("T4"),
        "seconds": 0.5,
        "execution_count": 7,
        "fits": True,
        "headroom": 1000 * MiB,
    }
    base.update(kw)
    return DryRun(**base)


def test_the_report_says_predicted_and_answers_the_card():
    text = dry_run_text(result())
    assert text.startswith("gpumem: dry run of cell [7]: predicted, nothing ran on the GPU")
    assert "fits in Tesla T4 (16 GB): 15360 MiB: yes, with 1000.00 MiB to spare" in text
    no = dry_run_text(result(fits=False, headroom=-3 * MiB))
    assert "fits in Tesla T4 (16 GB): 15360 MiB: no, about 3.00 MiB short" in no
    stopped = dry_run_text(result(stopped="In[7] line 2: `.item()` reads a value", fits=None))
    assert "stopped: In[7] line 2" in stopped and ": unknown: the dry run stopped" in stopped
    html = dry_run_html(result())
    assert "predicted, nothing ran on the GPU" in html and "<script" not in html


def test_check_puts_the_measured_peaks_beside_the_predicted_ones():
    r = result(checks=(DryRunCheck(0, 4 * MiB, 20 * MiB, True),))
    text = dry_run_text(r)
    assert "peak allocated 4.00 MiB measured, 5.00 MiB predicted (+25.0 %)" in text
    assert "peak reserved 20.00 MiB measured, 20.00 MiB predicted (+0.0 %)" in text
    r = result(checks=(DryRunCheck(0, 0, 0, False, "it needs 9 GiB, this GPU has 2 GiB"),))
    assert "did not run for real: it needs 9 GiB" in dry_run_text(r)


# -- the front ends ------------------------------------------------------------------------------
@pytest.fixture
def loaded(shell):
    shell.run_line_magic("load_ext", "jupyter_gpumem")
    yield shell
    shell.run_line_magic("unload_ext", "jupyter_gpumem")


@pytest.mark.parametrize(
    "line, message",
    [
        ("--check", "--check goes with --dry-run"),
        ("--dry-run --trace", "--dry-run runs nothing on the GPU; --trace"),
        ("--dry-run --breakdown", "--dry-run runs nothing on the GPU; --breakdown"),
        ("--dry-run --scan batch=1,2", "--dry-run with --scan is not there yet"),
        ("--dry-run --fit-in 12XB", "--fit-in"),
    ],
)
def test_the_magic_refuses_what_does_not_go_together(loaded, line, message):
    from jupyter_gpumem._ipython import current

    magics = current().magics
    with pytest.raises(UsageError, match=message.replace("(", r"\(")[:40]):
        magics.parse_cell_line(line)


def test_a_cpu_only_build_gets_one_line_and_the_cell_changes_nothing(loaded, capsys):
    pytest.importorskip("torch")
    import torch

    if torch.version.cuda is not None:
        pytest.skip("a CUDA build of torch")
    loaded.run_cell("import torch")
    loaded.run_cell("%%gpumem --dry-run --fit-in T4\nplanned = torch.empty(10)")
    out = capsys.readouterr().out
    assert "needs a CUDA build of torch" in out and "CPU-only build" in out
    assert "planned" not in loaded.user_ns


def test_without_torch_the_magic_says_to_import_it(loaded, capsys, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    loaded.run_cell("%%gpumem --dry-run\nnever_bound_by_a_dry_run = 1")
    out = capsys.readouterr().out
    assert "--dry-run needs torch: import torch before the cell" in out
    assert "never_bound_by_a_dry_run" not in loaded.user_ns


def test_the_function_raises_public_errors():
    with pytest.raises(jupyter_gpumem.GpuMemError, match="world_size=2"):
        jupyter_gpumem.dry_run(lambda: None, world_size=2)
    torch = pytest.importorskip("torch")
    if torch.version.cuda is None:
        with pytest.raises(jupyter_gpumem.NoGpuError, match="CPU-only build"):
            jupyter_gpumem.dry_run(lambda: None)
