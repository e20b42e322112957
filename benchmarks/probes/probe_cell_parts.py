"""What each part of a measured cell's bookkeeping costs (GPU machine, one process).

    python3 benchmarks/probes/probe_cell_parts.py [q|auto|full]

Calls our cell hooks directly (``pre_run_cell`` + ``post_run_cell`` of a trivial cell,
warm, best of 9 x 3000) and then again with one part replaced by a constant or a no-op;
the difference is what that part costs. Real torch, real readings.
"""

from __future__ import annotations

import sys
import timeit
import types

import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import jupyter_gpumem.collectors as col
import jupyter_gpumem.collectors.allocator as al
import jupyter_gpumem.core.tracker as trk
from jupyter_gpumem._ipython import current
from jupyter_gpumem._ipython import session as sess

torch.empty(1, device="cuda")
ip = InteractiveShell.instance()
ip.user_ns["torch"] = torch
ip.run_line_magic("load_ext", "jupyter_gpumem")
s = current()
mode = sys.argv[1] if len(sys.argv) > 1 else "q"
raw = {"q": "%%gpumem -q\na = 1", "auto": "a = 1", "full": "%%gpumem\na = 1"}[mode]
s.auto = mode == "auto"
info = types.SimpleNamespace(raw_cell=raw)
res = types.SimpleNamespace(
    info=info, execution_count=5, error_in_exec=None, error_before_exec=None
)


def cycle() -> None:
    s.pre_run_cell(info)
    s.post_run_cell(res)


def best() -> float:
    with capture_output():
        return min(timeit.repeat(cycle, number=3000, repeat=9)) / 3000 * 1e6


def floor() -> None:
    stats, reset = torch._C._cuda_memoryStats, torch._C._cuda_resetPeakMemoryStats
    mgi = torch.cuda.cudart().cudaMemGetInfo
    stats(0)
    mgi(0)
    reset(0)
    stats(0)
    mgi(0)


def without(name: str, obj: object, attr: str, value: object) -> None:
    had = attr in getattr(obj, "__dict__", {})
    old = getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        v = best()
    finally:
        if had or isinstance(obj, types.ModuleType):
            setattr(obj, attr, old)
        else:
            delattr(obj, attr)
    print(f"  {name:<34}{base - v:>8.2f}")


with capture_output():
    floor_us = min(timeit.repeat(floor, number=3000, repeat=9)) / 3000 * 1e6
base = best()
print(f"mode {mode}: hooks {base:.1f} us, the floor's reads alone {floor_us:.1f} us")
print("  part (replaced by a constant)         saves us")
stats = al.stats_from_nested(torch._C._cuda_memoryStats(0))
b = s.collector.backend._bound
without("host_rss (2 reads)", col, "host_rss", lambda: 1)
without("stats_from_nested (2)", al, "stats_from_nested", lambda d: stats)
without("memory fraction (2)", b, "get_fraction", None)
without("caching switch (2)", b, "caching_fn", None)
without("workers channel", s.tracker, "workers", None)
without("history.add", s.history, "add", lambda r: None)
without("first_code_line", sess, "first_code_line", lambda r: "a = 1")
without("postmortems.enrich", s.postmortems, "enrich", lambda r, e, hints, code, scans: r)
without("show_report", sess, "show_report", lambda *a, **k: None)
without("_touched", trk, "_touched", lambda d: False)
without("hints", trk, "with_hints", lambda r: r)
