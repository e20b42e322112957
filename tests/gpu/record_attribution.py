"""Record allocator snapshots with allocation sites on a real GPU, with ground truth.

Run on the GPU machine:
  python3 tests/gpu/record_attribution.py jupyter_gpumem/testing/recorded/attribution.json
It runs notebook-like cells in a real IPython shell with the extension loaded and tracking
on, and keeps what the analyses read (the snapshot with frames, the namespace walk's
references, IPython's cell file names and their source lines, the library folders of that
machine) next to the ground truth measured with torch itself (bytes each name or line
allocated). The CPU tests (tests/test_attribution_recorded.py) feed the records through
the analyses and compare with that truth.
"""

from __future__ import annotations

import json
import linecache
import sys

import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

MiB = 1 << 20


def run(ip, code):
    with capture_output():
        return ip.run_cell(code, store_history=True)


def block_bytes(tensors):
    """The sizes of the allocator blocks of these tensors' storages, from torch's snapshot."""
    sizes = {
        b["address"]: b["size"]
        for s in torch.cuda.memory_snapshot()
        for b in s["blocks"]
        if b["state"] == "active_allocated"
    }
    return sum(sizes[p] for p in {t.untyped_storage().data_ptr() for t in tensors})


def trimmed(segments, cell_files):
    """Keep device-0 segments; drop frames outside the outermost cell frame (IPython's
    machinery), which no analysis reads."""
    out = []
    for s in segments:
        if s.get("device", 0) != 0:
            continue
        s = dict(s)
        s.pop("frames", None)
        blocks = []
        for b in s["blocks"]:
            b = dict(b)
            frames = b.get("frames", [])
            last = max(
                (i for i, f in enumerate(frames) if f["filename"] in cell_files),
                default=len(frames) - 1,
            )
            b["frames"] = [dict(f) for f in frames[: last + 1]]
            blocks.append(b)
        s["blocks"] = blocks
        out.append(s)
    return out


def record_state(ip, session, truth, extra=None):
    from jupyter_gpumem._ipython.cells import namespace_roots, traceback_roots
    from jupyter_gpumem.analysis.sites import default_library_dirs
    from jupyter_gpumem.collectors.snapshot import read_snapshot

    fmap = dict(ip.compile._filename_map)
    cell_files = set(fmap)
    snap = read_snapshot(torch)
    walker = session.attributor._walker(torch)
    w = walker.walk(namespace_roots(ip, torch.optim.Optimizer) + traceback_roots(ip))
    lines = {
        f: {
            str(i): linecache.getline(f, i).rstrip("\n")
            for i in range(1, 40)
            if linecache.getline(f, i)
        }
        for f in cell_files
    }
    rec = {
        "segments": trimmed(snap.segments, cell_files),
        "allocator_settings": snap.settings,
        "filename_map": fmap,
        "lines": lines,
        "library_dirs": list(default_library_dirs()),
        "before": [list(k) for k in session.attributor.recording.before if k[0] == 0],
        "refs": [
            [r.device, r.address, r.nbytes, r.owner, r.via, r.path, r.order]
            for r in w.refs
            if r.device == 0
        ],
        "allocated": torch.cuda.memory_allocated(0),
        "truth": truth,
    }
    rec.update(extra or {})
    return rec


def main(path: str) -> None:
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    from jupyter_gpumem._ipython import current

    session = current()
    run(ip, "import torch\ntorch.empty(0, device='cuda')\ntorch.cuda.empty_cache()")
    run(ip, "%gpumem track on")
    out: dict = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}

    # -- cells: lines, a function from another cell, modules, Out, a view, the leak -------
    truth: dict = {"owners": {}, "lines": {}, "cells": {}}
    r = run(
        ip,
        "a = torch.empty(3 << 20, dtype=torch.uint8, device='cuda')\n# a comment\n"
        "b = torch.empty(5 << 20, dtype=torch.uint8, device='cuda')",
    )
    truth["lines"][f"In[{r.execution_count}] line 1"] = 3 * MiB
    truth["lines"][f"In[{r.execution_count}] line 3"] = 5 * MiB
    truth["owners"]["a|tensor"] = 3 * MiB
    truth["owners"]["b|tensor"] = 5 * MiB
    d = run(ip, "def make(n):\n    return torch.zeros(n, dtype=torch.uint8, device='cuda')")
    r = run(ip, "y = make(7 << 20)")
    truth["lines"][f"In[{d.execution_count}] line 2"] = 7 * MiB
    truth["cells"][f"In[{r.execution_count}]"] = 7 * MiB
    truth["owners"]["y|tensor"] = 7 * MiB
    run(
        ip,
        "model = torch.nn.Linear(1024, 1024).cuda()\n"
        "opt = torch.optim.Adam(model.parameters())\n"
        "model(torch.ones(8, 1024, device='cuda')).sum().backward()\nopt.step()",
    )
    # what the allocator counts for them: their blocks (unsplit remainders included)
    model, opt = ip.user_ns["model"], ip.user_ns["opt"]
    params = list(model.parameters())
    truth["owners"]["model|module parameters"] = block_bytes(params)
    truth["owners"]["model|gradients"] = block_bytes([p.grad for p in params])
    truth["owners"]["opt|optimizer state"] = block_bytes(
        [v for s in opt.state.values() for v in s.values() if v.is_cuda]
    )
    r = run(ip, "torch.ones(1 << 20, device='cuda')")
    truth["owners"][f"Out[{r.execution_count}]|output history"] = 4 * MiB
    run(ip, "base = torch.empty(64 << 20, dtype=torch.uint8, device='cuda')\nview = base[1024:]")
    truth["owners"]["base|tensor"] = 64 * MiB
    run(
        ip,
        "net = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),"
        " torch.nn.Linear(4096, 1)).cuda()\nxb = torch.randn(512, 1024, device='cuda')\n"
        "net(xb).sum().item()\ntotal = torch.zeros((), device='cuda')",
    )
    before_leak = torch.cuda.memory_allocated(0)
    step = 512 * 4096 * 4 + 2048
    leak = "%%gpumem -q -o rep\nloss = net(xb).square().mean()\ntotal = total + loss\ndel loss"
    for _ in range(2):
        run(ip, leak)
    from jupyter_gpumem.analysis.cell_sites import live_blocks_by_device
    from jupyter_gpumem.collectors.snapshot import read_snapshot

    known = live_blocks_by_device(read_snapshot(torch)).get(0, {})
    r = run(ip, leak)
    truth["owners"]["total|autograd graph"] = torch.cuda.memory_allocated(0) - before_leak
    assert truth["owners"]["total|autograd graph"] == 3 * step
    truth["last_cell"] = {
        "execution_count": r.execution_count,
        "kept": ip.user_ns["rep"].device(0).allocated_delta,
        "lines": [[2, step], [3, 512]],
    }
    out["cells"] = record_state(
        ip,
        session,
        truth,
        {
            "known_before_last_cell": [[0, a, size] for a, size in known.items()],
        },
    )

    # -- an OOM with a planted fragmentation -----------------------------------------------
    for name in ("a", "b", "y", "model", "opt", "base", "view", "net", "xb", "total", "rep"):
        ip.user_ns.pop(name, None)
    ip.user_ns["Out"].clear()
    for name in ("_", "__", "___"):
        ip.user_ns[name] = ""
    run(ip, "import gc; gc.collect(); torch.cuda.empty_cache()")
    run(
        ip,
        "big = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); del big\n"
        "blocks = [torch.empty(64 << 20, dtype=torch.uint8, device='cuda')"
        " for _ in range(16)]\n"
        "for i in range(0, 16, 2): blocks[i] = None",
    )
    cap = torch.cuda.memory_reserved(0) + 32 * MiB
    run(ip, f"%gpumem limit {cap}B")
    r = run(ip, "y = torch.empty(128 << 20, dtype=torch.uint8, device='cuda')")
    assert isinstance(r.error_in_exec, torch.OutOfMemoryError)
    oom = session.collector.ooms[-1]
    dev = session.collector.measure().device(0)
    out["oom_fragmentation"] = record_state(
        ip,
        session,
        {
            "largest_free_block": 64 * MiB,
            "pieces_64mib": 8,
            "blocks_bytes": 8 * 64 * MiB,
            "first_fix": "fragmentation",
        },
        {
            "oom": [oom.device, oom.requested, oom.allowed, oom.free],
            "device": {
                "total": dev.total,
                "device_used": dev.device_used,
                "process_used": dev.process_used,
            },
        },
    )
    run(ip, "%gpumem limit off")
    run(ip, "%gpumem release-traceback")
    run(ip, "del blocks; import gc; gc.collect(); torch.cuda.empty_cache()")

    # -- a traced region (history "all"): a kept block and a transient ---------------------
    torch.cuda.memory._record_memory_history(enabled=None)
    torch.cuda.memory._record_memory_history(
        enabled="all", context="all", stacks="python", max_entries=2000, clear_history=True
    )
    start = torch.cuda.memory_allocated(0)
    r = run(
        ip,
        "kept = torch.empty(64 << 20, dtype=torch.uint8, device='cuda')\n"
        "tmp = torch.empty(256 << 20, dtype=torch.uint8, device='cuda')\n"
        "del tmp",
    )
    s = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled="state", context="state", stacks="python")
    fmap = dict(ip.compile._filename_map)
    traces = [dict(e) for e in s["device_traces"][0]]
    for e in traces:
        last = max(
            (i for i, f in enumerate(e.get("frames", [])) if f["filename"] in fmap),
            default=len(e.get("frames", [])) - 1,
        )
        e["frames"] = [dict(f) for f in e.get("frames", [])[: last + 1]]
    out["trace"] = {
        "segments": trimmed(s["segments"], set(fmap)),
        "device_traces": [traces],
        "allocator_settings": s.get("allocator_settings", {}),
        "filename_map": fmap,
        "lines": {
            f: {
                str(i): linecache.getline(f, i).rstrip("\n")
                for i in range(1, 10)
                if linecache.getline(f, i)
            }
            for f in fmap
        },
        "library_dirs": out["cells"]["library_dirs"],
        "truth": {
            "start": start,
            "peak_above_start": (64 + 256) * MiB,
            "kept": 64 * MiB,
            "execution_count": r.execution_count,
            "kept_line": 1,
            "transient_line": 2,
        },
    }
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {path}: {sum(len(json.dumps(v)) for v in out.values()) // 1024} KiB")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "jupyter_gpumem/testing/recorded/attribution.json")
