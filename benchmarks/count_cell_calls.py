"""Python calls and profiled time per measured cell, without a GPU: an A/B of the per-cell
path between two trees, deterministic where timings on a GPU machine are noisy.

    python3 benchmarks/count_cell_calls.py [--base DIR] [--cells 4000]

Each tree runs in a fresh process with a real IPython shell, against a stand-in for a CUDA
build of torch with one started GPU (its allocator figures fixed), so the cell takes the
reading path it takes on a GPU (``torch._C._cuda_memoryStats``, ``cudaMemGetInfo``) minus
the time of those calls themselves. Per configuration: the calls a cell adds over a bare
cell (``cProfile``'s count, every function included: the same on every run), the
profiled time per cell (±15 us from run to run on a 2-core machine), and our two cell
hooks alone (``pre_run_cell`` + ``post_run_cell`` called directly, best of 9 x 3000:
within about 1 us from run to run). NVML is not read (the
stand-in has no driver); ``bench_cell_overhead.py`` on the GPU machine measures the whole
cost.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

STAND_IN = """
import types
__version__ = "2.11.0+cu130"
version = types.SimpleNamespace(cuda="13.0", hip=None)
def _stat(v):
    return {k: {"current": v, "peak": v, "allocated": v, "freed": 0}
            for k in ("all", "small_pool", "large_pool")}
def _memory_stats(i):
    return {"allocated_bytes": _stat(50 << 20), "reserved_bytes": _stat(64 << 20),
            "active_bytes": _stat(50 << 20), "inactive_split_bytes": _stat(0),
            "requested_bytes": _stat(50 << 20), "allocation": _stat(10), "segment": _stat(3),
            "active": _stat(10), "inactive_split": _stat(0), "num_alloc_retries": 0,
            "num_ooms": 0, "num_device_alloc": 3, "num_device_free": 0}
_C = types.SimpleNamespace(
    _cuda_memoryStats=_memory_stats, _cuda_hasPrimaryContext=lambda i: True,
    _cuda_resetPeakMemoryStats=lambda i: None, _cuda_getMemoryFraction=lambda i: 1.0,
    _cuda_cudaCachingAllocator_is_enabled=lambda: True)
class _Cudart:
    def cudaMemGetInfo(self, i):
        return (0, 70 << 30, 80 << 30)
cuda = types.SimpleNamespace(
    is_initialized=lambda: True, device_count=lambda: 1, current_device=lambda: 0,
    get_device_name=lambda i=0: "stand-in GPU", mem_get_info=lambda i=0: (70 << 30, 80 << 30),
    cudart=lambda: _Cudart(), synchronize=lambda i=None: None)
"""

CHILD = r"""
import contextlib, cProfile, io, json, pstats, sys, timeit, types
sys.path.insert(0, sys.argv[1])
import torch  # the stand-in
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
n = int(sys.argv[2])
sh = InteractiveShell.instance()
sh.run_line_magic("load_ext", "jupyter_gpumem")
from jupyter_gpumem._ipython import current
session = current()
out = {}
for name, cell in (("%%gpumem -q", "%%gpumem -q\na = 1"), ("%%gpumem", "%%gpumem\na = 1")):
    with contextlib.redirect_stdout(io.StringIO()):
        sh.run_cell("import torch")
        for _ in range(300):
            sh.run_cell(cell)
        ours, bare = cProfile.Profile(), cProfile.Profile()
        for prof, src in ((ours, cell), (bare, "a = 1")):
            prof.enable()
            for _ in range(n):
                sh.run_cell(src)
            prof.disable()
    a, b = pstats.Stats(ours), pstats.Stats(bare)
    info = types.SimpleNamespace(raw_cell=cell)
    res = types.SimpleNamespace(
        info=info, execution_count=1, error_in_exec=None, error_before_exec=None
    )

    def cycle():
        session.pre_run_cell(info)
        session.post_run_cell(res)

    with capture_output():
        hooks = min(timeit.repeat(cycle, number=3000, repeat=9)) / 3000 * 1e6
    out[name] = {
        "calls_added": round((a.total_calls - b.total_calls) / n, 2),
        "profiled_us_added": round((a.total_tt - b.total_tt) / n * 1e6, 1),
        "hooks_us_best": round(hooks, 1),
    }
print(json.dumps(out))
"""


def run(tree: str, stand_in: str, cells: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    p = subprocess.run(
        [sys.executable, "-c", CHILD, stand_in, str(cells)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(p.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="another tree holding jupyter_gpumem/ (the A of an A/B)")
    ap.add_argument("--cells", type=int, default=4000)
    ap.add_argument("--json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        os.mkdir(os.path.join(d, "torch"))
        with open(os.path.join(d, "torch", "__init__.py"), "w") as f:
            f.write(STAND_IN)
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        results = {"this tree": run(here, d, args.cells)}
        if args.base:
            results["base"] = run(args.base, d, args.cells)
    for tree, r in results.items():
        for config, v in r.items():
            print(
                f"{tree:10} {config:12} +{v['calls_added']:7.2f} calls  "
                f"+{v['profiled_us_added']:6.1f} us profiled  "
                f"hooks alone {v['hooks_us_best']:5.1f} us"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
