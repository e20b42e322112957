"""Which single operation on fake CUDA tensors makes the driver create a CUDA context (and
which starts torch's CUDA). Each step runs in a fresh process that never used the GPU;
``with_patches`` runs the same steps inside the dry run's own changes to torch
(``collectors/dry_run/patches.py``):

    python3 benchmarks/probes/probe_context_ops.py

Seen on an H200 with torch 2.11 (CUDA 13): ``torch.tensor([], device="cuda")`` under the
fake mode creates a context (torch builds it under a device guard), every other step here
does not; ``torch.cuda.get_device_name`` starts CUDA. In a whole dry run (the recorder's
dispatch mode on top) a random initialisation and a copy to the GPU also create one:
``probe_context_in_run.py`` finds the first such op of a run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

FAKE = {
    "empty": "torch.empty(4, device='cuda')",
    "randn": "torch.randn(4, device='cuda')",
    "uniform": "torch.empty(4, device='cuda').uniform_(-0.5, 0.5)",
    "add": "x = torch.empty(4, device='cuda')\nx + x",
    "mm": "x = torch.empty(4, 4, device='cuda')\nx @ x",
    "tensor_from_data": "torch.tensor([], device='cuda')",
    "tensor_under_device": "with torch.device('cuda'):\n    torch.tensor([1.0, 2.0])",
    "linear_under_device": "with torch.device('cuda'):\n    torch.nn.Linear(64, 64)",
    "linear_cuda": "torch.nn.Linear(64, 64).cuda()",
    "bf16_autocast": "with torch.autocast('cuda', dtype=torch.bfloat16):\n    pass",
}
PLAIN = {
    "default_generators": "torch.cuda.default_generators",
    "device_count": "torch.cuda.device_count()",
    "get_device_name": "torch.cuda.get_device_name(0)",
}
HEAD = """\
import sys, contextlib, torch
sys.path.insert(0, ".")
from torch._subclasses import fake_tensor
fake_tensor.init_gpu_context = lambda d: None
from torch._subclasses.fake_tensor import FakeTensorMode
patches = contextlib.nullcontext()
data_mode = contextlib.nullcontext()
if {patched}:
    from jupyter_gpumem.collectors.dry_run.patches import data_on_cpu, patched
    patches = patched(torch, "cuda", lambda i: None)
    data_mode = data_on_cpu(torch, "cuda")
with patches, FakeTensorMode(allow_non_fake_inputs=True), data_mode:
"""
TAIL = (
    "print('context', torch._C._cuda_hasPrimaryContext(0), "
    "'initialized', torch.cuda.is_initialized())\n"
)


def one(code: str) -> str:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return (p.stdout.strip() or p.stderr.strip().splitlines()[-1])[:200]


if __name__ == "__main__":
    for patched in (False, True):
        for name, code in FAKE.items():
            body = HEAD.format(patched=patched) + textwrap.indent(code, "    ") + "\n" + TAIL
            label = f"{name} ({'with_patches' if patched else 'fake mode only'})"
            print(f"{label:45s}", one(body), flush=True)
    for name, code in PLAIN.items():
        print(f"{name:45s}", one("import torch\n" + code + "\n" + TAIL), flush=True)
