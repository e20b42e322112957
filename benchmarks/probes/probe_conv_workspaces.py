"""cuDNN convolution workspaces, real against asked: each convolution op of a real step runs
under a dispatch mode that reads the allocator around it (allocated before and after, the
peak inside it), and the same op's cuDNN calls are sized by the dry run's sizer
(``collectors/dry_run/cudnn.py``) from the real tensors.

    python3 benchmarks/probes/probe_conv_workspaces.py [CASE ...]

One JSON line per op call: the op, its shapes, the backend, the sizes asked, and what the
allocator saw: ``transient`` = peak inside the op minus allocated after it (for a forward:
the workspace; for a backward, the larger of the data gradient's workspace and the filter
gradient's workspace plus what was not yet allocated)."""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def main(cases: list[str]) -> None:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from jupyter_gpumem.collectors.dry_run.conv import ConvWorkspaces
    from jupyter_gpumem.collectors.dry_run.cudnn import sizer
    from tests.gpu.dry_run_cases import CASES

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    ask, how = sizer(torch, 0)
    print(json.dumps({"sizer": how}), flush=True)
    convs = ConvWorkspaces(torch)
    names = {"convolution", "convolution_backward"}

    class Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func._opname
            if name not in names:
                return func(*args, **kwargs)
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = func(*args, **kwargs)
            torch.cuda.synchronize()
            peak, after = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
            try:
                calls = convs.calls(name, args, out)
                asked = [ask(c) for c in calls] if calls and ask else None
                ops = [c.op for c in calls] if calls else calls
            except Exception as e:  # the probe reports it
                asked, ops = f"{type(e).__name__}: {e}", None
            print(json.dumps({
                "case": case, "op": name,
                "shapes": [list(a.shape) for a in args[:3] if isinstance(a, torch.Tensor)],
                "dtype": str(args[0].dtype), "calls": ops, "asked": asked,
                "out": after - before, "transient": peak - after,
            }), flush=True)  # fmt: skip
            return out

    for case in cases:
        with Probe():
            CASES[case]()
        torch.cuda.synchronize()
        print(json.dumps({"case": case, "peak_reserved": torch.cuda.max_memory_reserved()}))


if __name__ == "__main__":
    main(sys.argv[1:])
