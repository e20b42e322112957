"""What the space-and-time views cost, on a real GPU.

    python3 benchmarks/bench_views.py [--json out.json]

1. The segment map (`%gpumem segments`): snapshot + map + SVG, with 1k and 10k live blocks
   of mixed sizes, tracking on (target: under 100 ms at 10k blocks).
2. Recording the full history (`%%gpumem --trace`): cost per alloc/free pair, off vs on.
3. A traced cell of 10k allocations: stopping the trace (the snapshot with its entries),
   building the timeline and drawing it; the size of the memory_viz file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output


def median_ms(fn, n=5):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def bench_segments(ip, attributor) -> dict:
    from jupyter_gpumem.collectors.snapshot import read_snapshot
    from jupyter_gpumem.reporters.segments import segments_html

    out = {}
    for n in (1_000, 10_000):
        with capture_output():
            ip.run_cell("import gc; gc.collect(); torch.cuda.empty_cache()")
            ip.run_cell("%gpumem track on")
            ip.run_cell(
                f"g = torch.Generator().manual_seed(0)\n"
                f"live = [torch.empty(int(s), dtype=torch.uint8, device='cuda') for s in"
                f" torch.randint(512, 4 << 20, ({n},), generator=g)]"
            )
        snap = read_snapshot(torch)
        blocks = sum(len(s["blocks"]) for s in snap.segments)
        html = segments_html(attributor.segment_maps(0, 200))
        out[f"{n} tensors"] = {
            "blocks": blocks,
            "segments": len(snap.segments),
            "snapshot_ms": median_ms(lambda: read_snapshot(torch)),
            # %gpumem segments: the 200 largest segments drawn, the summary over all
            "snapshot+map+svg_ms": median_ms(
                lambda: segments_html(attributor.segment_maps(0, 200))
            ),
            "all segments drawn (--all)_ms": median_ms(
                lambda: segments_html(attributor.segment_maps(0))
            ),
            "html_bytes": len(html),
        }
        with capture_output():
            ip.run_cell("del live")
            ip.run_cell("%gpumem track off")
    return out


def pair_us(n=100_000) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        t = torch.empty(1024, device="cuda")
        del t
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def bench_trace_pairs() -> dict:
    res: dict = {"off": [], "trace (all, python stacks)": []}
    for _ in range(3):
        torch.cuda.memory._record_memory_history(enabled=None)
        pair_us(10_000)
        res["off"].append(pair_us())
        torch.cuda.memory._record_memory_history(
            enabled="all", context="all", stacks="python", max_entries=20_000
        )
        pair_us(10_000)
        res["trace (all, python stacks)"].append(pair_us())
    torch.cuda.memory._record_memory_history(enabled=None)
    return {k: statistics.median(v) for k, v in res.items()}


def bench_trace_cell(ip, session, tmp="/tmp/gpumem_bench_trace.pickle") -> dict:

    from jupyter_gpumem.reporters.timeline import timeline_html

    if os.path.exists(tmp):
        os.remove(tmp)
    code = "xs = [torch.empty(4096, device='cuda') for _ in range(5_000)]\ndel xs"
    with capture_output():
        t0 = time.perf_counter()
        ip.run_cell(
            f"%%gpumem -q --trace --entries 20000 --save {tmp} -o rep\n{code}", store_history=True
        )
        traced = time.perf_counter() - t0
        t0 = time.perf_counter()
        ip.run_cell(f"%%gpumem -q -o rep0\n{code}", store_history=True)
        plain = time.perf_counter() - t0
    rep = ip.user_ns["rep"]
    (t,) = rep.trace.timelines
    render = median_ms(lambda: timeline_html(t))
    return {
        "events": len(t.active),
        "entries": t.entries,
        "cell_plain_ms": plain * 1e3,
        "cell_traced_ms": traced * 1e3,
        "stop+snapshot_ms": t.snapshot_ms,
        "timeline_svg_ms": render,
        "memory_viz_file_bytes": rep.trace.saved_bytes,
        "svg_bytes": len(timeline_html(t)),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    ip = InteractiveShell.instance()
    with capture_output():
        ip.run_cell("import torch\ntorch.empty(0, device='cuda')")
        ip.run_line_magic("load_ext", "jupyter_gpumem")
    from jupyter_gpumem._ipython import current

    s = current()
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    out["segments"] = bench_segments(ip, s.who)
    out["trace_pair_us"] = bench_trace_pairs()
    out["trace_cell"] = bench_trace_cell(ip, s)
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
