"""Where, in a whole dry run, the driver creates a CUDA context: the first op (or phase)
after which ``torch._C._cuda_hasPrimaryContext(0)`` turns true, with the Python stack.

    python3 benchmarks/probes/probe_context_in_run.py [CASE ...]   # tests/gpu/dry_run_cases

Each case runs in a fresh process that never used the GPU.
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
import jupyter_gpumem
check("before the dry run")
r = jupyter_gpumem.dry_run(CASES[sys.argv[1]])
check("after the dry run")
print(json.dumps({"case": sys.argv[1], "context": bool(has(0)), **found,
                  "notes": [n[:120] for n in r.notes]}))
"""

if __name__ == "__main__":
    for case in sys.argv[1:] or ["mlp_adamw", "vit_b16_inference_mode"]:
        p = subprocess.run([sys.executable, "-c", CHILD, case], capture_output=True, text=True)
        print(p.stdout.strip() or json.dumps({"case": case, "error": p.stderr[-2000:]}))
