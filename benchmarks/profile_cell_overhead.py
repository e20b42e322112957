"""Where does %%gpumem's per-cell time go, on a GPU?

1. Each reading primitive a cell's before/after calls, timed alone (median of 2000), right
   after a trivial cell and right after a training step (the GPU idle after synchronize).
2. Our cell hooks alone (``pre_run_cell`` + ``post_run_cell`` called directly, warm, best
   of 7 x 3000) per mode, beside the floor's reads called the same way: what our own
   Python costs when nothing else runs between the two.
3. A real IPython shell runs ``--cells`` cells of each mode (``%%gpumem -q``, auto mode,
   full report) over ``a = 1`` under cProfile; the functions with the most own time.

    python3 benchmarks/profile_cell_overhead.py [--cells 3000] [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch

dev = "cuda"
model = torch.nn.Sequential(
    torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)
).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
xb = torch.randn(256, 1024, device=dev)
yb = torch.randint(0, 10, (256,), device=dev)


def step(sync: bool = True) -> None:
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if sync:
        torch.cuda.synchronize()


def timed(fn, before=None, n=2000):
    out = []
    for _ in range(n):
        if before:
            before()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e6


def primitives() -> None:
    from jupyter_gpumem.collectors import Collector
    from jupyter_gpumem.collectors.host import host_rss
    from jupyter_gpumem.collectors.readings import stats_from_nested
    from jupyter_gpumem.core.tracker import CellTracker

    c = Collector()
    t = CellTracker(c)
    nv = c.backend.nvml
    nv_index = nv.nvml_index(0)
    raw = torch._C._cuda_memoryStats(0)
    mgi = torch.cuda.cudart().cudaMemGetInfo
    prims = {
        "_cuda_memoryStats": lambda: torch._C._cuda_memoryStats(0),
        "stats_from_nested": lambda: stats_from_nested(raw),
        "cudaMemGetInfo": lambda: mgi(0),
        "_cuda_getMemoryFraction": lambda: torch._C._cuda_getMemoryFraction(0),
        "_cuda_hasPrimaryContext": lambda: torch._C._cuda_hasPrimaryContext(0),
        "_cuda_resetPeakMemoryStats": lambda: torch._C._cuda_resetPeakMemoryStats(0),
        "torch.cuda.is_initialized": torch.cuda.is_initialized,
        "host_rss": host_rss,
        "nvml process_used": lambda: nv.process_used(nv_index),
        "nvml read (with processes)": lambda: nv.read(nv_index, True),
        "nvml read (no processes)": lambda: nv.read(nv_index, False),
        "measure(cell, no process)": lambda: c.measure(with_process=False, full=False),
        "measure(cell, process)": lambda: c.measure(with_process=True, full=False),
        "measure() full": c.measure,
        "tracker begin+end (-q)": lambda: (
            t.begin(),
            t.end(with_process=False, hints=False),
        ),
    }
    print(f"{'primitive':<32}{'after trivial (us)':>20}{'after train step (us)':>24}")
    for name, fn in prims.items():
        print(f"{name:<32}{timed(fn):>20.1f}{timed(fn, step, n=500):>24.1f}")
    print(f"{'train step alone':<32}{'':>20}{timed(step, n=500):>24.1f}")


def hooks() -> None:
    import timeit
    import types

    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    ip = InteractiveShell.instance()
    ip.user_ns["torch"] = torch
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    from jupyter_gpumem._ipython import current

    s = current()
    stats, reset = torch._C._cuda_memoryStats, torch._C._cuda_resetPeakMemoryStats
    mgi = torch.cuda.cudart().cudaMemGetInfo

    def floor() -> None:
        stats(0)
        mgi(0)
        reset(0)
        stats(0)
        mgi(0)

    def best(fn) -> float:
        with capture_output():
            return min(timeit.repeat(fn, number=3000, repeat=7)) / 3000 * 1e6

    print(f"\n{'hooks alone (warm)':<32}{'us per cell':>20}")
    print(f"{'floor reads':<32}{best(floor):>20.1f}")
    for mode, cell in (
        ("-q", "%%gpumem -q\na = 1"),
        ("auto", "a = 1"),
        ("full", "%%gpumem\na = 1"),
        ("idle (extension loaded)", "a = 1"),
    ):
        s.auto = mode == "auto"
        info = types.SimpleNamespace(raw_cell=cell)
        res = types.SimpleNamespace(
            info=info, execution_count=1, error_in_exec=None, error_before_exec=None
        )

        def cycle(info=info, res=res) -> None:
            s.pre_run_cell(info)
            s.post_run_cell(res)

        print(f"{mode:<32}{best(cycle):>20.1f}")
    s.auto = False
    ip.run_line_magic("unload_ext", "jupyter_gpumem")


def cells(n: int, top: int) -> None:
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    ip = InteractiveShell.instance()
    ip.user_ns["torch"] = torch
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    from jupyter_gpumem._ipython import current

    s = current()
    for mode, cell in (
        ("-q", "%%gpumem -q\na = 1"),
        ("auto", "a = 1"),
        ("full", "%%gpumem\na = 1"),
    ):
        s.auto = mode == "auto"
        pr = cProfile.Profile()
        with capture_output():
            for _ in range(200):
                ip.run_cell(cell)
            pr.enable()
            for _ in range(n):
                ip.run_cell(cell)
            pr.disable()
        s.auto = False
        out = io.StringIO()
        st = pstats.Stats(pr, stream=out)
        st.sort_stats("tottime").print_stats(top)
        print(f"\n== {mode}: {n} cells under cProfile (own time, top {top})")
        print("\n".join(out.getvalue().splitlines()[4:]))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=3000)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    step()
    primitives()
    hooks()
    cells(a.cells, a.top)
