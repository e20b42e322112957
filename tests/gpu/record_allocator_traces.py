"""Record PyTorch's caching allocator at work, event by event, with what it ended with.

Run on the GPU machine:  python3 tests/gpu/record_allocator_traces.py OUT.json [CASE ...]
Each case runs in a fresh process (an allocator that starts empty, its own
PYTORCH_CUDA_ALLOC_CONF and cap) with the allocator's full history recorded. Kept: every
trace entry (action, address, size, stream), the segments and blocks at the end, and the
allocator's own counters. The CPU tests (tests/test_caching_allocator.py) feed the
requests (alloc with its requested size, free by address) through the model in
analysis/caching/ and compare the segments it makes, the blocks and the peaks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CASES: dict[str, dict[str, str]] = {
    "mlp_adamw": {"conf": ""},
    "random": {"conf": ""},
    "random_cap": {"conf": ""},
    "random_max_split": {"conf": "max_split_size_mb:64"},
    "random_expandable": {"conf": "expandable_segments:True"},
    "amp_fp16": {"conf": ""},
    "resnet50": {"conf": ""},
    "gpt2": {"conf": ""},
}

ACTIONS = [
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
]


def workload(name: str) -> dict:
    import random

    import torch

    MiB = 1 << 20
    info: dict = {}
    torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=2_000_000)
    if name == "mlp_adamw" or name == "amp_fp16":
        torch.manual_seed(0)
        with torch.device("cuda"):
            net = torch.nn.Sequential(
                torch.nn.Linear(1024, 4096),
                torch.nn.ReLU(),
                torch.nn.Linear(4096, 4096),
                torch.nn.ReLU(),
                torch.nn.Linear(4096, 1024),
            )
        opt = torch.optim.AdamW(net.parameters())
        scaler = torch.amp.GradScaler() if name == "amp_fp16" else None
        for _ in range(2):
            x = torch.randn(512, 1024, device="cuda")
            if scaler is None:
                loss = net(x).square().mean()
                loss.backward()
                opt.step()
            else:
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = net(x).float().square().mean()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            opt.zero_grad(set_to_none=True)
            del x, loss
    elif name.startswith("random"):
        rng = random.Random(0)
        if name == "random_cap":
            torch.cuda.set_per_process_memory_fraction(
                (768 * MiB) / torch.cuda.get_device_properties(0).total_memory
            )
            info["cap"] = int(
                torch.cuda.get_per_process_memory_fraction(0)
                * torch.cuda.get_device_properties(0).total_memory
            )
        live: list = []
        ooms = 0
        for _ in range(3000):
            if live and rng.random() < 0.45:
                live.pop(rng.randrange(len(live)))
                continue
            kind = rng.random()
            if kind < 0.5:
                n = rng.randint(1, 1 << 20)  # small pool
            elif kind < 0.85:
                n = rng.randint(1 << 20, 16 * MiB)
            else:
                n = rng.randint(16 * MiB, 96 * MiB)
            try:
                live.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                ooms += 1
                live = live[len(live) // 2 :]
        info["ooms_seen"] = ooms
        del live
    elif name == "resnet50":
        import torchvision

        torch.manual_seed(0)
        with torch.device("cuda"):
            model = torchvision.models.resnet50()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(32, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (32,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        del loss
    elif name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        cfg = GPT2Config(n_layer=4, n_embd=768, n_head=12)
        with torch.device("cuda"):
            model = GPT2LMHeadModel(cfg)
        opt = torch.optim.AdamW(model.parameters())
        ids = torch.randint(0, cfg.vocab_size, (4, 256), device="cuda")
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        del loss
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = [
        [
            ACTIONS.index(e["action"]),
            int(e.get("addr", 0)),
            int(e.get("size", 0)),
            int(e.get("stream", 0)),
        ]
        for e in snap["device_traces"][0]
    ]
    segments = [
        {
            "address": int(s["address"]),
            "total_size": int(s["total_size"]),
            "stream": int(s["stream"]),
            "segment_type": s["segment_type"],
            "is_expandable": bool(s.get("is_expandable", False)),
            "blocks": [[int(b["size"]), int(b["requested_size"]), b["state"]] for b in s["blocks"]],
        }
        for s in snap["segments"]
        if s["device"] == 0
    ]
    stats = torch.cuda.memory_stats(0)
    keep = (
        "allocated_bytes.all.peak",
        "reserved_bytes.all.peak",
        "allocated_bytes.all.current",
        "reserved_bytes.all.current",
        "num_alloc_retries",
        "num_ooms",
        "num_device_alloc",
        "num_device_free",
        "inactive_split_bytes.all.current",
        "requested_bytes.all.peak",
    )
    return {
        "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "settings": snap.get("allocator_settings", {}),
        "info": info,
        "actions": ACTIONS,
        "trace": trace,
        "segments": segments,
        "stats": {k: int(stats[k]) for k in keep},
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }


def main(out: str, names: list[str]) -> None:
    result = {}
    for name in names or list(CASES):
        env = dict(os.environ)
        if CASES[name]["conf"]:
            env["PYTORCH_CUDA_ALLOC_CONF"] = CASES[name]["conf"]
        else:
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        p = subprocess.run(
            [sys.executable, __file__, "--one", name], env=env, capture_output=True, text=True
        )
        if p.returncode != 0:
            print(f"{name}: failed\n{p.stderr[-2000:]}", file=sys.stderr)
            continue
        result[name] = json.loads(p.stdout)
        r = result[name]
        peak = r["stats"]["reserved_bytes.all.peak"]
        print(f"{name}: {len(r['trace'])} entries, peak reserved {peak}")
    with open(out, "w") as f:
        json.dump(result, f, separators=(",", ":"))


if __name__ == "__main__":
    if sys.argv[1] == "--one":
        print(json.dumps(workload(sys.argv[2])))
    else:
        main(sys.argv[1], sys.argv[2:])
