"""Where --breakdown's hooks cost time in a training step (GPU machine, one process).

    python3 benchmarks/probes/probe_hook_costs.py

Times one ResNet-50 step and one small MLP step (medians of 20, synchronized) with, in
turn: nothing; global module hooks that do nothing; the recorder's module hooks (they read
the allocator's counters); saved-tensor hooks alone; optimizer hooks alone; everything.
Also the cost of one counter reading (``torch._C._cuda_memoryStats``).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.modules.module as mm
import torch.optim.optimizer as oo
import torchvision

from jupyter_gpumem.collectors.step import StepRecorder


def median_ms(f, n=20):
    for _ in range(3):
        f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        ts.append((time.perf_counter() - t0) * 1000)
    return statistics.median(ts)


def steps():
    torch.manual_seed(0)
    r = torchvision.models.resnet50().cuda()
    ro = torch.optim.AdamW(r.parameters())
    rx = torch.randn(32, 3, 224, 224, device="cuda")
    m = torch.nn.Sequential(
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    ).cuda()
    mo = torch.optim.AdamW(m.parameters())
    mx = torch.randn(256, 1024, device="cuda")

    def resnet():
        r(rx).float().mean().backward()
        ro.step()
        ro.zero_grad()
        torch.cuda.synchronize()

    def mlp():
        m(mx).square().mean().backward()
        mo.step()
        mo.zero_grad()
        torch.cuda.synchronize()

    return {"resnet50": (resnet, r, ro), "mlp": (mlp, m, mo)}


def main():
    stats = torch._C._cuda_memoryStats
    torch.empty(1, device="cuda")
    print(f"one _cuda_memoryStats: {median_ms(lambda: stats(0), 2000) * 1000:.1f} us")
    for name, (step, model, opt) in steps().items():
        ns = [("model", model), ("opt", opt)]
        out = {"none": median_ms(step)}
        nothing = lambda *a, **k: None  # noqa: E731
        h = [
            mm.register_module_forward_pre_hook(nothing),
            mm.register_module_forward_hook(nothing, always_call=True),
        ]
        out["module hooks, empty"] = median_ms(step)
        for x in h:
            x.remove()
        rec = StepRecorder(torch, lambda ns=ns: ns)
        rec.start()
        rec._hooks.__exit__(None, None, None)  # only the module and optimizer hooks
        rec._hooks = None
        out["recorder, no saved-tensor hooks"] = median_ms(step)
        rec.stop()
        rec = StepRecorder(torch, lambda ns=ns: ns)
        rec.start()
        for x in rec._handles:
            x.remove()
        rec._handles = []
        out["saved-tensor hooks only"] = median_ms(step)
        rec.stop()
        h = [
            oo.register_optimizer_step_pre_hook(nothing),
            oo.register_optimizer_step_post_hook(nothing),
        ]
        out["optimizer hooks, empty"] = median_ms(step)
        for x in h:
            x.remove()
        rec = StepRecorder(torch, lambda ns=ns: ns)
        rec.start()
        out["recorder, all"] = median_ms(step)
        rec.stop()
        print(name, ", ".join(f"{k} {v:.2f}" for k, v in out.items()))


if __name__ == "__main__":
    main()


def counter_time_inside_a_step():
    """How long the counter readings take inside a real step (GPU busy)."""
    step, model, opt = steps()["resnet50"]
    rec = StepRecorder(torch, lambda: [("model", model), ("opt", opt)])
    spent = []
    inner = rec._count

    def timed(d):
        t0 = time.perf_counter()
        v = inner(d)
        spent.append(time.perf_counter() - t0)
        return v

    rec._count = timed
    rec.start()
    for _ in range(3):
        step()
    n0 = len(spent)
    t0 = time.perf_counter()
    step()
    total = (time.perf_counter() - t0) * 1000
    rec.stop()
    inside = spent[n0:]
    print(
        f"resnet50 step {total:.1f} ms with {len(inside)} counter readings taking "
        f"{sum(inside) * 1000:.2f} ms (median {statistics.median(inside) * 1e6:.1f} us)"
    )
    # the trace's clock against Python's: time_us of an allocation made right now
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python")
    before = time.time_ns() // 1000
    x = torch.empty(1 << 20, device="cuda")
    after = time.time_ns() // 1000
    del x
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    print(f"trace clock: alloc at {allocs[-1]['time_us']}, python before {before} after {after}")


if __name__ == "__main__":
    counter_time_inside_a_step()
