"""Where does %%gpumem's per-cell time go? Times each reading primitive right after a
training step (GPU idle after synchronize) and after a trivial cell, and profiles
tracker.begin/end.  python3 benchmarks/profile_cell_overhead.py"""

from __future__ import annotations

import statistics
import time

import torch

from jupyter_gpumem.collectors import Collector
from jupyter_gpumem.core.tracker import CellTracker

dev = "cuda"
model = torch.nn.Sequential(
    torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)
).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
xb = torch.randn(256, 1024, device=dev)
yb = torch.randint(0, 10, (256,), device=dev)


def step(sync: bool = True) -> None:
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if sync:
        torch.cuda.synchronize()


c = Collector()
t = CellTracker(c)
nv = c.backend.nvml
nv_index = nv.nvml_index(0)


def timed(fn, before=None, n=300):
    out = []
    for _ in range(n):
        if before:
            before()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e6


prims = {
    "_cuda_memoryStats": lambda: torch._C._cuda_memoryStats(0),
    "nvml read (with processes)": lambda: nv.read(nv_index, True),
    "nvml read (no processes)": lambda: nv.read(nv_index, False),
    "collector.measure()": c.measure,
    "tracker begin+end": lambda: (t.begin(), t.end()),
}
print(f"{'primitive':<30}{'after trivial (us)':>20}{'after train step (us)':>24}")
for name, fn in prims.items():
    print(f"{name:<30}{timed(fn):>20.1f}{timed(fn, step):>24.1f}")
print(f"{'train step alone':<30}{'':>20}{timed(step):>24.1f}")
