"""GPU tests of planning: what a step's peak is made of (--breakdown), the largest value
that fits (--scan), checked against ground truth on a real GPU.

Ground truth: the tensors' own sizes (rounded up to 512 B, as the allocator counts them),
the allocator's exact peak counter, and the true largest value found by bisection with
real runs under the same cap. Results go to $GPUMEM_PLANNING_RESULTS (JSON lines) when set,
for the numbers in the notes.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from jupyter_gpumem.units import parse_size
from tests.conftest import run
from tests.gpu.planning_cases import (
    CASES,
    REAL_CASES,
    Case,
    RealCase,
    runs_under_cap,
    scan_real_case,
    true_largest,
)

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def r512(n: int) -> int:
    return -(-n // 512) * 512


def storage_bytes(tensors) -> int:
    return sum(r512(t.untyped_storage().nbytes()) for t in tensors)


def record(**fields) -> None:
    path = os.environ.get("GPUMEM_PLANNING_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(fields) + "\n")


@pytest.fixture
def gip(ip):
    ip.run_cell("import torch, gc")
    ip.run_cell("torch.empty(0, device='cuda:0')")
    # cuBLAS and cuBLASLt keep a workspace from their first matmul on: make them before the
    # measured cells (a Linear with a bias goes through cuBLASLt)
    ip.run_cell(
        "_o = torch.ones(64, 64, device='cuda')\n"
        "_w = _o @ _o; _w = torch.nn.functional.linear(_o, _o, _o[0])\n"
        "del _o, _w; torch.cuda.empty_cache()"
    )
    yield ip
    ip.run_cell("%gpumem limit off")
    for name in list(ip.user_ns):
        if name in (
            "mlp",
            "opt",
            "x",
            "out",
            "loss",
            "rep",
            "res",
            "model",
            "step",
            "mlp_opt",
            "cnn",
            "cnn_opt",
            "enc",
            "enc_opt",
            "big",
        ):
            ip.user_ns.pop(name, None)
    import gc

    gc.collect()
    torch.cuda.empty_cache()


SETUP_MLP = """
import torch.nn as nn
torch.manual_seed(0)
mlp = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                    nn.Linear(4096, 1024)).cuda()
x = torch.randn(256, 1024, device="cuda")
"""


def _check_sum(rep) -> None:
    b = rep.breakdowns[0]
    d = rep.device(0)
    assert b.exact, b.note
    assert sum(c.bytes for c in b.categories) == b.peak == d.peak_allocated
    assert b.counter_peak == d.peak_allocated


def test_breakdown_forward_activations_exact(gip):
    gip.run_cell(SETUP_MLP)
    res, texts, _ = run(gip, "%%gpumem --breakdown -o rep\nout = mlp(x)")
    assert res.success
    rep = gip.user_ns["rep"]
    _check_sum(rep)
    b = rep.breakdowns[0]
    B, mlp = 256, gip.user_ns["mlp"]
    assert b.phase == "forward"
    assert b.bytes_of("parameters") == storage_bytes(mlp.parameters())
    # Saved for backward and alive at the peak (the second ReLU's output): the input x
    # (saved by mlp.0), the first ReLU's output and the second's. The second Linear's
    # output is alive too (ReLU has not returned yet) but saved by nobody: a temporary.
    assert b.bytes_of("activations") == r512(B * 1024 * 4) + 2 * r512(B * 4096 * 4)
    assert b.bytes_of("temporaries") == r512(B * 4096 * 4)
    assert b.bytes_of("gradients") == 0
    names = {m.module for m in b.modules}
    assert {"mlp.0", "mlp.1", "mlp.2", "mlp.3"} <= names
    assert "what the peak is made of" in texts[0]
    import jupyter_gpumem

    df = jupyter_gpumem.breakdown()
    assert int(df["bytes"].sum()) == b.peak and set(df["phase"]) == {"forward"}
    record(test="forward", peak=b.peak, categories={c.category: c.bytes for c in b.categories})


def test_breakdown_first_adamw_step_peaks_in_the_optimizer(gip):
    gip.run_cell(SETUP_MLP + "\nopt = torch.optim.AdamW(mlp.parameters())")
    code = "%%gpumem --breakdown -o rep\nloss = mlp(x).square().mean()\nloss.backward()\nopt.step()"
    res, _, _ = run(gip, code)
    assert res.success
    rep = gip.user_ns["rep"]
    _check_sum(rep)
    b = rep.breakdowns[0]
    params = list(gip.user_ns["mlp"].parameters())
    P = storage_bytes(params)
    state = [v for s in gip.user_ns["opt"].state.values() for v in s.values() if v.is_cuda]
    assert storage_bytes(state) == 2 * P
    assert b.phase == "optimizer step"
    assert b.bytes_of("parameters") == P
    assert b.bytes_of("gradients") == P
    assert b.bytes_of("optimizer state") == 2 * P
    assert b.bytes_of("activations") == 0  # backward freed them; the optimizer's temporaries
    assert b.bytes_of("temporaries") > 0
    record(
        test="adamw_first_step",
        P=P,
        peak=b.peak,
        categories={c.category: c.bytes for c in b.categories},
    )


def test_breakdown_resnet50_step(gip):
    pytest.importorskip("torchvision")
    gip.run_cell(
        "import torchvision\n"
        "torch.manual_seed(0)\n"
        "model = torchvision.models.resnet50().cuda()\n"
        "opt = torch.optim.AdamW(model.parameters())\n"
        "x = torch.randn(32, 3, 224, 224, device='cuda')\n"
        "model(x).mean().backward(); opt.step(); opt.zero_grad(set_to_none=False)\n"
    )
    code = (
        "%%gpumem --breakdown -o rep\n"
        "loss = model(x).float().mean()\n"
        "loss.backward()\n"
        "opt.step()\n"
        "opt.zero_grad(set_to_none=False)\n"
    )
    res, _texts, _ = run(gip, code)
    assert res.success
    rep = gip.user_ns["rep"]
    _check_sum(rep)
    b = rep.breakdowns[0]
    model = gip.user_ns["model"]
    P = storage_bytes(model.parameters())
    assert b.bytes_of("parameters") == P
    assert b.bytes_of("gradients") == P  # zeroed in place: alive through the step
    assert b.bytes_of("optimizer state") == 2 * P
    assert b.bytes_of("buffers") == storage_bytes(model.buffers())
    assert b.phase in ("forward", "backward")
    assert b.bytes_of("activations") > 0
    assert all(m.module.startswith("model") for m in b.modules)
    record(
        test="resnet50",
        P=P,
        peak=b.peak,
        phase=b.phase,
        categories={c.category: c.bytes for c in b.categories},
        modules=[(m.module, m.activations, m.temporaries) for m in b.modules[:3]],
    )


def test_no_hooks_left_after_a_breakdown(gip):
    gip.run_cell(SETUP_MLP)
    run(gip, "%%gpumem --breakdown\nout = mlp(x)")
    import torch.nn.modules.module as m

    assert not m._global_forward_pre_hooks and not m._global_forward_hooks
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_scan_finds_the_largest_value(gip, case: Case):
    gip.run_cell(case.setup)
    values = ",".join(str(v) for v in case.probes)
    res, texts, _ = run(
        gip,
        f"%%gpumem --scan {case.var}={values} --fit-in {case.fit_in} -o res\nstep({case.var})\n",
    )
    assert res.success, texts
    r = gip.user_ns["res"]
    assert r.fit is not None and r.predicted is not None
    assert (r.fit.kind == "quadratic") == case.quadratic
    assert len(r.probes) <= 4
    assert len(r.verifications) <= 3
    assert r.verified is not None, r.verify_note
    step = gip.user_ns["step"]
    assert runs_under_cap(torch, step, int(r.verified), r.cap)
    # The bisection starts from the answer, which ran under the cap (checked above): the
    # real allocator is not monotone near the cap (the CNN's 1240 and 1208 ran on an H200
    # where a bisection from its largest probe had seen 1208 fail and called 1186 the
    # largest), so a bisection from below can miss values that run.
    lo = int(r.verified)
    truth, runs = true_largest(torch, step, r.cap, lo, max(int(r.predicted * 1.5) + 2, lo + 1))
    record(
        test="scan",
        case=case.name,
        probes=list(case.probes),
        fit=r.fit.kind,
        predicted=r.predicted,
        verified=r.verified,
        true=truth,
        cap=r.cap,
        margin=r.margin,
        outside=r.outside_torch,
        verify_runs=len(r.verifications),
        bisection_runs=runs,
        answer=r.answer,
        runs=[
            [
                x.kind,
                x.value,
                x.ok,
                x.oom,
                x.base,
                x.peak_allocated,
                x.peak_reserved,
                x.kept,
                x.cap,
                x.fragmentation,
            ]
            for x in r.runs
        ],
    )
    assert r.verified <= truth
    assert r.verified >= 0.97 * truth  # within 3 % below the true largest value
    assert abs(r.predicted - truth) <= 0.05 * truth
    # the namespace is as it was: the scanned name and the runs' names are gone
    assert case.var not in gip.user_ns


@pytest.mark.parametrize("case", REAL_CASES, ids=lambda c: c.name)
def test_scan_of_a_real_model_answers_within_three_percent_of_the_truth(gip, case: RealCase):
    # Models nobody here wrote, where the scan once answered 33 % (a decoder LLM whose peak
    # moves from the optimizer step to the backward pass), 15 % (ResNet-50 inference) and
    # 4.5 % (ResNet-50 training) below the true largest value.
    pytest.importorskip(case.needs)
    rec = scan_real_case(gip, torch, case)
    record(**rec)
    assert rec["probe_runs"] <= len(case.probes) + 1
    assert rec["verify_runs"] <= 3
    assert rec["answer"] is not None, rec["verify_note"]
    assert rec["within_3pct"], rec
    assert case.var not in gip.user_ns


OOM_SETUP = """
import torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(2048, 8192), nn.ReLU(), nn.Linear(8192, 8192), nn.ReLU(),
                      nn.Linear(8192, 2048)).cuda()
opt = torch.optim.AdamW(model.parameters())
model(torch.randn(8, 2048, device="cuda")).sum().backward(); opt.step(); opt.zero_grad()
"""
OOM_STEP = (
    "loss = model(torch.randn(batch, 2048, device='cuda')).square().mean()\n"
    "loss.backward()\nopt.step()\nopt.zero_grad()\n"
)


def test_oom_fixes_are_judged_against_what_the_step_needs(gip):
    gip.run_cell(OOM_SETUP)
    torch.cuda.empty_cache()
    held = torch.cuda.memory_allocated(0)
    cap = held + (1536 << 20)
    gip.run_cell(f"%gpumem limit {cap}B")
    gip.user_ns["batch"] = 32768
    res, texts, _ = run(gip, "%%gpumem -o rep\n" + OOM_STEP)
    assert isinstance(res.error_in_exec, torch.OutOfMemoryError)
    rep = gip.user_ns["rep"]
    pm = rep.postmortems[0]
    d = rep.device(0)
    # the need: what the step had allocated above its start when it failed, plus the request
    assert pm.need == d.peak_above_start + pm.requested
    assert pm.need_full is None
    # the failed run's own activations, held by the kept traceback: a first step, not a fix
    assert pm.fixes[0].first_step and pm.fixes[0].kind == "traceback"
    first = pm.fixes[0].frees
    assert first > 0
    # without the whole need known nothing "fits"; each verdict follows from the numbers
    assert all(f.fits is not True for f in pm.fixes)
    short = pm.need - pm.room
    del_opt = next(f for f in pm.fixes if f.command == "del opt")
    P = storage_bytes(gip.user_ns["model"].parameters())
    assert del_opt.frees == 2 * P
    if del_opt.frees >= short:
        assert del_opt.fits is None  # covers the need so far: maybe
    else:
        assert del_opt.fits is False and del_opt.shortfall == short - del_opt.frees
    assert "scan batch=" in pm.hint  # an obvious size variable: the scan to run
    # its --fit-in is a card's whole memory: the cap plus what this process holds outside
    # PyTorch, so that the scan's budget is the cap
    fit_in = re.search(r"--fit-in (\S+)`", pm.hint).group(1)
    outside = d.after.outside_torch
    assert outside is not None and outside > 0
    assert abs(parse_size(fit_in) - (cap + outside)) < 1 << 20
    before = torch.cuda.memory_allocated(0)
    gip.run_cell("%gpumem release-traceback")
    assert before - torch.cuda.memory_allocated(0) == first
    record(
        test="oom_need", need=pm.need, room=pm.room, first=first, del_opt=del_opt.text, hint=pm.hint
    )

    # With a scan of the step, the whole need at batch = 32768 is known: deleting the
    # optimizer (its state) no longer "covers" anything, it is judged against the step.
    # (The scan runs values where activations, not the optimizer step, make the peak.)
    gip.run_cell("%gpumem limit off")
    res, texts, _ = run(
        gip, f"%%gpumem --scan batch=4096,8192,12288 --fit-in {fit_in} -o res\n" + OOM_STEP
    )
    assert res.success, texts
    scan = gip.user_ns["res"]
    # the same cap (within what the hint itself takes for the same: 2 %; the context
    # measured by the scan after its probes may differ by a library's workspace)
    assert abs(scan.cap - cap) <= 0.02 * cap, (scan.cap, cap, scan.outside_torch, outside)
    assert not scan.notes, scan.notes
    gip.run_cell(f"%gpumem limit {cap}B")
    gip.user_ns["batch"] = 32768
    res, texts, _ = run(gip, "%%gpumem -o rep\n" + OOM_STEP)
    assert isinstance(res.error_in_exec, torch.OutOfMemoryError)
    pm = gip.user_ns["rep"].postmortems[0]
    assert pm.need_full is not None and pm.need_full > pm.need
    del_opt = next(f for f in pm.fixes if f.command == "del opt")
    assert del_opt.fits is False
    assert del_opt.shortfall == pm.need_full - pm.room - del_opt.frees
    assert f"the scan of In[{scan.execution_count}]" in pm.hint
    # The scan's answer and the hint agree with its verification: a value is called a fit
    # only when it ran under the cap; when every value tried ran out of memory, none is.
    assert scan.verifications, scan.verify_note  # the cap is below what this GPU has
    if scan.verify_failed:
        assert scan.largest is None and all(v.oom for v in scan.verifications)
        assert scan.answer.startswith(f"no batch found that fits in {scan.target.label}: ")
        assert "found no batch that fits" in pm.hint
        assert not re.search(r"\d+ fits in", pm.hint)
    else:
        v = int(scan.verified)
        # it ran under the cap, or its probe (no cap) never reserved more than the cap
        assert scan.largest == v and any(
            x.ok and x.value == v and (x.kind == "verify" or (x.peak_reserved or 0) <= scan.cap)
            for x in scan.runs
        )
        assert scan.answer.startswith(f"largest batch that fits in {scan.target.label}: {v} (")
        assert f"; {v} fits in {scan.target.label} (verified)" in pm.hint
    # a fix that frees memory fits only when it frees what the whole step lacks (lifting the
    # cap or other processes' memory move the limit instead)
    assert all(
        f.fits is not True or f.frees >= pm.need_full - pm.room
        for f in pm.fixes
        if f.kind not in ("cap", "other_process") and f.frees is not None
    )
    gip.run_cell("%gpumem release-traceback")
    record(
        test="oom_need_after_scan",
        need=pm.need,
        need_full=pm.need_full,
        room=pm.room,
        del_opt=del_opt.text,
        hint=pm.hint,
        answer=scan.answer,
        verify_runs=[[x.value, x.ok] for x in scan.verifications],
    )


def test_scan_function_finds_what_the_magic_finds(gip):
    import jupyter_gpumem

    case = next(c for c in CASES if c.name == "inference_no_grad")
    gip.run_cell(case.setup)
    r = jupyter_gpumem.scan(gip.user_ns["step"], case.probes, fit_in=case.fit_in, name="batch")
    assert r.verified is not None and r.answer.startswith("largest batch that fits in 3.00 GiB")
    assert runs_under_cap(torch, gip.user_ns["step"], int(r.verified), r.cap)
    bundle = r._repr_mimebundle_()
    assert r.answer in bundle["text/plain"] and "<svg" in bundle["text/html"]
