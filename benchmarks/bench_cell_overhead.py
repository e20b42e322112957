"""Added time per cell: %%gpumem and auto mode vs a bare cell, beside peer tools.

Runs every configuration in its own fresh process with a real IPython InteractiveShell,
same machine, same run: a trivial cell and a small training step (forward, backward,
optimizer step, synchronize). Prints a table; ``--json PATH`` writes the raw numbers.
Also measures the history's memory per cell (tracemalloc over the history's own
allocations, after N measured cells).

    python3 benchmarks/bench_cell_overhead.py [--json out.json] [--n 300] [--rounds 3]

Each of our configurations runs in ``--rounds`` fresh processes; the table shows the median
round (single processes differ by ~0.05 ms on a training step).

Targets (issue: kernel core): at most 0.3 ms added per cell, at most 1 KiB history/cell;
issue 13: full report <= +0.25 ms, -q and auto mode <= +0.08 ms over a bare trivial cell.
On a GPU, "reads alone (floor)" is what the readings themselves cost (PyTorch and the
driver), without our code: no exact measurement of a cell can cost less.
Peers are measured when importable (ipyexperiments, ipython_memory_usage).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

SETUP_TORCH = """
import torch
dev = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
xb = torch.randn(256, 1024, device=dev)
yb = torch.randint(0, 10, (256,), device=dev)
def sync():
    if dev == "cuda":
        torch.cuda.synchronize()
"""

CELLS = {
    "trivial": "a = 1",
    "train step": (
        "loss = torch.nn.functional.cross_entropy(model(xb), yb)\n"
        "loss.backward()\nopt.step()\nopt.zero_grad(set_to_none=True)\nsync()"
    ),
}

# Our configurations are measured interleaved with bare cells in the same process (the
# extension loaded but idle for the bare ones), which removes process-to-process noise.
OURS = {
    "%%gpumem": "%%gpumem\n{cell}",
    "%%gpumem -q": "%%gpumem -q\n{cell}",
    "auto mode": "{cell}",  # with session.auto switched on for the measured runs
    # The floor: only the readings a -q cell takes (memory_stats and cudaMemGetInfo before
    # and after, the peak reset before), in IPython's own cell events: what PyTorch and the
    # driver cost, without any of our code.
    "reads alone (floor)": "{cell}",
}
# Peers are switched on in a fresh process each and compared with a bare process.
PEERS = {
    "ipyexperiments CellLogger": (
        "from ipyexperiments import IPyExperimentsPytorch\n"
        "_exp = IPyExperimentsPytorch(exp_enable=False, cl_enable=True)"
    ),
    "ipython_memory_usage": (
        "import ipython_memory_usage.ipython_memory_usage as imu\nimu.start_watching_memory()"
    ),
}

OURS_CHILD = r"""
import json, statistics, sys, time
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
ip = InteractiveShell.instance()
setup_torch, cell, n, configs, floor_ok = json.loads(sys.argv[1])
ip.run_cell(setup_torch)
ip.run_line_magic("load_ext", "jupyter_gpumem")
from jupyter_gpumem._ipython import current
s = current()
floor = False
if floor_ok:
    import torch
    stats, reset = torch._C._cuda_memoryStats, torch._C._cuda_resetPeakMemoryStats
    mgi = torch.cuda.cudart().cudaMemGetInfo
    def pre(info):
        if floor:
            stats(0); mgi(0); reset(0)
    def post(result):
        if floor:
            stats(0); mgi(0)
    ip.events.register("pre_run_cell", pre)
    ip.events.register("post_run_cell", post)
bare = {name: [] for name, _, _ in configs}
timed = {name: [] for name, _, _ in configs}
with capture_output():
    for i in range(n + 20):
        # every configuration in turn, each right after its own bare cell
        for name, template, mode in configs:
            measured = template.format(cell=cell)
            t0 = time.perf_counter()
            ip.run_cell(cell)
            t1 = time.perf_counter()
            s.auto = mode == "auto"
            floor = mode == "floor"
            t2 = time.perf_counter()
            ip.run_cell(measured)
            t3 = time.perf_counter()
            s.auto = floor = False
            if i >= 20:
                bare[name].append(t1 - t0)
                timed[name].append(t3 - t2)
assert len(s.history) > 0
med = statistics.median
print(json.dumps({name: {
    "bare_ms": med(bare[name]) * 1e3, "median_ms": med(timed[name]) * 1e3,
    "added_ms": (med(timed[name]) - med(bare[name])) * 1e3,
    "added_mean_ms": (statistics.fmean(timed[name]) - statistics.fmean(bare[name])) * 1e3}
    for name, _, _ in configs}))
"""

PEER_CHILD = r"""
import json, statistics, sys, time
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
ip = InteractiveShell.instance()
setup_torch, enable, cell, n = json.loads(sys.argv[1])
ip.run_cell(setup_torch)
with capture_output():
    r = ip.run_cell(enable)
    if not r.success:
        print(json.dumps({"error": repr(r.error_in_exec or r.error_before_exec)}))
        sys.exit(0)
    for _ in range(10):
        ip.run_cell(cell)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        ip.run_cell(cell)
        times.append(time.perf_counter() - t0)
print(json.dumps({"median_ms": statistics.median(times) * 1e3}))
"""

HISTORY_CHILD = r"""
import json, sys, tracemalloc
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
ip = InteractiveShell.instance()
ip.run_cell(json.loads(sys.argv[1])[0])
ip.run_line_magic("load_ext", "jupyter_gpumem")
n = 500
with capture_output():
    ip.run_cell("%%gpumem -q\nloss = torch.nn.functional.cross_entropy(model(xb), yb)")
    tracemalloc.start()
    for i in range(n):
        ip.run_cell(f"%%gpumem -q\nloss = torch.nn.functional.cross_entropy(model(xb), yb)  # {i}")
    snap = tracemalloc.take_snapshot()
from jupyter_gpumem._ipython import current
assert len(current().history) == n + 1
# the history's own module, where it was before and after the architecture step
flt = [tracemalloc.Filter(True, p) for p in ("*jupyter_gpumem/_history.py",
       "*jupyter_gpumem/core/history.py", "*jupyter_gpumem/model/history.py")]
size = sum(s.size for s in snap.filter_traces(flt).statistics("filename"))
row = current().history.last(1)[0]
print(json.dumps({"bytes_per_cell": size / n, "devices": len(row.devices)}))
"""


def child(code: str, payload: list, path: str | None = None) -> dict:
    """Run ``code`` in a fresh interpreter; ``path``: the package tree to import first."""
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join([path, *filter(None, [env.get("PYTHONPATH")])])
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(payload)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=path,  # `python -c` puts the working directory first on the path
    )
    # Peers print their own lines (also at exit): take the last line that is our JSON.
    for line in reversed(out.stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return {"error": (out.stderr or out.stdout).strip().splitlines()[-1:]}


def ours(cell: str, n: int, has_gpu: bool, path: str | None) -> dict:
    """One fresh process measuring all our configurations over ``cell``, interleaved."""
    mode = {"auto mode": "auto", "reads alone (floor)": "floor"}
    configs = [
        [name, template, mode.get(name, "magic")]
        for name, template in OURS.items()
        if has_gpu or mode.get(name) != "floor"  # no GPU: nothing to read
    ]
    return child(OURS_CHILD, [SETUP_TORCH, cell, n, configs, has_gpu], path)


FLOOR = "reads alone (floor)"


def median_round(runs: list[dict]) -> dict:
    """Per configuration, the round with the median added time, and every round's; with
    the floor measured, also each round's time above the floor *of the same process*
    (``above_floor_ms``, in round order, and its median): processes differ by tens of
    microseconds in what every configuration costs (the floor's rounds too), a difference
    within one process cancels that."""
    names = [k for k in OURS if any(k in r for r in runs)]
    out: dict = {}
    for name in names:
        ok = sorted((r[name] for r in runs if name in r), key=lambda r: r["added_ms"])
        out[name] = {**ok[len(ok) // 2], "rounds_added_ms": [r["added_ms"] for r in ok]}
        paired = [
            r[name]["added_ms"] - r[FLOOR]["added_ms"]
            for r in runs
            if name in r and FLOOR in r and name != FLOOR
        ]
        if paired:
            out[name]["above_floor_ms"] = paired
            out[name]["above_floor_median_ms"] = statistics.median(paired)
    if not names:
        out["error"] = next((r["error"] for r in runs if "error" in r), "no result")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--peer-n", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-peers", action="store_true", help="only our configurations")
    ap.add_argument("--cells", nargs="+", choices=list(CELLS), default=list(CELLS))
    ap.add_argument(
        "--base",
        help="A/B in one run: also measure the package tree in this directory (its "
        "jupyter_gpumem/ first on the path), alternating with this one round by round",
    )
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.base:
        args.base = os.path.abspath(args.base)
    import torch  # the parent never starts CUDA (is_available asks the driver only)

    has_gpu = torch.cuda.is_available()
    results: dict = {}
    base: dict = {}
    for cell_name in args.cells:
        cell = CELLS[cell_name]
        res = results.setdefault(cell_name, {})
        new_runs, base_runs = [], []
        for _ in range(args.rounds):  # with --base, A and B alternate, a process each
            new_runs.append(ours(cell, args.n, has_gpu, None))
            if args.base:
                base_runs.append(ours(cell, args.n, has_gpu, args.base))
        res.update(median_round(new_runs))
        if args.base:
            base[cell_name] = median_round(base_runs)
        if args.no_peers:
            continue
        res["bare process"] = child(PEER_CHILD, [SETUP_TORCH, "pass", cell, args.peer_n])
        for cfg, enable in PEERS.items():
            r = child(PEER_CHILD, [SETUP_TORCH, enable, cell, args.peer_n])
            if "median_ms" in r and "median_ms" in res["bare process"]:
                r["added_ms"] = r["median_ms"] - res["bare process"]["median_ms"]
            res[cfg] = r
    hist = child(HISTORY_CHILD, [SETUP_TORCH])
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (CPU)"
    print(f"\nAdded time per cell (median), {gpu}, torch {torch.__version__}")
    cells = list(results)
    print(f"{'configuration':<28}" + "".join(f"{c + ' (ms)':>20}" for c in cells))
    bare_row = f"{'bare cell (absolute)':<28}"
    for cell_name in cells:
        bare_row += f"{results[cell_name]['%%gpumem'].get('bare_ms', float('nan')):>20.3f}"
    print(bare_row)
    for cfg in [*OURS, *({} if args.no_peers else PEERS)]:
        row = f"{cfg:<28}"
        for cell_name in cells:
            r = results[cell_name].get(cfg, {})
            row += f"{r['added_ms']:>+20.3f}" if "added_ms" in r else f"{'n/a':>20}"
            b = base.get(cell_name, {}).get(cfg, {})
            if "added_ms" in b:
                row += f" (base {b['added_ms']:+.3f})"
        print(row)
    if any("above_floor_median_ms" in r for c in cells for r in results[c].values()):
        print("above the floor of the same process (median of the rounds' differences)")
        for cfg in OURS:
            row = f"{cfg:<28}"
            for cell_name in cells:
                r = results[cell_name].get(cfg, {})
                if "above_floor_median_ms" not in r:
                    continue
                row += f"{r['above_floor_median_ms']:>+20.3f}"
                b = base.get(cell_name, {}).get(cfg, {})
                if "above_floor_median_ms" in b:
                    row += f" (base {b['above_floor_median_ms']:+.3f})"
            if row.strip() != cfg:
                print(row)
    for cell_name in cells:
        for cfg, r in results[cell_name].items():
            if "error" in r:
                print(f"  {cfg} / {cell_name}: not measured: {r['error']}")
    print(
        f"\nhistory: {hist.get('bytes_per_cell', float('nan')):.0f} bytes per measured cell "
        f"({hist.get('devices')} device(s) per row) {hist.get('error', '')}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cells": results, "base": base, "history": hist, "gpu": gpu}, f, indent=1)


if __name__ == "__main__":
    main()
