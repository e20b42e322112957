"""Which line of a dry run starts CUDA (torch's lazy init), for a case of
tests/gpu/dry_run_cases.py: ``torch.cuda._lazy_init`` is wrapped to print the Python stack
the first time it runs, then the case is dry-run.

    python3 benchmarks/probes/probe_who_inits_cuda.py CASE
"""

from __future__ import annotations

import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

if __name__ == "__main__":
    import torch  # noqa: F401 (the probe: does importing torch start CUDA?)
    import torch.cuda

    import jupyter_gpumem
    from tests.gpu.dry_run_cases import CASES

    original = torch.cuda._lazy_init
    told = []

    def lazy_init() -> None:
        if not told and not torch.cuda.is_initialized():
            told.append(1)
            print("torch.cuda._lazy_init from:", flush=True)
            traceback.print_stack(limit=30, file=sys.stdout)
        original()

    torch.cuda._lazy_init = lazy_init
    r = jupyter_gpumem.dry_run(CASES[sys.argv[1]])
    print("initialized:", torch.cuda.is_initialized(), "stopped:", r.stopped)
