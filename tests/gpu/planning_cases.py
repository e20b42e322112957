"""The four planning cases of the accuracy tests (issue: "Before you run"), shared by
tests/gpu/test_planning.py and benchmarks/bench_planning.py.

Each case defines, in an IPython namespace, a model and a function ``step(value)`` that
runs one step at that value; the scanned cell is ``step(NAME)``. ``true_largest`` finds the
real largest value by bisection with real runs under the same cap as the scan's
verification (gc and an emptied cache before each run, as the scan does).
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
