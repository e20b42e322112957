"""Where, in a whole dry run, the driver creates a CUDA context: the first op (or phase)
after which ``torch._C._cuda_hasPrimaryContext(0)`` turns true, with the Python stack.

    python3 benchmarks/probes/probe_context_in_run.py [--avoid-device-init] [CASE ...]

Each case (tests/gpu/dry_run_cases) runs in a fresh process that never used the GPU. Also
listed: the ops the fake mode ran for real through ``run_fallback_kernel`` (real tensors
on the device), and the prediction. ``--avoid-device-init`` runs the dry run with
``FakeTensorMode.avoid_device_init`` true, as on a machine without a GPU (no constant
propagation through device moves, CUDA's device guard a no-op): whether the context is
then gone, and whether the prediction stays the same.
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import json, sys, traceback
sys.path.insert(0, ".")
import torch
from jupyter_gpumem.collectors import fake_run
from tests.gpu.dry_run_cases import CASES
has = torch._C._cuda_hasPrimaryContext
found = {}
def check(where):
    if not found and has(0):
        found["where"] = where
        found["stack"] = traceback.format_stack(limit=18)[:-2]
base = fake_run._recorder_class()
class Probe(base):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        check(f"before {func}")
        out = super().__torch_dispatch__(func, types, args, kwargs)
        check(f"after {func}")
        return out
fake_run._recorder_class = lambda: Probe
from torch._subclasses import fake_tensor
fallbacks = []
real_fallback = fake_tensor.run_fallback_kernel
def fallback(mode, func, *args, **kwargs):
    fallbacks.append(str(func))
    check(f"fallback {func}")
    return real_fallback(mode, func, *args, **kwargs)
fake_tensor.run_fallback_kernel = fallback
if sys.argv[2] == "1":
    fake_tensor.FakeTensorMode.avoid_device_init = property(lambda self: True)
import jupyter_gpumem
check("before the dry run")
r = jupyter_gpumem.dry_run(CASES[sys.argv[1]])
check("after the dry run")
d = max(r.devices, key=lambda d: d.peak_reserved) if r.devices else None
print(json.dumps({"case": sys.argv[1], "avoid_device_init": sys.argv[2] == "1",
                  "context": bool(has(0)), **found, "fallbacks": sorted(set(fallbacks)),
                  "peak_allocated": d.peak_allocated if d else None,
                  "peak_reserved": d.peak_reserved if d else None,
                  "stopped": r.stopped, "notes": [n[:120] for n in r.notes]}))
"""

if __name__ == "__main__":
    args = sys.argv[1:]
    avoid = "--avoid-device-init" in args
    cases = [a for a in args if not a.startswith("--")] or ["mlp_adamw", "vit_b16_inference_mode"]
    for case in cases:
        for flag in ("0", "1") if avoid else ("0",):
            p = subprocess.run(
                [sys.executable, "-c", CHILD, case, flag], capture_output=True, text=True
            )
            print(p.stdout.strip() or json.dumps({"case": case, "error": p.stderr[-2000:]}))
