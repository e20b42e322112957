"""Probe: PyTorch allocator history APIs on this machine (run on the GPU machine).

A one-off exploration kept for the record: the facts behind collectors/_snapshot.py and
the attribution design (context creation, costs, OOM behaviour, trace format).
    python3 benchmarks/probes/probe_history.py   (writes $OUT/probe_history.json)
"""
# ruff: noqa: E402, E501, E741

import inspect
import json
import os
import subprocess
import sys
import textwrap
import time

import torch

out = {}


def note(k, v):
    out[k] = v
    print(k, "=", v, flush=True)


note("torch", torch.__version__)
note("sig_record", str(inspect.signature(torch.cuda.memory._record_memory_history)))
note("sig_memory_snapshot", str(inspect.signature(torch.cuda.memory.memory_snapshot)))
for name in [
    "_cuda_isHistoryEnabled",
    "_cuda_allocationTraceback",
    "_cuda_memorySnapshot",
    "_cuda_record_memory_history",
    "_cuda_attach_out_of_memory_observer",
    "_cuda_hasPrimaryContext",
    "_cuda_cudaCachingAllocator_is_enabled",
]:
    note("has_" + name, hasattr(torch._C, name))
note("has__allocation_traceback", hasattr(torch.cuda.memory, "_allocation_traceback"))
note("has_lazy_call", hasattr(torch.cuda, "_lazy_call"))

# 1. Does recording before CUDA init create a context? Does a lazily queued call work?
script = textwrap.dedent("""
import torch, json, sys
r = {}
mode = sys.argv[1]
if mode == "direct":
    torch.cuda.memory._record_memory_history(enabled="state", stacks="python")
    r["init_after_record"] = torch.cuda.is_initialized()
elif mode == "lazy":
    torch.cuda._lazy_call(lambda: torch.cuda.memory._record_memory_history(enabled="state", stacks="python"))
    r["init_after_queue"] = torch.cuda.is_initialized()
def make():
    return torch.empty(1 << 20, device="cuda")
x = make()
s = torch.cuda.memory._snapshot()
blocks = [b for seg in s["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"]
r["n_active"] = len(blocks)
r["frames_of_x"] = [b["frames"] for b in blocks if b["address"] == x.untyped_storage().data_ptr()]
r["block_keys"] = sorted(blocks[0].keys()) if blocks else None
r["segment_keys"] = sorted(s["segments"][0].keys())
r["snapshot_keys"] = sorted(s.keys())
print("JSON" + json.dumps(r, default=str))
""")
for mode in ["direct", "lazy", "none"]:
    p = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True)
    line = [l for l in p.stdout.splitlines() if l.startswith("JSON")]
    note("init_probe_" + mode, json.loads(line[0][4:]) if line else p.stderr[-2000:])

torch.empty(0, device="cuda")
if hasattr(torch._C, "_cuda_isHistoryEnabled"):
    note("history_enabled_initially", torch._C._cuda_isHistoryEnabled())


# 2. Cost per alloc/free pair (small tensor: cached), off / state / all
def pair_cost(n=200000, size=1024):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        t = torch.empty(size, device="cuda")
        del t
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def deep(k, f):
    return f() if k == 0 else deep(k - 1, f)


res = {}
for mode in [None, "state", "all"]:
    torch.cuda.memory._record_memory_history(
        enabled=mode, stacks="python", max_entries=100000
    ) if mode else torch.cuda.memory._record_memory_history(enabled=None)
    pair_cost(20000)
    res[str(mode)] = [round(pair_cost(), 3) for _ in range(3)]
    res[str(mode) + "_deep20"] = round(deep(20, lambda: pair_cost(50000)), 3)
torch.cuda.memory._record_memory_history(enabled=None)
note("pair_cost_us", res)


# 3. training step: small MLP (many small kernels) and a larger one
def make_step(width, depth, batch):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    m = torch.nn.Sequential(*layers).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = torch.randn(batch, width, device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = m(x).square().mean()
        loss.backward()
        opt.step()

    return step


def time_step(step, n=300):
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) / n * 1e3)
    return sorted(ts)[2]


steps = {"mlp_small": make_step(512, 8, 64), "mlp_big": make_step(4096, 8, 512)}
tr = {}
for name, step in steps.items():
    rows = []
    for _rnd in range(4):
        for mode in [None, "state"]:
            if mode:
                torch.cuda.memory._record_memory_history(enabled="state", stacks="python")
            else:
                torch.cuda.memory._record_memory_history(enabled=None)
            rows.append((str(mode), time_step(step)))
    torch.cuda.memory._record_memory_history(enabled=None)
    tr[name] = rows
note("train_step_ms", tr)

# 4. snapshot cost vs blocks, with and without frames
snap = {}
for mode in [None, "state"]:
    if mode:
        torch.cuda.memory._record_memory_history(enabled="state", stacks="python")
    else:
        torch.cuda.memory._record_memory_history(enabled=None)
    for n in [1000, 10000]:
        keep = [deep(15, lambda: torch.empty(256, device="cuda")) for _ in range(n)]
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            s = torch.cuda.memory._snapshot()
            ts.append((time.perf_counter() - t0) * 1e3)
        snap[f"{mode}_{n}_snapshot_ms"] = round(sorted(ts)[2], 3)
        try:
            t0 = time.perf_counter()
            s2 = torch.cuda.memory_snapshot(include_traces=False)
            snap[f"{mode}_{n}_memory_snapshot_notraces_ms"] = round(
                (time.perf_counter() - t0) * 1e3, 3
            )
        except Exception as e:
            snap["memory_snapshot_notraces_err"] = repr(e)
        t0 = time.perf_counter()
        s3 = torch.cuda.memory_snapshot()
        snap[f"{mode}_{n}_memory_snapshot_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        if hasattr(torch._C, "_cuda_allocationTraceback"):
            p = keep[0].untyped_storage().data_ptr()
            t0 = time.perf_counter()
            for k in keep[:1000]:
                torch._C._cuda_allocationTraceback(k.untyped_storage().data_ptr())
            snap[f"{mode}_{n}_alloc_tb_us_each"] = round((time.perf_counter() - t0) * 1e3, 3)
            snap["alloc_tb_sample"] = torch._C._cuda_allocationTraceback(p)
        nblocks = sum(len(seg["blocks"]) for seg in s["segments"])
        snap[f"{mode}_{n}_blocks"] = nblocks
        snap[f"{mode}_{n}_frames_per_block"] = max(
            len(b["frames"]) for seg in s["segments"] for b in seg["blocks"]
        )
        del keep
torch.cuda.memory._record_memory_history(enabled=None)
note("snapshot", snap)
if hasattr(torch._C, "_cuda_isHistoryEnabled"):
    torch.cuda.memory._record_memory_history(enabled="state", stacks="python")
    note("history_enabled_after_state", torch._C._cuda_isHistoryEnabled())
    torch.cuda.memory._record_memory_history(enabled=None)
    note("history_enabled_after_none", torch._C._cuda_isHistoryEnabled())

# 5. planted fragmentation + OOM under a cap
torch.cuda.empty_cache()
MiB = 1 << 20
big = torch.empty(1024 * MiB, dtype=torch.uint8, device="cuda")
del big
blocks = [torch.empty(64 * MiB, dtype=torch.uint8, device="cuda") for _ in range(16)]
for i in range(0, 16, 2):
    blocks[i] = None
total = torch.cuda.mem_get_info()[1]
reserved = torch.cuda.memory_reserved()
torch.cuda.set_per_process_memory_fraction((reserved + 32 * MiB) / total)
seen = []
torch._C._cuda_attach_out_of_memory_observer(lambda *a: seen.append(a))
try:
    y = torch.empty(128 * MiB, dtype=torch.uint8, device="cuda")
    note("oom", "no OOM?")
except torch.OutOfMemoryError as e:
    note("oom_msg", str(e)[:600])
st = torch.cuda.memory_stats()
note(
    "after_oom",
    {
        "reserved": torch.cuda.memory_reserved(),
        "allocated": torch.cuda.memory_allocated(),
        "inactive_split": st["inactive_split_bytes.all.current"],
        "observer": seen,
        "segments": [
            (seg["total_size"], [(b["size"], b["state"]) for b in seg["blocks"]])
            for seg in torch.cuda.memory_snapshot()
            if seg["total_size"] >= 64 * MiB
        ],
    },
)
torch.cuda.set_per_process_memory_fraction(1.0)
s = torch.cuda.memory._snapshot()
note("allocator_settings", s.get("allocator_settings"))
json.dump(
    out,
    open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_history.json"), "w"),
    indent=1,
    default=str,
)

# 6. trace ("all") for one region: cost, entries, snapshot time, memory_viz
import io
import pickle

torch.cuda.memory._record_memory_history(enabled=None)
torch.cuda.memory._record_memory_history(
    enabled="all", stacks="python", max_entries=20000, clear_history=True
)
x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
tmp = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
del tmp
for _ in range(3000):
    t = torch.empty(1024, device="cuda")
    del t
t0 = time.perf_counter()
s = torch.cuda.memory._snapshot()
dt = (time.perf_counter() - t0) * 1e3
traces = s["device_traces"]
note(
    "trace",
    {
        "snapshot_ms": round(dt, 2),
        "entries_per_device": [len(t) for t in traces],
        "entry_keys": sorted(traces[0][0].keys()) if traces and traces[0] else None,
        "first_entries": [{k: v for k, v in e.items() if k != "frames"} for e in traces[0][:4]],
        "frames_example": traces[0][1]["frames"][:3] if len(traces[0]) > 1 else None,
    },
)
buf = io.BytesIO()
pickle.dump(s, buf)
note("trace_pickle_bytes", len(buf.getvalue()))
from torch.cuda import _memory_viz as mv

try:
    html = mv.trace_plot(s)
    note("trace_plot_len", len(html))
    html = mv.segment_plot(s)
    note("segment_plot_len", len(html))
except Exception as e:
    note("memory_viz_err", repr(e))
torch.cuda.memory._record_memory_history(enabled=None)
s2 = torch.cuda.memory._snapshot()
note("traces_after_disable", [len(t) for t in s2["device_traces"]])
torch.cuda.memory._record_memory_history(enabled="state", stacks="python")
s3 = torch.cuda.memory._snapshot()
note("traces_after_state", [len(t) for t in s3["device_traces"]])
if hasattr(torch._C, "_cuda_isHistoryEnabled"):
    note("enabled_in_state_mode", torch._C._cuda_isHistoryEnabled())
# pair cost in "all" with max_entries bounded (ring buffer full)
torch.cuda.memory._record_memory_history(enabled="all", stacks="python", max_entries=10000)
note("pair_cost_all_ring_us", [round(pair_cost(100000), 3) for _ in range(3)])
torch.cuda.memory._record_memory_history(enabled=None)
json.dump(
    out,
    open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_history.json"), "w"),
    indent=1,
    default=str,
)
