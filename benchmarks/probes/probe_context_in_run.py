"""What a whole dry run does to the GPU: where the driver creates a CUDA context (the first
op, or phase, after which ``torch._C._cuda_hasPrimaryContext(0)`` turns true, with the
Python stack), the ops the fake mode ran for real (``run_fallback_kernel``), and the real
allocations PyTorch's allocator counted during the run.

    python3 benchmarks/probes/probe_context_in_run.py [--torch-mode] [--cuda-started] [CASE ...]

Each case (tests/gpu/dry_run_cases) runs in a fresh process. ``--cuda-started``: the process
uses the GPU before the dry run (one real tensor), so that real allocations made by the run
show in the allocator's cumulative counters. ``--torch-mode``: each case runs a second time
with torch's own ``FakeTensorMode`` in place of the dry run's (``avoid_device_init`` as
torch sets it where a GPU is visible: off), to compare.
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import json, sys, traceback
sys.path.insert(0, ".")
import torch
from jupyter_gpumem.collectors.dry_run import patches as fake_patches, run as fake_run
from tests.gpu.dry_run_cases import CASES
case, mode, started = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
has = torch._C._cuda_hasPrimaryContext
found = {}
def check(where):
    if not found and has(0):
        found["where"] = where
        found["stack"] = traceback.format_stack(limit=18)[:-2]
base = fake_run.recorder_class()
class Probe(base):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        check(f"before {func}")
        out = super().__torch_dispatch__(func, types, args, kwargs)
        check(f"after {func}")
        return out
fake_run.recorder_class = lambda: Probe
from torch._subclasses import fake_tensor
fallbacks = []
real_fallback = fake_tensor.run_fallback_kernel
def fallback(mode, func, *args, **kwargs):
    fallbacks.append(str(func))
    check(f"fallback {func}")
    return real_fallback(mode, func, *args, **kwargs)
fake_tensor.run_fallback_kernel = fallback
if mode == "torch":
    fake_patches._MODE = fake_tensor.FakeTensorMode
keys = ("allocation.all.allocated", "segment.all.allocated", "reserved_bytes.all.allocated")
if started:
    keep = torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
import jupyter_gpumem
check("before the dry run")
r = jupyter_gpumem.dry_run(CASES[case])
check("after the dry run")
real = {k: torch.cuda.memory_stats()[k] - before[k] for k in keys} if started else None
d = max(r.devices, key=lambda d: d.peak_reserved) if r.devices else None
print(json.dumps({"case": case, "mode": mode, "cuda_started": started,
                  "context": bool(has(0)), **found, "fallbacks": sorted(set(fallbacks)),
                  "real_allocations_during_run": real,
                  "peak_allocated": d.peak_allocated if d else None,
                  "peak_reserved": d.peak_reserved if d else None,
                  "stopped": r.stopped, "notes": [n[:160] for n in r.notes]}))
"""

if __name__ == "__main__":
    args = sys.argv[1:]
    modes = ("ours", "torch") if "--torch-mode" in args else ("ours",)
    started = "1" if "--cuda-started" in args else "0"
    cases = [a for a in args if not a.startswith("--")] or ["mlp_adamw", "resnet50_adamw"]
    for case in cases:
        for mode in modes:
            p = subprocess.run(
                [sys.executable, "-c", CHILD, case, mode, started], capture_output=True, text=True
            )
            print(p.stdout.strip() or json.dumps({"case": case, "error": p.stderr[-2000:]}))
