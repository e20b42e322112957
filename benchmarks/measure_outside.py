"""What a PyTorch process holds on its GPU beside the caching allocator, step by step: the
CUDA context, then cuBLAS (a matmul), then cuDNN (a convolution), then NCCL (a process
group of N ranks, one all-reduce). The dry run adds these to its predicted peak reserved
(``core/dry_run.py``'s ``OUTSIDE`` table).

    python3 benchmarks/measure_outside.py              # one process: context, cuBLAS, cuDNN
    python3 benchmarks/measure_outside.py --nccl 2     # also N ranks with NCCL (N GPUs)

Each figure is NVML's used memory of the process minus ``torch.cuda.memory_reserved()``,
read after ``torch.cuda.synchronize()``; one JSON line per process.
"""

from __future__ import annotations

import json
import os
import sys


def _outside(torch: object, nvml: object, handle: object) -> int:
    import pynvml

    t: object = torch
    t.cuda.synchronize()  # type: ignore[attr-defined]
    pid = os.getpid()
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if p.pid == pid:
            return int(p.usedGpuMemory) - int(t.cuda.memory_reserved())  # type: ignore[attr-defined]
    return -1


def single() -> dict:
    import pynvml
    import torch

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ.get("NVML_INDEX", "0")))
    out: dict = {"card": torch.cuda.get_device_name(0), "torch": torch.__version__}
    torch.cuda.init()
    torch.empty(1, device="cuda")
    out["context"] = _outside(torch, pynvml, handle)
    a = torch.randn(256, 256, device="cuda")
    (a @ a).sum()
    out["after_cublas"] = _outside(torch, pynvml, handle)
    x = torch.randn(8, 3, 64, 64, device="cuda")
    conv = torch.nn.Conv2d(3, 16, 3).cuda()
    conv(x).sum().backward()
    out["after_cudnn"] = _outside(torch, pynvml, handle)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        q = torch.randn(4, 8, 256, 64, device="cuda")
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
    out["after_sdpa_bf16"] = _outside(torch, pynvml, handle)
    return out


def rank(world: int) -> None:
    import pynvml
    import torch
    import torch.distributed as dist

    r = int(os.environ["RANK"])
    torch.cuda.set_device(r)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(r)
    a = torch.randn(256, 256, device="cuda")
    (a @ a).sum()
    before = _outside(torch, pynvml, handle)
    dist.init_process_group("nccl", device_id=torch.device("cuda", r))
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)
    after_allreduce = _outside(torch, pynvml, handle)
    g = torch.empty(world << 20, device="cuda")
    dist.all_gather_into_tensor(g, t)
    dist.reduce_scatter_tensor(t, g)
    after = _outside(torch, pynvml, handle)
    print(
        json.dumps(
            {
                "rank": r,
                "world": world,
                "card": torch.cuda.get_device_name(r),
                "after_cublas": before,
                "after_nccl_allreduce": after_allreduce,
                "after_nccl_collectives": after,
                "nccl": after - before,
            }
        ),
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank"]:
        rank(int(sys.argv[2]))
    elif sys.argv[1:2] == ["--nccl"]:
        import subprocess

        world = int(sys.argv[2])
        procs = []
        for r in range(world):
            env = {
                **os.environ,
                "RANK": str(r),
                "WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29531",
            }
            procs.append(
                subprocess.Popen([sys.executable, __file__, "--rank", str(world)], env=env)
            )
        for p in procs:
            p.wait(timeout=180)
    else:
        print(json.dumps(single()), flush=True)
