"""The planning cases of the accuracy tests (issue: "Before you run"), shared by
tests/gpu/test_planning.py, tests/gpu/record_planning.py and benchmarks/bench_planning.py.

Each case defines, in an IPython namespace, a model and a function ``step(value)`` that
runs one step at that value; the scanned cell is ``step(NAME)``. ``true_largest`` finds the
real largest value by bisection with real runs under the same cap as the scan's
verification (gc and an emptied cache before each run, as the scan does).

``CASES``: four small models of our own. ``REAL_CASES``: three models nobody here wrote,
where the scan once answered too low (a decoder LLM whose peak moves from the optimizer
step to the backward pass as the batch grows; ResNet-50 inference; ResNet-50 training),
each with its target chosen on the GPU from one uncapped run (``RealCase.target_for``).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

MLP = """
import torch, torch.nn as nn
torch.manual_seed(0)
mlp = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                    nn.Linear(4096, 1024)).cuda()
mlp_opt = torch.optim.AdamW(mlp.parameters(), lr=1e-4)
def step(batch):
    x = torch.randn(batch, 1024, device="cuda")
    loss = mlp(x).square().mean()
    loss.backward()
    mlp_opt.step()
    mlp_opt.zero_grad()
"""

CNN = """
import torch, torch.nn as nn
torch.manual_seed(0)
cnn = nn.Sequential(
    nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
    nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(128, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10)).cuda()
cnn_opt = torch.optim.SGD(cnn.parameters(), lr=0.01, momentum=0.9)
def step(batch):
    x = torch.randn(batch, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    loss = nn.functional.cross_entropy(cnn(x), y)
    loss.backward()
    cnn_opt.step()
    cnn_opt.zero_grad()
"""

TRANSFORMER = """
import torch, torch.nn as nn
from torch.nn.attention import SDPBackend, sdpa_kernel
torch.manual_seed(0)
enc = nn.TransformerEncoder(
    nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True),
    num_layers=2, enable_nested_tensor=False).cuda()
enc_opt = torch.optim.AdamW(enc.parameters(), lr=1e-4)
def step(seq_len):
    x = torch.randn(4, seq_len, 256, device="cuda")
    with sdpa_kernel(SDPBackend.MATH):  # attention scores materialised: quadratic in seq_len
        loss = enc(x).square().mean()
        loss.backward()
    enc_opt.step()
    enc_opt.zero_grad()
"""

INFERENCE = """
import torch, torch.nn as nn
torch.manual_seed(0)
big = nn.Sequential(nn.Linear(2048, 8192), nn.GELU(), nn.Linear(8192, 8192), nn.GELU(),
                    nn.Linear(8192, 2048)).cuda().eval()
def step(batch):
    with torch.no_grad():
        x = torch.randn(batch, 2048, device="cuda")
        return big(x).sum().item()
"""


@dataclass(frozen=True)
class Case:
    name: str
    setup: str
    var: str
    probes: tuple[int, ...]
    fit_in: str
    quadratic: bool = False


CASES = (
    Case("mlp_adamw", MLP, "batch", (2048, 4096, 8192), "4GiB"),
    Case("cnn_batchnorm", CNN, "batch", (64, 128, 256), "4GiB"),
    Case("transformer_seq", TRANSFORMER, "seq_len", (512, 1024, 2048), "6GiB", quadratic=True),
    Case("inference_no_grad", INFERENCE, "batch", (1024, 2048, 4096), "3GiB"),
)


# -- models nobody here wrote ---------------------------------------------------------------
# A Llama-architecture decoder built from its config (no download): 12 layers of 1024,
# ~220M parameters, bf16 weights, AdamW (state in bf16), sequences of 256. Its peak is in
# the optimizer step at batch 1 (parameters, gradients, state and the foreach temporaries;
# the logits ``out`` holds grow it a little) and in the backward pass from batch 2 or 4.
LLM = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
llm_config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                         num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=16,
                         max_position_embeddings=1024, use_cache=False)
llm = LlamaForCausalLM(llm_config).to(device="cuda", dtype=torch.bfloat16)
llm.train()
llm_opt = torch.optim.AdamW(llm.parameters(), lr=1e-4)
def step(batch):
    ids = torch.randint(0, 32000, (batch, 256), device="cuda")
    out = llm(input_ids=ids, labels=ids)
    out.loss.backward()
    llm_opt.step()
    llm_opt.zero_grad(set_to_none=True)
"""

RESNET_INFERENCE = """
import torch, torchvision
torch.manual_seed(0)
rn_eval = torchvision.models.resnet50().cuda().eval()
def step(batch):
    with torch.inference_mode():
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        return rn_eval(x).argmax(1).sum().item()
"""

RESNET_TRAIN = """
import torch, torchvision
torch.manual_seed(0)
rn = torchvision.models.resnet50().cuda()
rn_opt = torch.optim.AdamW(rn.parameters(), lr=1e-4)
def step(batch):
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    loss = torch.nn.functional.cross_entropy(rn(x), y)
    loss.backward()
    rn_opt.step()
    rn_opt.zero_grad(set_to_none=True)
"""


@dataclass(frozen=True)
class RealCase:
    """A real model's step, scanned over ``var`` with ``probes``. The target is chosen on
    the GPU so that the true largest value is near ``near``: what this process holds
    outside PyTorch plus the peak reserved by one uncapped run at ``near``."""

    name: str
    setup: str
    var: str
    probes: tuple[int, ...]
    near: int
    needs: str  # the package the case needs besides torch
    names: tuple[str, ...]  # what the setup binds, dropped afterwards

    def target_for(self, torch: Any, step: Any, device: int = 0) -> int:
        """Bytes: one uncapped run at ``near`` (after a first run that builds what stays,
        such as an optimizer's state), its peak reserved plus what the process holds
        outside PyTorch (cudaMemGetInfo's used minus reserved: alone on the GPU)."""
        gc.collect()
        torch.cuda.empty_cache()
        step(self.near)  # builds what stays (optimizer state, workspaces)
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        step(self.near)
        peak = torch.cuda.max_memory_reserved(device)
        gc.collect()
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
        outside = total - free - torch.cuda.memory_reserved(device)
        return int(peak + outside)


REAL_CASES = (
    RealCase(
        name="llm_adamw_bf16",
        setup=LLM,
        var="batch",
        probes=(1, 2, 4),
        near=10,
        needs="transformers",
        names=("llm", "llm_config", "llm_opt", "step"),
    ),
    RealCase(
        name="resnet50_inference",
        setup=RESNET_INFERENCE,
        var="batch",
        probes=(32, 64, 128),
        near=300,
        needs="torchvision",
        names=("rn_eval", "step"),
    ),
    RealCase(
        name="resnet50_adamw",
        setup=RESNET_TRAIN,
        var="batch",
        probes=(16, 32, 64),
        near=160,
        needs="torchvision",
        names=("rn", "rn_opt", "step"),
    ),
)


def runs_under_cap(torch: Any, step: Any, value: int, cap: int, device: int = 0) -> bool:
    """Does ``step(value)`` run with PyTorch capped at ``cap`` bytes? (Cache emptied first.)"""
    total = torch.cuda.mem_get_info(device)[1]
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    try:
        step(value)
        return True
    except torch.OutOfMemoryError as e:
        import traceback

        traceback.clear_frames(e.__traceback__)
        return False
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        gc.collect()
        torch.cuda.empty_cache()


def true_largest(torch: Any, step: Any, cap: int, lo: int, hi: int) -> tuple[int, int]:
    """The largest value that runs under ``cap``, by bisection from a bracket (lo runs, hi
    does not; both are checked and widened if wrong). Returns (value, runs made)."""
    runs = 0
    while not runs_under_cap(torch, step, lo, cap):
        runs += 1
        lo //= 2
        if lo < 1:
            return 0, runs
    runs += 1
    while runs_under_cap(torch, step, hi, cap):
        runs += 1
        lo, hi = hi, hi * 2
    runs += 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        runs += 1
        if runs_under_cap(torch, step, mid, cap):
            lo = mid
        else:
            hi = mid
    return lo, runs


def scan_real_case(ip: Any, torch: Any, case: RealCase, device: int = 0) -> dict[str, Any]:
    """Scan ``case`` through the magic in ``ip`` (the extension loaded), then find the true
    largest value by bisection with real runs under the scan's cap. One JSON-able record:
    the scan's answer, the truth, the error in % (positive: the answer is below the truth)
    and what the old single curve through the probes would have predicted."""
    import time

    from IPython.utils.capture import capture_output

    from jupyter_gpumem.analysis.fit import fit_peaks, largest_within
    from jupyter_gpumem.analysis.scan_predict import fit_probes

    started = time.perf_counter()
    with capture_output():
        res = ip.run_cell(case.setup)
    if not res.success:
        raise RuntimeError(f"{case.name}: the setup failed: {res.error_in_exec!r}")
    step = ip.user_ns["step"]
    target = case.target_for(torch, step, device)
    fit_in = f"{target >> 20}MiB"
    values = ",".join(str(v) for v in case.probes)
    scanned = time.perf_counter()
    with capture_output() as cap:
        res = ip.run_cell(
            f"%%gpumem --scan {case.var}={values} --fit-in {fit_in} -o res\nstep({case.var})\n"
        )
    if not res.success or "res" not in ip.user_ns:
        raise RuntimeError(f"{case.name}: the scan failed: {res.error_in_exec!r} {cap.stdout}")
    r = ip.user_ns.pop("res")
    truth_started = time.perf_counter()
    failed = [x.value for x in r.verifications if not x.ok]
    answer = r.largest
    lo = int(answer) if answer else max(1, case.probes[0] // 2)
    hi = int(min(failed)) if failed else int(max(lo, r.predicted or lo) * 1.3) + 2
    truth, bisection_runs = true_largest(torch, step, r.cap, lo, max(hi, lo + 1))
    done = time.perf_counter()
    probes = fit_probes(r.runs)  # the first value's repeat, when it was run again
    xs = [p.value for p in probes]
    one = fit_peaks(xs, [p.peak_allocated or 0 for p in probes])
    single = largest_within(one, r.budget, True)
    record = {
        "test": "scan_real",
        "case": case.name,
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "var": case.var,
        "probes": list(case.probes),
        "fit_in": fit_in,
        "cap": r.cap,
        "margin": r.margin,
        "outside": r.outside_torch,
        "fit": r.fit.kind if r.fit is not None else None,
        "binding_phase": r.fit.phase if r.fit is not None else None,
        "phase_fits": [
            [f.phase, f.kind, round(f.a), round(f.b), f.c] for f in (r.fit.phases if r.fit else ())
        ],
        "probe_phases": [[p.value, p.peak_phase, p.peak_allocated] for p in r.probes],
        "single_curve": {"kind": one.kind, "predicted": single},
        "predicted": r.predicted,
        "answer": answer,
        "verified": r.verified,
        "true": truth,
        "error_pct": round((truth - answer) / truth * 100, 2) if truth and answer else None,
        "within_3pct": bool(truth and answer and 0.97 * truth <= answer <= truth),
        "probe_runs": len(r.probes),
        "verify_runs": len(r.verifications),
        "verify": [[x.value, x.ok] for x in r.verifications],
        "runs": [
            [
                x.kind,
                x.value,
                x.ok,
                x.base,
                x.peak_allocated,
                x.peak_reserved,
                x.fragmentation,
                x.request,
                x.held,
            ]
            for x in r.runs
        ],
        "bisection_runs": bisection_runs,
        "answer_line": r.answer,
        "verify_note": r.verify_note,
        "notes": list(r.notes),
        "seconds": {
            "setup": round(scanned - started, 1),
            "scan": round(truth_started - scanned, 1),
            "truth": round(done - truth_started, 1),
        },
    }
    for name in (*case.names, case.var):
        ip.user_ns.pop(name, None)
    del step
    gc.collect()
    torch.cuda.empty_cache()
    return record
