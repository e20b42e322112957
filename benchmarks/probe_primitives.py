"""Measure the cost of each reading the collector can take, on a real GPU.

Run on the GPU machine: python3 benchmarks/probe_primitives.py
Prints one line per primitive: median microseconds over many calls.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time


def timeit(fn, n=2000):
    for _ in range(50):
        fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1000.0


def main() -> None:
    import psutil
    import pynvml
    import torch

    out = {"torch": torch.__version__, "cuda": torch.version.cuda}
    out["has_primary_ctx_before"] = [
        torch._C._cuda_hasPrimaryContext(i) for i in range(torch.cuda.device_count())
    ]
    out["initialized_before"] = torch.cuda.is_initialized()
    torch.empty(1024, device="cuda:0")
    out["has_primary_ctx_after"] = [
        torch._C._cuda_hasPrimaryContext(i) for i in range(torch.cuda.device_count())
    ]
    costs = {}
    costs["memory_stats (flat)"] = timeit(lambda: torch.cuda.memory_stats(0))
    costs["_cuda_memoryStats (nested)"] = timeit(lambda: torch._C._cuda_memoryStats(0))
    costs["memory_allocated"] = timeit(lambda: torch.cuda.memory_allocated(0))
    costs["mem_get_info"] = timeit(lambda: torch.cuda.mem_get_info(0))
    costs["cudart.cudaMemGetInfo"] = timeit(lambda: torch.cuda.cudart().cudaMemGetInfo(0))
    costs["reset_peak_memory_stats"] = timeit(lambda: torch.cuda.reset_peak_memory_stats(0))
    costs["_cuda_resetPeakMemoryStats"] = timeit(lambda: torch._C._cuda_resetPeakMemoryStats(0))
    costs["hasPrimaryContext"] = timeit(lambda: torch._C._cuda_hasPrimaryContext(0))
    costs["is_initialized"] = timeit(torch.cuda.is_initialized)
    costs["device_count"] = timeit(torch.cuda.device_count)
    if hasattr(torch._C, "_cuda_cudaCachingAllocator_is_enabled"):
        costs["caching is_enabled"] = timeit(torch._C._cuda_cudaCachingAllocator_is_enabled)
    costs["_cuda_getMemoryFraction"] = timeit(lambda: torch._C._cuda_getMemoryFraction(0))
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    costs["nvmlInit again"] = timeit(pynvml.nvmlInit, n=50)
    costs["nvmlDeviceGetMemoryInfo"] = timeit(lambda: pynvml.nvmlDeviceGetMemoryInfo(h))
    costs["nvmlDeviceGetComputeRunningProcesses"] = timeit(
        lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h), n=500
    )
    proc = psutil.Process()
    costs["psutil rss"] = timeit(lambda: proc.memory_info().rss)

    def statm():
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * 4096

    costs["/proc/self/statm"] = timeit(statm)
    costs["perf_counter"] = timeit(time.perf_counter)
    out["costs_us"] = costs
    out["nested_keys"] = sorted(torch._C._cuda_memoryStats(0).keys())
    out["nested_sample"] = {
        k: v for k, v in torch._C._cuda_memoryStats(0).items() if not isinstance(v, dict)
    }
    out["flat_count"] = len(torch.cuda.memory_stats(0))
    out["procs"] = [
        (p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    ]
    out["mypid"] = os.getpid()
    out["nvml_mem"] = list(
        map(int, (lambda m: (m.total, m.used, m.free))(pynvml.nvmlDeviceGetMemoryInfo(h)))
    )
    out["mem_get_info"] = list(torch.cuda.mem_get_info(0))
    out["reserved"] = torch.cuda.memory_reserved(0)
    out["snapshot_settings"] = torch.cuda.memory._snapshot().get("allocator_settings")
    out["accelerator_api"] = [n for n in dir(torch.accelerator) if "mem" in n.lower()]
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
