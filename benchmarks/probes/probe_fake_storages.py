"""What a dry run can see: a training step under FakeTensorMode, its storages counted.

    python3 benchmarks/probes/probe_fake_storages.py

For each case: the real step's allocator (peak allocated above the start, the requests in
order from the allocator's trace), then the same step under FakeTensorMode with a
TorchDispatchMode that records each new storage (bytes, device) and its death (a weakref
finalizer on the storage): how many requests each saw, their sizes, and the peak of the
live sum (rounded to 512 B). Prints one JSON line per case. Device memory used by the fake
run is reported too (it must be 0).
"""

from __future__ import annotations

import gc
import json
import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

MiB = 1 << 20


def r512(n: int) -> int:
    return max(512, -(-n // 512) * 512)


class StorageRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, int, int, str]] = []
        self.seen: dict[int, int] = {}
        self.next = 0
        self.live = 0
        self.peak = 0

    def _dead(self, key: int, size: int) -> None:
        self.events.append(("free", key, size, ""))
        self.live -= r512(size)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                st = t.untyped_storage()
                k = id(st)
                if getattr(st, "_gpumem_seen", False):
                    continue
                try:
                    st._gpumem_seen = True  # type: ignore[attr-defined]
                except Exception:
                    pass
                n = st.nbytes()
                self.next += 1
                key = self.next
                self.events.append(("alloc", key, n, str(func)))
                self.live += r512(n)
                self.peak = max(self.peak, self.live)
                weakref.finalize(st, self._dead, key, n)
                self.seen[k] = key
        return out


def gpt2(batch=8, seq=512, layers=12):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=layers)
    with torch.device("cuda"):
        model = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters())

    def step():
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def mlp():
    with torch.device("cuda"):
        net = torch.nn.Sequential(
            torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
        )
    opt = torch.optim.AdamW(net.parameters())

    def step():
        x = torch.randn(512, 1024, device="cuda")
        net(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def real(make):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(enabled="all", context=None)
    step = make()
    step()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    allocs = [e["size"] for e in snap["device_traces"][0] if e["action"] == "alloc"]
    peak = torch.cuda.max_memory_allocated() - base
    del step
    gc.collect()
    torch.cuda.empty_cache()
    return {"peak": peak, "allocs": len(allocs), "alloc_bytes": sum(allocs)}


def fake(make):
    from torch._subclasses.fake_tensor import FakeTensorMode

    used = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    rec = StorageRecorder()
    with FakeTensorMode(allow_non_fake_inputs=True), rec:
        step = make()
        step()
        del step
        gc.collect()
    return {
        "peak": rec.peak,
        "allocs": sum(1 for e in rec.events if e[0] == "alloc"),
        "frees": sum(1 for e in rec.events if e[0] == "free"),
        "alloc_bytes": sum(e[2] for e in rec.events if e[0] == "alloc"),
        "seconds": round(time.perf_counter() - t0, 2),
        "device_bytes_used": torch.cuda.memory_allocated() - used,
        "first_ops": [e[3] for e in rec.events[:5]],
    }


if __name__ == "__main__":
    torch.cuda.init()
    for name, make in (("mlp", mlp), ("gpt2", gpt2)):
        f = fake(make)
        r = real(make)
        print(json.dumps({"case": name, "real": r, "fake": f}))
