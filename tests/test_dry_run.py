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
from jupyter_gpumem._ipython.cell_source import CellSource
from jupyter_gpumem.analysis.targets import parse_target
from jupyter_gpumem.collectors.dry_run.run import Alloc, Free
from jupyter_gpumem.collectors.dry_run.state import HELD
from jupyter_gpumem.core.dry_run import OUTSIDE, outside_for, predict
from jupyter_gpumem.model import DryRun, DryRunCheck, DryRunDevice
from jupyter_gpumem.reporters.dry_run import dry_run_html, dry_run_text, dry_scan_html

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
    assert outside_for(h200, (800 * MiB, "NVIDIA H200"))[0] == 800 * MiB  # this GPU
    assert outside_for(h200, None) == OUTSIDE["h200"]
    t4 = parse_target("T4")
    figure, source = outside_for(t4, (700 * MiB, "NVIDIA H200"))  # another card
    assert figure == OUTSIDE["h100-80gb"][0] and "not measured" in source
    assert outside_for(None, (800 * MiB, "NVIDIA H200"))[0] == 800 * MiB


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


def test_check_puts_the_measured_categories_beside_the_predicted_ones():
    from dataclasses import replace

    from jupyter_gpumem.model import Breakdown, CategoryShare

    def breakdown(phase, **parts):
        cats = tuple(CategoryShare(k.replace("_", " "), v, 1) for k, v in parts.items())
        return Breakdown(0, sum(parts.values()), 0, cats, phase, (), None, None, False, 9, 5)

    pred = breakdown("backward", parameters=4 * MiB, activations=8 * MiB)
    real = breakdown("backward", parameters=4 * MiB, activations=10 * MiB, temporaries=MiB)
    r = result(checks=(DryRunCheck(0, 15 * MiB, 20 * MiB, True, "", real),))
    r = replace(r, devices=(replace(r.devices[0], breakdown=pred),))
    text = dry_run_text(r)
    assert "predicted / measured: during the backward / during the backward" in text
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if "MiB" in line}
    assert rows["parameters"] == ["4.00", "MiB", "4.00", "MiB", "+0.0", "%"]
    assert rows["activations"] == ["8.00", "MiB", "10.00", "MiB", "-20.0", "%"]
    assert rows["temporaries"] == ["0", "B", "1.00", "MiB", "-100.0", "%"]


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
        ("--dry-run --scan batch=1,2", "--scan with --dry-run needs a target"),
        ("--dry-run --scan batch=1,2 --fit-in T4 --check", "--check goes with --dry-run of one"),
        ("--dry-run --fit-in 12XB", "--fit-in"),
    ],
)
def test_the_magic_refuses_what_does_not_go_together(loaded, line, message):
    from jupyter_gpumem._ipython import current

    session = current()
    with pytest.raises(UsageError, match=message.replace("(", r"\(")[:40]):
        session.parse_cell_line(line)


def test_a_cpu_only_build_gets_one_line_and_the_cell_changes_nothing(loaded, capsys):
    pytest.importorskip("torch")
    import torch

    if torch.version.cuda is not None:
        pytest.skip("a CUDA build of torch")
    loaded.run_cell("import torch")
    res = loaded.run_cell("%%gpumem --dry-run --fit-in T4\nplanned = torch.empty(10)")
    assert type(res.error_in_exec).__name__ == "UsageError"  # the cell fails
    out = capsys.readouterr().err
    needs = "--dry-run needs torch and a CUDA GPU"
    assert f"{needs}: torch {torch.__version__} is a CPU-only build" in out
    assert "planned" not in loaded.user_ns


def test_without_torch_the_magic_says_to_import_it(loaded, capsys, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    loaded.run_cell("%%gpumem --dry-run\nnever_bound_by_a_dry_run = 1")
    out = capsys.readouterr().err
    assert (
        "--dry-run needs torch and a CUDA GPU: torch was not imported when the cell began: "
        "import torch before the cell" in out
    )
    assert "never_bound_by_a_dry_run" not in loaded.user_ns


def test_the_function_raises_public_errors():
    with pytest.raises(jupyter_gpumem.GpuMemError, match=r"from 1 to 65536.*got 0"):
        jupyter_gpumem.dry_run(lambda: None, world_size=0)
    torch = pytest.importorskip("torch")
    if torch.version.cuda is None:
        with pytest.raises(jupyter_gpumem.NoGpuError, match="CPU-only build"):
            jupyter_gpumem.dry_run(lambda: None)


# -- a scan without running ---------------------------------------------------------------------
def affine(base: int, per: int, limit: int):
    """A predictor whose need is base + per x value, fitting up to ``limit`` bytes; it
    records the values asked for."""
    from jupyter_gpumem.model import DryScanPoint

    asked: list[float] = []

    def at(v: float) -> DryScanPoint:
        asked.append(v)
        need = base + per * int(v)
        return DryScanPoint(v, need, need, need, need <= limit)

    return at, asked


def test_bisection_finds_the_exact_largest_whole_value():
    from jupyter_gpumem.core.dry_scan import search

    at, asked = affine(100 * MiB, 3 * MiB, 1000 * MiB)  # fits up to (900 / 3) = 300
    points, largest, failing, notes = search(at, (8, 16, 32), integer=True)
    assert (largest, failing) == (300, 301)  # 100 + 3 x 300 = 1000 MiB fits, 301 does not
    assert asked[:3] == [8, 16, 32] and 64 in asked and 512 in asked  # doubling to a bracket
    assert len(points) == len(asked) <= 24 and not notes


def test_when_no_value_fits_or_all_fit_it_says_so():
    from jupyter_gpumem.core.dry_scan import search

    at, asked = affine(2000 * MiB, MiB, 1000 * MiB)
    _, largest, failing, _ = search(at, (4, 8), integer=True)
    assert (largest, failing, asked) == (None, 4, [4])
    at, _ = affine(0, 1, 1 << 60)
    _, largest, failing, notes = search(at, (1, 2), integer=True)
    assert failing is None and largest == 2 * 2**12 and "not looked further" in notes[0]


def test_a_value_the_dry_run_cannot_see_through_ends_the_search():
    from jupyter_gpumem.core.dry_scan import search
    from jupyter_gpumem.model import DryScanPoint

    def at(v: float) -> DryScanPoint:
        return DryScanPoint(v, 0, 0, None, None, "In[3] line 2: `.item()` reads a value")

    points, largest, failing, notes = search(at, (8, 16), integer=True)
    assert (len(points), largest, failing) == (1, None, None)
    assert "could not see the whole cell" in notes[0]


def test_the_scan_report_names_the_answer_and_what_the_next_value_needs():
    from jupyter_gpumem.model import DryScan, DryScanPoint
    from jupyter_gpumem.reporters.dry_run import dry_scan_html, dry_scan_text

    s = DryScan(
        name="batch",
        target=parse_target("RTX4090"),
        outside=742 * MiB,
        outside_source="measured",
        points=(
            DryScanPoint(8, MiB, 2 * MiB, 744 * MiB, True),
            DryScanPoint(9, MiB, 30000 * MiB, 30742 * MiB, False),
        ),
        largest=8,
        smallest_failing=9,
        integer=True,
        seconds=1.5,
        execution_count=4,
    )
    text = dry_scan_text(s)
    assert text.startswith("gpumem: scan of cell [4] without running: batch")
    assert (
        "largest batch that fits in GeForce RTX 4090 (24 GB): 24564 MiB: 8 (predicted by 2 dry "
        "runs, nothing ran on the GPU; 9 needs 30.02 GiB)"
    ) in text
    assert "<table" in dry_scan_html(s)


def test_a_scan_without_running_binds_the_name_in_a_copy_and_finds_the_largest(shell):
    """On the CPU's fake storages (a CPU build cannot fake CUDA tensors; the path is the
    same): a cell allocating `n` MiB, a 1 GiB card with 742 MiB beside PyTorch leaves a
    282 MiB cap; a large request takes a segment rounded up to 2 MiB, so 282 fits and 283
    (a 284 MiB segment) does not."""
    pytest.importorskip("torch")
    from jupyter_gpumem.core.dry_scan import dry_scan

    shell.run_cell("import torch\nn = 'mine'")
    body = "x = torch.empty(n << 20, dtype=torch.uint8)\n"
    s = dry_scan(
        CellSource(shell, body), "n", (8, 16, 32), True, parse_target("1GiB"), device_type="cpu"
    )
    assert (s.largest, s.smallest_failing) == (282, 283)
    assert s.outside == OUTSIDE["h100-80gb"][0]
    assert [p.value for p in s.points][:3] == [8, 16, 32]
    assert all(p.fits == (p.value <= 282) for p in s.points)
    assert shell.user_ns["n"] == "mine" and "x" not in shell.user_ns


def test_a_scan_whose_every_value_fits_says_at_least(shell):
    """Every value tried fits, up to 12 doublings past the largest given: the answer is a
    floor, not the largest that fits."""
    pytest.importorskip("torch")
    from jupyter_gpumem.core.dry_scan import dry_scan
    from jupyter_gpumem.reporters.dry_run import dry_scan_text

    shell.run_cell("import torch")
    body = "x = torch.empty(n, dtype=torch.uint8)\n"  # n bytes: a 2 MiB segment at most
    s = dry_scan(
        CellSource(shell, body), "n", (4, 8), True, parse_target("1GiB"), device_type="cpu"
    )
    assert (s.largest, s.smallest_failing) == (8 << 12, None)
    assert s.notes == ("everything up to 32768 fits; not looked further",)
    text = dry_scan_text(s)
    assert (
        "largest n that fits in 1.00 GiB: at least 32768 (predicted by 14 dry runs, nothing ran "
        "on the GPU)"
    ) in text.splitlines(), text
    assert "that fits in 1.00 GiB: at least 32768" in dry_scan_html(s)
    shell.user_ns.pop("x", None)


# -- what libraries hold beside PyTorch --------------------------------------------------------
def test_cudnn_and_nccl_are_added_beside_pytorch_from_the_measured_table():
    from jupyter_gpumem.core.dry_run import LIBRARIES, with_libraries

    base = (742 * MiB, "table")
    cudnn, nccl = LIBRARIES["cudnn"][0], LIBRARIES["nccl"][0]
    assert with_libraries(base, frozenset(), 1, measured=False) == base
    size, why = with_libraries(base, frozenset({"cudnn"}), 1, measured=False)
    assert size == 742 * MiB + cudnn and "cuDNN" in why and "measured on an H200" in why
    # a figure measured in this process already holds what it loaded
    assert with_libraries(base, frozenset({"cudnn"}), 1, measured=True) == base
    # NCCL: only for a job of several processes that ran collectives
    assert with_libraries(base, frozenset({"nccl"}), 1, measured=True) == base
    size, why = with_libraries(base, frozenset({"nccl", "cudnn"}), 2, measured=True)
    assert size == 742 * MiB + nccl and "two H200s" in why


def test_a_convolution_marks_cudnn_as_loaded():
    torch = pytest.importorskip("torch")
    from jupyter_gpumem.collectors.dry_run.run import record

    def run():
        conv = torch.nn.Conv2d(3, 8, 3)
        conv(torch.randn(2, 3, 16, 16)).sum().backward()

    r = record(run, device_type="cpu")
    assert r.error is None and r.libraries == frozenset({"cudnn"})
    assert record(lambda: torch.ones(4) * 2, device_type="cpu").libraries == frozenset()


def test_a_card_target_takes_that_cards_cublas_workspace():
    from jupyter_gpumem.collectors.dry_run.run import OTHER_CARDS, WORKSPACE_TABLE
    from jupyter_gpumem.core.dry_run import workspaces_for

    assert workspaces_for(parse_target("T4")) == OTHER_CARDS  # 7.5: 8,519,680 B
    assert workspaces_for(parse_target("RTX4090")).cublas == 4096 * 1024 * 2 + 16 * 1024 * 8
    assert workspaces_for(parse_target("H100")) == WORKSPACE_TABLE[9]  # 32 MiB
    assert workspaces_for(parse_target("24GiB")) is None  # a size: the GPU here decides
    assert workspaces_for(None) is None


def test_the_docs_card_table_is_the_code_s():
    """docs/planning.md's table of the cards --fit-in knows is core/dry_run.card_table()."""
    import pathlib

    from jupyter_gpumem.core.dry_run import card_table

    docs = (pathlib.Path(__file__).parent.parent / "docs" / "planning.md").read_text()
    rows = card_table()
    assert len(rows) == 9
    for row in rows:
        assert row in docs, row


# -- what the kernel held before the cell -------------------------------------------------------
def held(key, nbytes, device=0):
    return Alloc(key, nbytes, device, 0, 0, HELD, "tensor")


def test_held_tensors_count_from_the_start_and_untouched_ones_only_when_asked():
    # GIVEN 100 MiB of the kernel's tensors the cell used, then 50 MiB the cell makes; and
    # 30 MiB the kernel holds that the cell never touched
    events = [held(1, 100 * MiB), alloc(2, 50 * MiB), Free(2)]
    untouched = {0: 30 * MiB}
    (d,), _, _ = predict(events, target=None, outside=(0, ""), conf="", untouched=untouched)
    # THEN the peak is held plus the cell's own; the untouched bytes are listed, not counted
    assert (d.peak_allocated, d.held, d.untouched) == (150 * MiB, 100 * MiB, 30 * MiB)
    assert d.requests == 1 and not d.untouched_counted
    (d,), _, _ = predict(
        events, target=None, outside=(0, ""), conf="", untouched=untouched, count_untouched=True
    )
    assert d.peak_allocated == 180 * MiB and d.untouched_counted and d.requests == 1


def test_a_card_is_judged_with_what_the_cell_holds_before_it_starts():
    # 7 GiB of the cell's own fit a 8 GiB target beside 742 MiB; 1 GiB held on top does not
    own = [alloc(2, 7 * 1024 * MiB)]
    target, outside = parse_target("8GiB"), (742 * MiB, "table")
    _, fits, _ = predict(own, target=target, outside=outside, conf="")
    assert fits is True
    _, fits, headroom = predict(
        [held(1, 1024 * MiB), *own], target=target, outside=outside, conf=""
    )
    assert fits is False and headroom is not None and headroom < 0


def test_the_report_says_what_was_held_and_what_was_not_counted():
    from dataclasses import replace

    d = DryRunDevice(0, 600 * MiB, 640 * MiB, 0, 3, 1, held=500 * MiB, untouched=200 * MiB)
    r = result(devices=(d,), held_by=(("gpt's parameters", 400 * MiB), ("opt's state", 100 * MiB)))
    text = dry_run_text(r)
    assert (
        "held before the cell on cuda:0: 500.00 MiB (gpt's parameters 400.00 MiB, opt's state "
        "100.00 MiB)" in text
    )
    assert "the cell's own peak: 100.00 MiB allocated above that" in text
    assert "not counted: the kernel holds 200.00 MiB more on cuda:0" in text
    assert "--count-untouched" in text
    assert "with what it uses of the kernel's tensors (500.00 MiB)" in text
    counted = dry_run_text(result(devices=(replace(d, untouched_counted=True),)))
    assert "counted too (--count-untouched): 200.00 MiB more" in counted
    # --check compares above the cell's start: the kernel already holds what the cell uses
    checked = dry_run_text(
        result(devices=(d,), checks=(DryRunCheck(0, 100 * MiB, 140 * MiB, True),))
    )
    assert (
        "above the cell's start: peak allocated 100.00 MiB measured, 100.00 MiB predicted"
        in checked
    )


def test_outside_measured_before_cublas_loaded_takes_the_tables_larger_figure():
    h200 = parse_target("H200")
    size, source = outside_for(h200, (500 * MiB, "NVIDIA H200"))
    assert size == OUTSIDE["h200"][0] and "before cuBLAS was loaded" in source
    assert source.startswith("measured in this process")
    assert outside_for(h200, (900 * MiB, "NVIDIA H200"))[0] == 900 * MiB


def test_what_the_run_could_not_size_makes_the_need_a_lower_bound_and_a_scan_an_upper_one():
    from jupyter_gpumem.model import DryScan, DryScanPoint
    from jupyter_gpumem.reporters.dry_run import dry_scan_text

    ws = "cuDNN's workspace for convolutions (it depends on the algorithm picked)"
    text = dry_run_text(result(unseen=(ws,)))
    assert f"a lower bound: not seen: {ws}" in text.splitlines()[-1]
    assert "lower bound" not in dry_run_text(result())
    point = DryScanPoint(8, MiB, MiB, 2 * MiB, True)
    scan = DryScan("batch", parse_target("T4"), 0, "", (point,), 8, 9, True, 1.0)
    assert "largest batch that fits in Tesla T4 (16 GB): 15360 MiB: 8 (" in dry_scan_text(scan)
    from dataclasses import replace

    upper = dry_scan_text(replace(scan, unseen=(ws,)))
    assert "largest batch that fits in Tesla T4 (16 GB): 15360 MiB: at most 8" in upper
    assert ws in upper


def test_the_progress_line_is_one_display_updated_and_closed(shell, capsys):
    from jupyter_gpumem._ipython.dry_run_cell import Progress

    quiet = Progress()
    quiet.done(0.5)  # a short run shows nothing
    assert capsys.readouterr().out == ""
    p = Progress()
    p.show(2048, "In[7] line 3", 2.4)
    p.scan("batch=16", 4096, None, 3.6)
    p.done(4.2)
    out = capsys.readouterr().out
    assert "gpumem: dry run: 2 s, 2,048 ops so far, at In[7] line 3" in out
    assert "gpumem: dry run batch=16: 4 s, 4,096 ops so far" in out
    assert "gpumem: dry run done in 4.2 s" in out
