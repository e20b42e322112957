"""Planning on a real GPU: the cost of ``--breakdown`` against the plain step, and how much
of the allocator's exact peak PyTorch's own MemTracker accounts for on the same steps.

    python3 benchmarks/bench_planning.py [--json out.json] [--n 30]

Each step runs in a real IPython InteractiveShell: bare (no magic), under ``%%gpumem``,
and under ``%%gpumem --breakdown``; medians over ``--n`` cells after warm-up, cells
interleaved. Target (issue "Before you run"): a step with --breakdown takes at most 2x
its plain time. MemTracker (torch.distributed._tools.mem_tracker, private) is run on a
fresh copy of the same step, and its total at its peak compared with
torch.cuda.max_memory_allocated over the same step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

STEPS = {
    "mlp_adamw": (
        "import torch, torch.nn as nn\n"
        "torch.manual_seed(0)\n"
        "model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),"
        " nn.Linear(1024, 10)).cuda()\n"
        "opt = torch.optim.AdamW(model.parameters())\n"
        "xb = torch.randn(256, 1024, device='cuda')\n"
        "yb = torch.randint(0, 10, (256,), device='cuda')\n"
        "def step():\n"
        "    loss = nn.functional.cross_entropy(model(xb), yb)\n"
        "    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)\n"
        "    torch.cuda.synchronize()\n"
    ),
    "resnet50_adamw": (
        "import torch, torchvision\n"
        "torch.manual_seed(0)\n"
        "model = torchvision.models.resnet50().cuda()\n"
        "opt = torch.optim.AdamW(model.parameters())\n"
        "xb = torch.randn(32, 3, 224, 224, device='cuda')\n"
        "def step():\n"
        "    loss = model(xb).float().mean()\n"
        "    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)\n"
        "    torch.cuda.synchronize()\n"
    ),
}


def time_cells(ip, cells: dict[str, str], n: int) -> dict[str, float]:
    """Median wall time of each cell (ms), interleaved."""
    from IPython.utils.capture import capture_output

    times: dict[str, list[float]] = {k: [] for k in cells}
    for _ in range(3):  # warm-up
        for code in cells.values():
            with capture_output():
                ip.run_cell(code)
    for _ in range(n):
        for k, code in cells.items():
            with capture_output():
                t0 = time.perf_counter()
                ip.run_cell(code)
                times[k].append((time.perf_counter() - t0) * 1000)
    return {k: statistics.median(v) for k, v in times.items()}


PARTS = """
import time, statistics, torch
from jupyter_gpumem.collectors.step import StepRecorder
from jupyter_gpumem.collectors.snapshot import read_snapshot
def _median(f, n):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); ts.append((time.perf_counter() - t0) * 1000)
    return statistics.median(ts)
def _parts(n):
    out = {}
    ns = {"model": model, "opt": opt}
    for _ in range(3): step()
    out["step"] = _median(step, n)
    rec = lambda: torch.cuda.memory._record_memory_history(
        enabled="all", context=None, stacks="python", max_entries=1_000_000)
    off = lambda: torch.cuda.memory._record_memory_history(enabled=None)
    rec(); out["step, trace on"] = _median(step, n); off()
    r = StepRecorder(torch, lambda: ns.items()); r.start()
    out["step, hooks on"] = _median(step, n); r.stop()
    out["history on+off"] = _median(lambda: (rec(), off()), n)
    out["begin snapshot"] = _median(lambda: read_snapshot(torch), n)
    rec(); step(); out["end _snapshot() after one step"] = _median(
        lambda: torch.cuda.memory._snapshot(), 5); off()
    out["recorder start+stop"] = _median(
        lambda: (lambda r: (r.start(), r.stop()))(StepRecorder(torch, lambda: ns.items())), n)
    return out
"""


def parts(ip, n: int) -> dict:
    """Where --breakdown's time goes: the step under the trace alone and under the hooks
    alone, and the fixed costs around a cell (milliseconds, medians)."""
    ip.run_cell(PARTS)
    r = ip.run_cell(f"_p = _parts({n})")
    return ip.user_ns["_p"] if r.success else {"error": repr(r.error_in_exec)}


def memtracker(ip, name: str) -> dict:
    """MemTracker's total at its peak against the allocator's exact peak, same step."""
    code = (
        "import torch\n"
        "from torch.distributed._tools.mem_tracker import MemTracker\n"
        "torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()\n"
        "_mt = MemTracker()\n"
        "_mt.track_external(model, opt)\n"
        "with _mt:\n"
        "    step()\n"
        "_exact = torch.cuda.max_memory_allocated()\n"
        "_snap = _mt.get_tracker_snapshot('peak')\n"
    )
    r = ip.run_cell(code)
    if not r.success:
        return {"error": repr(r.error_in_exec)}
    snap = ip.user_ns["_snap"]
    exact = ip.user_ns["_exact"]
    totals = {}
    for dev, cats in snap.items():
        if str(dev).startswith("cuda"):
            total = cats.get("Total") if isinstance(cats, dict) else None
            if total is None and isinstance(cats, dict):
                total = sum(v for k, v in cats.items() if isinstance(v, int))
            categories = {str(k): int(v) for k, v in cats.items()}
            totals[str(dev)] = {"total": int(total or 0), "categories": categories}
    total = sum(t["total"] for t in totals.values())
    return {
        "exact_peak": exact,
        "memtracker_total": total,
        "share": total / exact if exact else None,
        "devices": totals,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--steps", default=",".join(STEPS))
    ap.add_argument("--profile", help="write a cProfile of one --breakdown cell per step here")
    args = ap.parse_args()
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    out: dict = {"steps": {}}
    for name in args.steps.split(","):
        try:
            __import__("torchvision") if "resnet" in name else None
        except ImportError:
            continue
        ip.run_cell(STEPS[name])
        cells = {
            "bare": "step()",
            "%%gpumem": "%%gpumem -q\nstep()",
            "%%gpumem --breakdown": "%%gpumem -q --breakdown\nstep()",
        }
        t = time_cells(ip, cells, args.n)
        # what the breakdown said on this step
        ip.run_cell("%%gpumem -q --breakdown -o _rep\nstep()")
        rep = ip.user_ns["_rep"]
        b = rep.breakdowns[0] if rep.breakdowns else None
        res = {
            "ms": t,
            "breakdown_over_bare": t["%%gpumem --breakdown"] / t["bare"],
            "breakdown": dataclasses.asdict(b) if b is not None else rep.breakdown_note,
            "breakdown_sum_equals_peak": (
                b is not None and sum(c.bytes for c in b.categories) == rep.device(0).peak_allocated
            ),
        }
        res["parts_ms"] = parts(ip, args.n)
        if args.profile:
            import cProfile
            import io
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            ip.run_cell("%%gpumem -q --breakdown\nstep()")
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(40)
            with open(f"{args.profile}.{name}.txt", "w") as f:
                f.write(buf.getvalue())
        try:
            res["memtracker"] = memtracker(ip, name)
        except Exception as e:
            res["memtracker"] = {"error": repr(e)}
        out["steps"][name] = res
        for k in ("model", "opt", "xb", "yb", "step", "_rep"):
            ip.user_ns.pop(k, None)
        ip.run_cell("import gc; gc.collect(); torch.cuda.empty_cache()")
    print(
        f"{'step':<16} {'bare ms':>9} {'%%gpumem':>9} {'--breakdown':>12} {'ratio':>6}  "
        "MemTracker/exact"
    )
    for name, r in out["steps"].items():
        ms = r["ms"]
        mt = r["memtracker"].get("share")
        mt_s = f"{mt * 100:.1f} %" if mt else r["memtracker"].get("error", "?")[:40]
        bd = ms["%%gpumem --breakdown"]
        ratio = r["breakdown_over_bare"]
        plain = ms["%%gpumem"]
        print(f"{name:<16} {ms['bare']:>9.2f} {plain:>9.2f} {bd:>12.2f} {ratio:>6.2f}  {mt_s}")
    for name, r in out["steps"].items():
        print(
            name,
            ", ".join(f"{k} {v:.2f}" for k, v in r["parts_ms"].items() if isinstance(v, float)),
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
