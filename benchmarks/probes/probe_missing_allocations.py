"""What a dry run does not see, allocation by allocation: a step run for real with the
allocator's history (every request, its size and the Python line that made it), against
the same step's dry run (every storage it recorded, with its op). Sizes the real run
requested more often than the dry run are printed with the lines that requested them.

    python3 benchmarks/probes/probe_missing_allocations.py [CASE ...]

One JSON line per case: the peaks of both, and the unmatched requests grouped by (size,
the innermost Python frame outside torch), largest first. Each side runs in a fresh
process (``--one real|dry CASE``).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def _swin_t_inference() -> None:
    import torch
    import torchvision

    with torch.device("cuda"):
        model = torchvision.models.swin_t().eval()
        x = torch.randn(64, 3, 224, 224)
    with torch.inference_mode():
        model(x)


def _convnext_tiny_adamw() -> None:
    import torch
    import torchvision

    with torch.device("cuda"):
        model = torchvision.models.convnext_tiny()
        x = torch.randn(64, 3, 224, 224)
    opt = torch.optim.AdamW(model.parameters())
    model(x).sum().backward()
    opt.step()


def _efficientnet_fp16() -> None:
    import torch
    import torchvision

    with torch.device("cuda"):
        model = torchvision.models.efficientnet_b0()
        x = torch.randn(64, 3, 224, 224)
    opt = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).float().sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


CASES = {
    "swin_t_inference": _swin_t_inference,
    "convnext_tiny_adamw": _convnext_tiny_adamw,
    "efficientnet_b0_fp16": _efficientnet_fp16,
}


def _case(name: str):
    """A case of this file, else of tests/gpu/dry_run_cases.py."""
    if name in CASES:
        return CASES[name]
    from tests.gpu.dry_run_cases import CASES as MORE

    return MORE[name]


def _frame(frames: list[dict]) -> str:
    for f in frames:
        name = f.get("filename", "")
        if "/torch/" in name or name.startswith("??"):
            continue
        return f"{os.path.basename(name)}:{f.get('line')} {f.get('name')}"
    return frames[0].get("name", "?") if frames else "?"


def real(name: str) -> dict:
    import torch

    torch.cuda.init()
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python")
    _case(name)()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    allocs = []
    for trace in snapshot["device_traces"]:
        for e in trace:
            if e["action"] == "alloc":
                allocs.append((e["size"], _frame(e.get("frames", []))))
    return {
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "peak_reserved": torch.cuda.max_memory_reserved(),
        "allocs": allocs,
    }


def dry(name: str) -> dict:
    from jupyter_gpumem.collectors.dry_run.run import Alloc, record
    from jupyter_gpumem.core.dry_run import dry_run

    r = dry_run(_case(name))
    seen = record(_case(name), breakdown=False)
    d = max(r.devices, key=lambda d: d.peak_reserved) if r.devices else None
    return {
        "peak_allocated": d.peak_allocated if d else None,
        "peak_reserved": d.peak_reserved if d else None,
        "stopped": r.stopped,
        "notes": list(r.notes),
        "allocs": [(e.nbytes, e.op) for e in seen.events if isinstance(e, Alloc)],
    }


def _rounded(n: int) -> int:
    return max(512, -(-n // 512) * 512)


def compare(name: str) -> dict:
    sides = {}
    for how in ("real", "dry"):
        p = subprocess.run(
            [sys.executable, __file__, "--one", how, name],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")},
        )
        if p.returncode != 0:
            return {"case": name, "error": how, "stderr": p.stderr[-2000:]}
        sides[how] = json.loads(p.stdout.strip().splitlines()[-1])
    fake_sizes = collections.Counter(_rounded(n) for n, _ in sides["dry"]["allocs"])
    missing: collections.Counter = collections.Counter()
    where: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for size, frame in sides["real"]["allocs"]:
        r = _rounded(size)
        if fake_sizes[r] > 0:
            fake_sizes[r] -= 1
            continue
        missing[r] += 1
        where[r][frame] += 1
    rows = sorted(missing.items(), key=lambda kv: -kv[0] * kv[1])[:25]
    extra = sorted(((s, n) for s, n in fake_sizes.items() if n), key=lambda kv: -kv[0] * kv[1])
    return {
        "case": name,
        "real": {k: sides["real"][k] for k in ("peak_allocated", "peak_reserved")},
        "dry": {k: sides["dry"][k] for k in ("peak_allocated", "peak_reserved", "stopped")},
        "notes": sides["dry"]["notes"],
        "real_requests": len(sides["real"]["allocs"]),
        "dry_requests": len(sides["dry"]["allocs"]),
        "missing": [{"size": s, "count": n, "where": where[s].most_common(3)} for s, n in rows],
        "only_in_dry": extra[:15],
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        how, name = sys.argv[2], sys.argv[3]
        print(json.dumps(real(name) if how == "real" else dry(name)))
    else:
        for case in sys.argv[1:] or list(CASES):
            print(json.dumps(compare(case)), flush=True)
