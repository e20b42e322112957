"""Record what a ``--breakdown`` cell's analysis reads, on a real GPU, with ground truth;
or (``--scan-cases``) scan three real models and check each answer against the truth.

Run on the GPU machine:  python3 tests/gpu/record_planning.py tests/fixtures/breakdown.json

``python3 tests/gpu/record_planning.py --scan-cases [OUT.jsonl] [CASE ...]`` (from the
repository root) runs ``%%gpumem --scan`` on the real-model cases of
``tests/gpu/planning_cases.py`` (a Llama-architecture decoder with AdamW in bf16,
ResNet-50 under ``inference_mode``, ResNet-50 with AdamW), finds each true largest value
by bisection with real runs under the same cap, and prints one JSON line per case (also
appended to OUT.jsonl when given): the answer, the truth and the error in %. It exits 1
when an answer is not within 3 % below the truth. About a minute on an H100 or H200.
Each case runs in a real IPython shell with the extension loaded; the arguments the
analysis received (the allocator's trace of the cell, the blocks alive at the end, the
hooks' observations and marks, the counters) are kept next to the truth measured with
torch itself (the tensors' storage sizes, the allocator's peak counter). The CPU tests
(tests/test_breakdown_recorded.py) replay them through analysis/breakdown.py.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

SETUP = """
import torch, torch.nn as nn
torch.manual_seed(0)
mlp = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                    nn.Linear(4096, 1024)).cuda()
opt = torch.optim.AdamW(mlp.parameters())
x = torch.randn(256, 1024, device="cuda")
_w = torch.ones(64, 64, device="cuda") @ torch.ones(64, 64, device="cuda"); del _w
"""

CASES = {
    "forward": "%%gpumem --breakdown -o rep\nout = mlp(x)",
    "first_adamw_step": (
        "%%gpumem --breakdown -o rep\nloss = mlp(x).square().mean()\nloss.backward()\nopt.step()"
    ),
}


def r512(n: int) -> int:
    return -(-n // 512) * 512


def main(path: str) -> None:
    from jupyter_gpumem.core import breakdown

    captured: dict = {}
    original = breakdown.breakdowns_from_raw

    def spy(raw, record, report):
        captured["record"] = record
        captured["raw"] = raw
        return original(raw, record, report)

    breakdown.breakdowns_from_raw = spy  # type: ignore[assignment]
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "cases": {}}
    for name, code in CASES.items():
        with capture_output():
            ip.run_cell(SETUP)
            torch.cuda.empty_cache()
            ip.run_cell(code)
        rep = ip.user_ns["rep"]
        rec, raw = captured["record"], captured["raw"]
        d = rep.device(0)
        events = [
            [e["action"], int(e.get("addr", 0)), int(e.get("size", 0)), int(e.get("time_us", 0))]
            for e in raw["device_traces"][0]
            if e["action"]
            in (
                "alloc",
                "free_requested",
                "free_completed",
                "segment_alloc",
                "segment_free",
                "segment_map",
                "segment_unmap",
            )
        ]
        alive = [
            [b["address"], b["size"]]
            for s in raw["segments"]
            if s.get("device", 0) == 0
            for b in s["blocks"]
            if b["state"] == "active_allocated"
        ]
        mlp = ip.user_ns["mlp"]
        opt = ip.user_ns["opt"]
        state = [v for s in opt.state.values() for v in s.values() if v.is_cuda]
        out["cases"][name] = {
            "begin_segments": rec.begin_segments,
            "settings": raw.get("allocator_settings") or {},
            "events": events,
            "alive_at_end": alive,
            "observations": [list(o) for o in rec.observations],
            "marks": [[{str(k): v for k, v in m.positions.items()}, m.phase] for m in rec.marks],
            "calls": [list(c) for c in rec.calls],
            "end_positions": {str(k): v for k, v in rec.end_positions.items()},
            "base": d.before.allocator.allocated,
            "base_reserved": d.before.allocator.reserved,
            "counter_peak": d.peak_allocated,
            "truth": {
                "parameters": sum(r512(p.untyped_storage().nbytes()) for p in mlp.parameters()),
                "optimizer_state": sum(r512(t.untyped_storage().nbytes()) for t in state),
                "breakdown": dataclasses.asdict(rep.breakdowns[0]) if rep.breakdowns else None,
            },
        }
        for k in ("mlp", "opt", "x", "out", "loss", "rep"):
            ip.user_ns.pop(k, None)
        import gc

        gc.collect()
        torch.cuda.empty_cache()
    with open(path, "w") as f:
        json.dump(out, f)
    print(
        f"wrote {path}: "
        + ", ".join(f"{k} {len(v['events'])} events" for k, v in out["cases"].items())
    )


def scan_cases(out: str | None, names: list[str]) -> int:
    import importlib.util
    import os
    import time

    sys.path.insert(0, os.getcwd())  # tests.gpu.planning_cases, from the repository root
    from tests.gpu.planning_cases import REAL_CASES, scan_real_case

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    with capture_output():
        ip.run_cell("import torch, gc\ntorch.empty(0, device='cuda:0')")
        # cuBLAS and cuBLASLt keep a workspace from their first matmul on: before the scans
        ip.run_cell(
            "_o = torch.ones(64, 64, device='cuda')\n"
            "_w = _o @ _o; _w = torch.nn.functional.linear(_o, _o, _o[0])\n"
            "del _o, _w; torch.cuda.empty_cache()"
        )
    bad = 0
    started = time.perf_counter()
    for case in REAL_CASES:
        if names and case.name not in names:
            continue
        if importlib.util.find_spec(case.needs) is None:
            print(json.dumps({"test": "scan_real", "case": case.name, "skipped": case.needs}))
            continue
        record = scan_real_case(ip, torch, case)
        line = json.dumps(record)
        print(line, flush=True)
        if out:
            with open(out, "a") as f:
                f.write(line + "\n")
        bad += not record["within_3pct"]
    print(
        json.dumps({"test": "scan_real", "failed": bad, "seconds": time.perf_counter() - started})
    )
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--scan-cases":
        rest = sys.argv[2:]
        out = rest.pop(0) if rest and rest[0].endswith(".jsonl") else None
        sys.exit(scan_cases(out, rest))
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/breakdown.json")
