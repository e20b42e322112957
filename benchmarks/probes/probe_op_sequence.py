"""The allocations of a step, op by op, real against dry: the real step under a dispatch
mode that records each op's new output storages on the GPU (op, bytes), and the dry run's
events (op, bytes), side by side, to find where a dry run's allocations part from the
real ones (the first differing position, and the sizes each side has more of).

    python3 benchmarks/probes/probe_op_sequence.py CASE [N]    # N: events to print
"""

from __future__ import annotations

import collections
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def real_sequence(case: str) -> list[tuple[str, int]]:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from tests.gpu.dry_run_cases import CASES

    seq: list[tuple[str, int]] = []
    seen: set[int] = set()
    kept: list = []  # every storage kept alive: an address is never reused, so never confused

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            outs = out if isinstance(out, (tuple, list)) else [out]
            ins = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            for o in outs:
                if isinstance(o, torch.Tensor) and o.is_cuda:
                    st = o.untyped_storage()
                    if st.data_ptr() not in ins and st.data_ptr() not in seen and st.nbytes():
                        seen.add(st.data_ptr())
                        kept.append(st)
                        seq.append((str(func), st.nbytes()))
            return out

    with Mode():
        CASES[case]()
    return seq


def dry_sequence(case: str) -> list[tuple[str, int]]:
    from jupyter_gpumem.collectors.dry_run import Alloc, record
    from tests.gpu.dry_run_cases import CASES

    r = record(CASES[case])
    return [(e.op, e.nbytes) for e in r.events if isinstance(e, Alloc) and e.kind == "tensor"]


if __name__ == "__main__":
    case = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 150
    dry = dry_sequence(case)
    real = real_sequence(case)
    first = next((i for i, (a, b) in enumerate(zip(real, dry, strict=False)) if a != b), None)
    rc, dc = collections.Counter(real), collections.Counter(dry)

    def more(a: collections.Counter, b: collections.Counter) -> list:
        return sorted(((k, v - b[k]) for k, v in a.items() if v > b[k]), key=lambda x: -x[0][1])

    print(json.dumps({
        "case": case, "real": len(real), "dry": len(dry), "first_difference": first,
        "real_more": more(rc, dc)[:25], "dry_more": more(dc, rc)[:25],
    }))  # fmt: skip
    lo = max(0, (first or 0) - 10)
    for i in range(lo, min(lo + n, max(len(real), len(dry)))):
        r = real[i] if i < len(real) else ("", 0)
        d = dry[i] if i < len(dry) else ("", 0)
        mark = "=" if r == d else "!"
        left, right = f"{r[0][:40]:40s} {r[1]:>12,d}", f"{d[0][:40]:40s} {d[1]:>12,d}"
        print(f"{i:5d} {mark} {left} | {right}")
