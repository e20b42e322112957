"""Why a batch the dry run says fits a card runs out under that card's cap: the real step's
allocator history under the cap, and the dry run's requests, written as JSON for
comparison (``--compare``), in the notebook workflow of ``tests/gpu/notebook_cases.py``.

    python3 benchmarks/probes/probe_capped_trace.py resnet50_adamw 173 OUT.json
    python3 benchmarks/probes/probe_capped_trace.py --compare OUT.json

The real side runs in a fresh process with ``_record_memory_history`` (no stacks), under
the card's cap; the dry side in another, capturing the events the dry run replays.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def real(name: str, batch: int, cap: int) -> dict:
    import torch

    from tests.gpu import notebook_cases as nc

    build, step, *_ = nc.CASES[name]
    torch.cuda.init()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(cap / total)
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, context=None, stacks="python")
    ns: dict = {"torch": torch, "batch": batch}
    oom = None
    try:
        exec(build, ns)
        exec(step, ns)
        torch.cuda.synchronize()
    except torch.OutOfMemoryError as e:
        oom = str(e)[:400]
    snap = torch.cuda.memory._snapshot()
    entries = [
        {k: e.get(k) for k in ("action", "addr", "size", "stream")}
        for e in snap["device_traces"][0]
    ]
    return {"oom": oom, "entries": entries, "cap": cap}


def dry(name: str, batch: int) -> dict:
    from jupyter_gpumem.collectors.dry_run import Alloc
    from jupyter_gpumem.core import dry_run as core
    from tests.gpu import notebook_cases as nc

    captured: list = []
    orig = core.predict

    def predict(events, *a, **k):
        captured.append(list(events))
        return orig(events, *a, **k)

    core.predict = predict
    nc.predicted(name, batch)
    events = captured[-1]
    out = []
    for e in events:
        if isinstance(e, Alloc):
            out.append(["a", e.key, e.nbytes, e.device, e.op])
        else:
            out.append(["f", e.key])
    return {"events": out}


def main() -> None:
    if sys.argv[1] == "--one":
        how, name, batch = sys.argv[2], sys.argv[3], int(sys.argv[4])
        if how == "real":
            print(json.dumps(real(name, batch, int(sys.argv[5]))))
        else:
            print(json.dumps(dry(name, batch)))
        return
    if sys.argv[1] == "--compare":
        compare(sys.argv[2])
        return
    name, batch, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    from tests.gpu import notebook_cases as nc

    cap = nc.cap_of(nc.CASES[name][3])
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = {
        how: subprocess.Popen(
            [sys.executable, __file__, "--one", how, name, str(batch), str(cap)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for how in ("real", "dry")
    }  # fmt: skip
    out = {"case": name, "batch": batch}
    for how, p in procs.items():
        so, se = p.communicate(timeout=500)
        out[how] = json.loads(so.strip().splitlines()[-1]) if p.returncode == 0 else se[-3000:]
    with open(path, "w") as f:
        json.dump(out, f)


def compare(path: str) -> None:
    from jupyter_gpumem.analysis.caching import AllocatorConfig, replay
    from jupyter_gpumem.analysis.caching.replay import Alloc, Free, requests_from_trace

    d = json.load(open(path))
    real, dryd = d["real"], d["dry"]
    cap = real["cap"]
    reqs = requests_from_trace(real["entries"])
    capped = replay(reqs, AllocatorConfig.from_conf("", cap=cap))
    free = replay(reqs, AllocatorConfig.from_conf(""))
    print("real oom:", real["oom"])
    print("real requests:", len(reqs), "model on real requests, capped ooms:", capped.ooms[:2])
    print("  uncapped peaks", free.peak_allocated, free.peak_reserved)
    dreqs = []
    where = {}
    for e in dryd["events"]:
        if e[0] == "a":
            if e[2]:
                where[e[1]] = 1
                dreqs.append(Alloc(e[1], e[2], 0))
        elif e[1] in where:
            dreqs.append(Free(e[1]))
    dc = replay(dreqs, AllocatorConfig.from_conf("", cap=cap))
    df = replay(dreqs, AllocatorConfig.from_conf(""))
    print(
        "dry requests:",
        len(dreqs),
        "capped ooms:",
        dc.ooms[:2],
        "peak res capped",
        dc.peak_reserved,
    )
    print("  uncapped peaks", df.peak_allocated, df.peak_reserved)
    ra = [r.size for r in reqs if isinstance(r, Alloc)]
    da = [r.size for r in dreqs if isinstance(r, Alloc)]
    print("allocs real", len(ra), "dry", len(da))
    for i, (x, y) in enumerate(zip(ra, da, strict=False)):
        if x != y:
            print(
                "first differing alloc",
                i,
                x,
                y,
                "real next",
                ra[i : i + 8],
                "dry next",
                da[i : i + 8],
            )
            break
    segs = [
        (e["action"], e["size"])
        for e in real["entries"]
        if "segment" in e["action"] or e["action"] == "oom"
    ]
    print("real segment actions:", len(segs), segs[-30:])


if __name__ == "__main__":
    main()
