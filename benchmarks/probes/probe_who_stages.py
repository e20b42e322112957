"""Where ``%gpumem who``'s time goes, stage by stage (GPU machine).

    python3 benchmarks/probes/probe_who_stages.py

Issue 13's case (10k tracked tensors; then also 100k other objects): the median of 15
calls of each stage on its own: PyTorch's snapshot call, our snapshot reading, the
namespace roots, the walk, the matching of references with blocks, each report.
"""

from __future__ import annotations

import gc
import statistics
import time

import torch
from who_case import add_junk, who_shell

from jupyter_gpumem.analysis.who import holdings
from jupyter_gpumem.collectors.snapshot import read_snapshot, snapshot_from_dict

ip, a = who_shell()


def timed(f, n=15):
    out = []
    for _ in range(n):
        gc.disable()
        t0 = time.perf_counter()
        r = f()
        out.append((time.perf_counter() - t0) * 1e3)
        gc.enable()
    return statistics.median(out), r


def stages() -> None:
    ms, _ = timed(lambda: torch._C._cuda_memorySnapshot((0, 0, False)))
    print(f"  torch snapshot call       {ms:7.2f} ms")
    snap_raw = torch._C._cuda_memorySnapshot((0, 0, False))
    ms, snap = timed(lambda: read_snapshot(torch))
    print(f"  read_snapshot             {ms:7.2f} ms")
    ws = a.workspace
    ms, roots = timed(lambda: ws.roots(torch.optim.Optimizer) + ws.traceback_roots())
    print(f"  roots ({len(roots)})                 {ms:7.2f} ms")
    w = a._walker(torch)
    ms, walk = timed(lambda: w.walk(roots))
    print(f"  walk ({len(walk.refs)} refs, {walk.visited} visited) {ms:7.2f} ms")
    ms, _ = timed(lambda: snapshot_from_dict(snap_raw).live_blocks(0))
    print(f"  live blocks               {ms:7.2f} ms")
    blocks = [(0, snap.live_blocks(0))]
    ms, walk = timed(lambda: w.walk(roots, blocks))
    print(f"  walk with the blocks      {ms:7.2f} ms")
    before = a.recording.before
    ms, _ = timed(lambda: holdings(snap, 0, walk.refs, a.resolver, before))
    print(f"  holdings (blocks made)    {ms:7.2f} ms")
    for by in ("variable", "line", "cell"):
        ms, _ = timed(lambda by=by: holdings(snap, 0, walk.refs, a.resolver, before).report(by))
        print(f"  holdings+report {by:8s}  {ms:7.2f} ms")
        ms, _ = timed(lambda by=by: a.who(0, by, 20))
        print(f"  who {by:8s}              {ms:7.2f} ms")


print("== 10k tensors")
stages()
add_junk(ip)
print("== 10k tensors + 100k objects")
stages()
