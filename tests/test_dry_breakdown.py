"""What a dry run's peak would be made of (analysis/dry_breakdown.py): on hand-written
records first (pure: no torch), then on dry runs of steps whose every byte is known from
the shapes (CPU storages stand for one GPU's), then in the report.

Sizes of the step used throughout: Linear(1024, 4096) + ReLU + Linear(4096, 1024), float32,
batch 256 (all multiples of 512 B, so rounding adds nothing):

    parameters P = 4096*1024*4 + 4096*4 + 1024*4096*4 + 1024*4 = 33,574,912 B
    x = 256*1024*4 = 1 MiB (the input), h = relu(x W1^T + b1): 256*4096*4 = 4 MiB
"""

from __future__ import annotations

import pytest

from jupyter_gpumem._ipython.cell_source import CellSource
from jupyter_gpumem.analysis.caching import Alloc, AllocatorConfig, Free, replay
from jupyter_gpumem.analysis.dry_breakdown import PREDICTED, analyze, is_predicted
from jupyter_gpumem.collectors.dry_run import run as fr
from jupyter_gpumem.model import CATEGORIES

KiB, MiB = 1 << 10, 1 << 20
P = 4096 * 1024 * 4 + 4096 * 4 + 1024 * 4096 * 4 + 1024 * 4  # 33,574,912 B
X = 256 * 1024 * 4  # the input: 1 MiB
H = 256 * 4096 * 4  # one hidden activation: 4 MiB


def a(key, nbytes, module=-1, kind="tensor", device=0):
    return fr.Alloc(key, nbytes, device, 0, 0, "aten.empty.memory_format", kind, module)


def peak_of(events, device=0, conf=""):
    """What core/dry_run.predict reports as the device's peak allocated."""
    requests = []
    mine = set()
    for e in events:
        if isinstance(e, fr.Alloc) and e.device == device:
            mine.add(e.key)
            requests.append(Alloc(e.key, e.nbytes, e.stream))
        elif isinstance(e, fr.Free) and e.key in mine:
            requests.append(Free(e.key))
    return replay(requests, AllocatorConfig.from_conf(conf)).peak_allocated


def total(b):
    return sum(c.bytes for c in b.categories)


# -- hand-written records ------------------------------------------------------------------
def test_each_block_alive_at_the_peak_counts_once_in_its_first_category():
    # GIVEN a parameter (also saved by autograd), a gradient, an activation saved inside
    # "net.0", a temporary made inside "net.1", a cuBLAS workspace and a tensor that died
    events = [
        a(1, 3000),  # parameter: 3072 B block
        a(2, 1000, module=1),  # saved by net.0 -> activation
        a(3, 5000, module=2),  # made in net.1, saved by nobody -> temporary (5120)
        a(4, 32 * MiB, kind="cublas workspace"),
        a(5, 512),  # dies before the peak
        fr.Free(5),
        a(6, 2048),  # gradient
        fr.Free(3),
    ]
    seen = fr.Seen(
        marks=[fr.PhaseMark(1, "forward"), fr.PhaseMark(4, "other"), fr.PhaseMark(5, "backward")],
        claims={1: "parameters", 6: "gradients"},
        saved=[fr.Saved(1, 2, 1), fr.Saved(2, 2, 1)],
        modules=["net", "net.0", "net.1"],
    )
    # WHEN the breakdown is made
    b = analyze(0, events, seen, config=AllocatorConfig())
    # THEN the peak is the allocator model's, and the categories add up to it
    assert b.peak == peak_of(events) == 3072 + 1024 + 5120 + 32 * MiB + 2048
    assert total(b) == b.peak
    assert b.bytes_of("parameters") == 3072  # saved too, but a parameter first
    assert b.bytes_of("activations") == 1024
    assert b.bytes_of("library workspaces") == 32 * MiB
    assert b.bytes_of("temporaries") == 5120
    assert b.bytes_of("gradients") == 2048
    assert b.phase == "backward"  # the peak is event 6, after the backward mark at 5
    assert [(m.module, m.activations, m.temporaries) for m in b.modules] == [
        ("net.1", 0, 5120),
        ("net.0", 1024, 0),
    ]
    # and it says it is a prediction, never exact
    assert b.exact is False and b.note == PREDICTED and is_predicted(b)
    assert b.counter_peak is None and b.base == 0
    assert b.events == 8 and b.peak_event == 7  # the 7th request (1-based) reached it


def test_an_activation_is_let_go_when_its_backward_pass_is_over():
    # GIVEN an input saved in the forward pass, its backward pass done, then a peak later
    events = [a(1, 4096), a(2, 4096), fr.Free(2), a(3, 8192)]
    seen = fr.Seen(
        marks=[
            fr.PhaseMark(1, "forward"),
            fr.PhaseMark(2, "backward"),
            fr.PhaseMark(3, "backward done"),
            fr.PhaseMark(3, "optimizer step"),
        ],
        saved=[fr.Saved(1, 1, 0)],
        modules=["lin"],
    )
    b = analyze(0, events, seen)
    # THEN at the peak (in the optimizer step) the input is a temporary, not an activation
    assert b.peak == 4096 + 8192 == total(b)
    assert b.bytes_of("activations") == 0 and b.bytes_of("temporaries") == 4096 + 8192
    assert b.phase == "optimizer step"
    # and before that backward pass was over it was one: a peak inside the backward pass
    events = [a(1, 4096), a(2, 4096), a(3, 8192), fr.Free(2), fr.Free(3)]
    seen.marks[2:] = [fr.PhaseMark(4, "backward done")]
    b = analyze(0, events, seen)
    assert b.bytes_of("activations") == 4096 and b.phase == "backward"
    assert b.modules[0].module == "(outside any module)"  # the temporaries: no module ran
    assert ("lin", 4096, 0) in [(m.module, m.activations, m.temporaries) for m in b.modules]


def test_a_whole_cached_block_handed_out_is_block_slack_for_a_claimed_tensor():
    # GIVEN a 3 MiB block freed, then a 2.5 MiB request: the rest (0.5 MiB) is too small to
    # split off in the large pool, so the allocator hands out the whole 3 MiB block; then
    # 4 KiB more make the peak
    events = [a(1, 3 * MiB), a(2, 2 * MiB), fr.Free(1), a(3, 5 * MiB // 2), a(4, 4 * KiB)]
    for claimed, slack in ((True, MiB // 2), (False, 0)):
        seen = fr.Seen(claims={3: "parameters"} if claimed else {})
        b = analyze(0, events, seen)
        assert b.peak == peak_of(events) == 5 * MiB + 4 * KiB == total(b)
        assert b.bytes_of("block slack") == slack  # a temporary keeps its whole block
        assert b.bytes_of("parameters") == (5 * MiB // 2 if claimed else 0)
        assert b.bytes_of("temporaries") == b.peak - b.bytes_of("parameters") - slack


def test_each_device_gets_its_own_peak_and_an_empty_run_none():
    events = [a(1, 1 * MiB, device=1), a(2, 2 * MiB), fr.Free(1), a(3, 512, device=1)]
    seen = fr.Seen(claims={2: "parameters"})
    zero, one = analyze(0, events, seen), analyze(1, events, seen)
    assert (zero.peak, one.peak) == (2 * MiB, 1 * MiB)
    assert zero.bytes_of("parameters") == 2 * MiB and one.bytes_of("temporaries") == 1 * MiB
    empty = analyze(0, [], fr.Seen())
    assert empty.peak == 0 and empty.categories == () and empty.phase == "other"


def test_library_workspaces_are_a_category_the_reports_know():
    from jupyter_gpumem.reporters.breakdown import COLORS, MEANING

    assert "library workspaces" in CATEGORIES
    assert CATEGORIES.index("activations") < CATEGORIES.index("library workspaces")
    assert set(CATEGORIES) == set(COLORS) == set(MEANING)


# -- dry runs of steps whose bytes are known -------------------------------------------------
try:
    import torch
except ImportError:  # the tests above need no torch
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")
nn = torch.nn if torch is not None else None


def mlp():
    return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))


def dry(run, **kw):
    from jupyter_gpumem.core.dry_run import predict

    r = fr.record(run, device_type="cpu", **kw)
    assert r.error is None, r.error
    (d,), _, _ = predict(r.events, target=None, outside=(0, ""), conf="")
    assert d.breakdown is not None
    b = d.breakdown
    assert b.peak == d.peak_allocated  # to the byte
    assert total(b) == b.peak  # every byte alive at the peak, once
    return r, b


@needs_torch
def test_a_first_adamw_step_peaks_in_the_optimizer_step_with_its_state_2p():
    def step():
        model = mlp()
        opt = torch.optim.AdamW(model.parameters())
        x = torch.randn(256, 1024)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()

    _, b = dry(step)
    # THEN the peak is in the first step: AdamW makes its state (exp_avg, exp_avg_sq: 2P)
    # for every parameter first, then updates one parameter at a time, with two
    # temporaries of that parameter's size (sqrt(exp_avg_sq), then it divided), while the
    # forward's activations were let go when the backward pass ended
    assert b.phase == "optimizer step"
    assert b.bytes_of("parameters") == P
    assert b.bytes_of("gradients") == P
    # 2P, and the 4 `step` counters: CPU tensors (4 B, a 512 B block each), here on the
    # modelled device (on a GPU they stay on the CPU unless capturable or fused)
    assert b.bytes_of("optimizer state") == 2 * P + 4 * 512
    assert b.bytes_of("activations") == 0
    # temporaries: W2's sqrt and quotient (16 MiB each), b1's quotient (16 KiB, freed one
    # parameter later), the input x (its backward pass is over) and the loss (512 B)
    assert b.bytes_of("temporaries") == 2 * 16 * MiB + 16 * KiB + X + 512
    assert b.bytes_of("block slack") == 0
    assert b.modules[0].module == "(outside any module)"


@needs_torch
def test_an_sgd_step_peaks_in_the_backward_pass_with_the_input_still_saved():
    def step():
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)  # no state: updates in place
        x = torch.randn(256, 1024)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()

    _, b = dry(step)
    # THEN the peak is the backward pass's last gradient (b1's), with every gradient alive,
    # the input x still saved by model.0 (its backward pass is not over), and ReLU's grad
    # (4 MiB), the loss and its grad (512 B each) as temporaries; ReLU's output was let go
    assert b.phase == "backward"
    assert b.bytes_of("parameters") == P and b.bytes_of("gradients") == P
    assert b.bytes_of("activations") == X
    assert b.bytes_of("temporaries") == H + 512 + 512
    assert b.bytes_of("optimizer state") == 0
    assert b.peak == 2 * P + X + H + 1024


@needs_torch
def test_a_forward_pass_names_the_modules_that_saved_and_made_the_bytes(shell):
    # GIVEN a cell that binds its model to `model` and keeps the output (the graph lives)
    cell = (
        "model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))\n"
        "x = torch.randn(256, 1024)\n"
        "out = model(x)\n"
    )
    shell.user_ns.update(torch=torch, nn=nn)
    try:
        r = CellSource(shell, cell).record(device_type="cpu")
    finally:
        shell.user_ns.pop("torch")
        shell.user_ns.pop("nn")
    assert r.error is None
    from jupyter_gpumem.core.dry_run import predict

    (d,), _, _ = predict(r.events, target=None, outside=(0, ""), conf="")
    b = d.breakdown
    assert b is not None and b.peak == d.peak_allocated == total(b)
    # THEN the peak is ReLU's output being made while Linear 1's output still lives: the
    # input x saved by model.0, ReLU's output saved by model.1 (Linear 2 saves it too: it
    # counts once, for the first), Linear 1's output a temporary made in model.0
    assert b.phase == "forward"
    assert b.bytes_of("parameters") == P
    assert b.bytes_of("activations") == X + H
    assert b.bytes_of("temporaries") == H
    assert [(m.module, m.activations, m.temporaries) for m in b.modules] == [
        ("model.0", X, H),
        ("model.1", H, 0),
    ]
    assert "model.2" in r.seen.modules  # it ran, after the peak


@needs_torch
def test_cublas_workspaces_are_their_own_category():
    table = fr.Workspaces(cublas=1000, cublaslt=100, source="the test's table")

    def run():
        lin = nn.Linear(64, 64)  # addmm with a vector bias: cuBLAS then cuBLASLt
        return lin(torch.randn(8, 64))

    _, b = dry(run, workspaces=table)
    assert b.bytes_of("library workspaces") == 1024 + 512  # each rounded to 512 B


@needs_torch
def test_the_report_shows_the_breakdown_marked_predicted_and_ends_with_the_answer(shell):
    """The magic needs a CUDA build of torch; its report is the reporter's on the record
    core/dry_run makes, built here on the CPU."""
    from jupyter_gpumem.analysis.targets import parse_target
    from jupyter_gpumem.core.dry_run import dry_run
    from jupyter_gpumem.reporters.dry_run import dry_run_html, dry_run_text

    cell = (
        "model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "x = torch.randn(256, 1024)\n"
        "model(x).square().mean().backward()\n"
        "opt.step()\n"
    )
    shell.user_ns.update(torch=torch, nn=nn)
    try:
        count, shell.execution_count = shell.execution_count, 7
        try:
            r = dry_run(cell=CellSource(shell, cell), target=parse_target("T4"), device_type="cpu")
        finally:
            shell.execution_count = count
    finally:
        shell.user_ns.pop("torch")
        shell.user_ns.pop("nn")
    assert r.stopped is None and r.fits is True
    (d,) = r.devices
    assert d.breakdown is not None and d.breakdown.peak == d.peak_allocated
    text = dry_run_text(r)
    lines = text.splitlines()
    assert lines[0].startswith("gpumem: dry run of cell [7]: predicted")
    title = next(line for line in lines if "what the peak would be made of" in line)
    assert "(predicted)" in title and "during the backward" in title
    assert any(line.split()[:1] == ["gradients"] for line in lines)
    assert "model.0:" in text and "exact" not in text
    assert PREDICTED not in text  # the title says it once
    assert lines[-1].startswith("fits in Tesla T4") and ": yes, with" in lines[-1]
    html = dry_run_html(r)
    assert "jp-GpuMem-breakdown-bar" in html and "(predicted)" in html
    assert "var(--jp-border-color1" in html and "<script" not in html
    assert html.endswith(
        '<div style="font-weight:bold">' + lines[-1].replace("&", "&amp;") + "</div></div>"
    )
    # the text and the HTML say the same, in the same order
    import re

    plain = re.sub(r"<[^>]+>", " ", html)
    for line in (lines[0], title.strip(), lines[-1]):
        assert line.split(":")[0] in plain
    assert html.index("what the peak would be made of") < html.index("beside PyTorch")
