"""Record raw allocator readings on a real GPU, with the ground truth of each scenario.

Run on the GPU machine:
  python3 tests/gpu/record_fixtures.py jupyter_gpumem/testing/recorded/gpu_readings.json
The CPU unit tests feed these readings through the same conversion as live ones
(``collectors._replay``), and the UI tests replay the ``timeline`` as a fake kernel GPU.
Raw readings use the documented flat ``torch.cuda.memory_stats`` keys.
"""

from __future__ import annotations

import json
import sys
import time

import torch

MiB = 1 << 20


CACHING = [True]


def raw_reading(nvml_handles, pid) -> dict:
    import pynvml

    devices = []
    for i in range(torch.cuda.device_count()):
        initialized = bool(torch._C._cuda_hasPrimaryContext(i))
        nv = None
        if nvml_handles is not None:
            h = nvml_handles[i]
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            mine = [p.usedGpuMemory for p in procs if p.pid == pid]
            name = pynvml.nvmlDeviceGetName(h)
            nv = {
                "name": name.decode() if isinstance(name, bytes) else name,
                "total": int(mem.total),
                "used": int(mem.used),
                "process_used": int(mine[0]) if mine else None,
            }
        d = {
            "index": i,
            "name": nv["name"] if nv else "",
            "backend": "cuda",
            "initialized": initialized,
        }
        if initialized:
            d["memory_stats"] = dict(torch.cuda.memory_stats(i))
            d["mem_get_info"] = list(torch.cuda.mem_get_info(i))
            d["fraction"] = float(torch._C._cuda_getMemoryFraction(i))
        d["nvml"] = nv
        devices.append(d)
    return {
        "state": "ok",
        "torch_version": torch.__version__,
        "caching": CACHING[0],
        "devices": devices,
    }


def main(path: str) -> None:
    import os

    import pynvml

    pynvml.nvmlInit()
    pid = os.getpid()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(torch.cuda.device_count())]
    R = lambda: raw_reading(handles, pid)  # noqa: E731
    dev = torch.device("cuda:0")
    out: dict = {"scenarios": {}}

    def scenario(name, before, after, **truth):
        out["scenarios"][name] = {"before": before, "after": after, "truth": truth}

    # The first allocation creates the context: outside-PyTorch memory appears.
    b = R()
    warm = torch.empty(0, device=dev)
    a = R()
    scenario("context_created", b, a)

    torch.cuda.reset_peak_memory_stats(dev)
    b = R()
    n = 256 * MiB
    keep = torch.empty(n, dtype=torch.uint8, device=dev)
    a = R()
    scenario("keep_n_bytes", b, a, n=n)

    torch.cuda.reset_peak_memory_stats(dev)
    b = R()
    spike = torch.empty(512 * MiB, dtype=torch.uint8, device=dev)
    kept2 = torch.empty(64 * MiB, dtype=torch.uint8, device=dev)
    del spike
    a = R()
    scenario("transient_spike", b, a, kept=64 * MiB, spike=512 * MiB)

    b = R()
    torch.cuda.empty_cache()
    a = R()
    scenario("empty_cache", b, a, released=512 * MiB)

    # Fragmentation: many 6 MiB tensors carved from 20 MiB segments; free every other.
    torch.cuda.reset_peak_memory_stats(dev)
    b = R()
    blocks = [torch.empty(6 * MiB, dtype=torch.uint8, device=dev) for _ in range(60)]
    for i in range(0, len(blocks), 2):
        blocks[i] = None
    a = R()
    scenario("fragmentation", b, a)
    blocks = None
    torch.cuda.empty_cache()

    torch.cuda.memory.caching_allocator_enable(False)
    CACHING[0] = False
    b = R()
    uncached = torch.empty(128 * MiB, dtype=torch.uint8, device=dev)
    a = R()
    scenario("caching_off", b, a, n=128 * MiB)
    del uncached
    torch.cuda.memory.caching_allocator_enable(True)
    CACHING[0] = True

    torch.cuda.empty_cache()
    total = torch.cuda.mem_get_info(dev)[1]
    torch.cuda.set_per_process_memory_fraction(1 * (1 << 30) / total, dev)
    b = R()
    try:
        torch.empty(2 << 30, dtype=torch.uint8, device=dev)
    except torch.OutOfMemoryError:
        pass
    a = R()
    scenario("oom_at_cap", b, a, cap=1 << 30, requested=2 << 30)
    torch.cuda.set_per_process_memory_fraction(1.0, dev)

    # Nested vs flat: same numbers.
    out["nested_vs_flat"] = {
        "nested": json.loads(json.dumps(torch._C._cuda_memoryStats(0), default=str)),
        "flat": dict(torch.cuda.memory_stats(0)),
    }

    # A small training loop sampled at 10 Hz: the replay timeline for UI tests.
    model = torch.nn.Sequential(
        torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)
    ).to(dev)
    opt = torch.optim.Adam(model.parameters())
    timeline = []
    t_end = time.time() + 6
    step = 0
    last = 0.0
    while time.time() < t_end:
        batch = 256 + 256 * (step % 8)
        x = torch.randn(batch, 4096, device=dev)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if time.time() - last >= 0.1:
            torch.cuda.synchronize()
            timeline.append(R())
            last = time.time()
    out["timeline"] = timeline
    out["period_s"] = 0.1
    out["meta"] = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "devices": torch.cuda.device_count(),
        "recorded": time.strftime("%Y-%m-%d"),  # the replay names it (model.Replay)
    }
    with open(path, "w") as f:
        json.dump(out, f)
    print("recorded", len(out["scenarios"]), "scenarios,", len(timeline), "timeline frames")
    del keep, kept2, warm


if __name__ == "__main__":
    main(sys.argv[1])
