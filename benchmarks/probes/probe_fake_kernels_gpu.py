"""The dry run's fake kernels (``collectors/dry_run/kernels.py``, ``fake_rnn.py``) against the
real ops, on a GPU. Each measurement runs in a fresh process:

    python3 benchmarks/probes/probe_fake_kernels_gpu.py            # every case, then calibrate
    python3 benchmarks/probes/probe_fake_kernels_gpu.py calibrate  # what settles the sizes
    python3 benchmarks/probes/probe_fake_kernels_gpu.py lstm moe_fp32

Cases (one JSON line each per way of running it, then one comparing them):

- ``lstm``: a language model, ``nn.Embedding`` of 10,000 words (1024 wide), a 2-layer
  ``nn.LSTM`` of hidden size 1024 (``batch_first``, dropout 0.2), a ``Linear`` head, batch
  32, sequence 128, cross-entropy, two AdamW steps;
- ``moe_fp32`` / ``moe_bf16``: a mixture-of-experts layer (8 experts, 4096 tokens, 1024 wide,
  2048 inner) through ``torch._grouped_mm`` with offsets, a router, two AdamW steps.

Each is run (a) for real: ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``
above the start; (b) ``jupyter_gpumem.core.dry_run.dry_run`` with ``fake_kernels`` entered
as the dry run enters them (``fake_run._run_recorded``), which also says whether it started
CUDA and, if so, the Python stack that did (``cuda_started_at``); (c) the same dry run
without them (the baseline: where it stops). The comparison line gives the dry run's peaks
and their difference from the real ones in percent.

``calibrate`` prints what only the GPU can say, from the caching allocator's own history
(``torch.cuda.memory._record_memory_history``):

- ``"calibrate": "rnn"``, per shape of a grid whose first entry is the ``lstm`` case's RNN
  exactly: the reserve space, the weight buffer, the dropout state; for the forward
  (``_cudnn_rnn``) and the backward (``_cudnn_rnn_backward``) called directly, every
  allocation and free inside the call in order (``events``), those freed inside it
  (``transients``), the peak inside minus the outputs, and the workspace(s): the
  transients besides the copies and zeros RNN.cpp makes; beside each, the module's
  estimate (``events_est``: the call's allocations and frees in the order and at the
  sizes ``fake_rnn_sizes.ForwardCall`` / ``BackwardCall`` give). Then the module's own
  forward and backward (``_VF.lstm``: the seed and the dropout state) as events.
- ``"calibrate": "grouped_mm"``, per dtype, in a new thread of a fresh process: the
  output's strides and what the call allocates besides its output (cuBLAS's workspace
  for float32/float16, none for bfloat16's CUTLASS on Hopper).
- ``"calibrate": "lstm_step_real"`` / ``"lstm_step_dry"``: the ``lstm`` case request by
  request, for real (where each large allocation was made; every cudaMalloc; the segments
  after the step, from ``torch.cuda.memory_snapshot()``) and in the dry run (the op that
  made each); each replayed through the allocator model (``model_replay``: for the real
  requests it should match the real peaks, so any gap is in the dry run's requests); and
  ``"lstm_step_diff"``: where their allocations of 1 MiB and more differ, in order.

Needs a CUDA GPU and this repository on the path (run from its root).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = ("lstm", "moe_fp32", "moe_bf16")


# -- the workloads -----------------------------------------------------------------------


def lstm_step(steps: int = 2) -> None:
    import torch
    from torch import nn

    vocab, width, hidden, batch, seq = 10_000, 1024, 1024, 32, 128

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, width)
            self.rnn = nn.LSTM(width, hidden, num_layers=2, batch_first=True, dropout=0.2)
            self.head = nn.Linear(hidden, vocab)

        def forward(self, x: Any) -> Any:
            out, _ = self.rnn(self.emb(x))
            return self.head(out)

    model = LM().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        x = torch.randint(0, vocab, (batch, seq), device="cuda")
        y = torch.randint(0, vocab, (batch, seq), device="cuda")
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        opt.step()


def moe_step(dtype_name: str, steps: int = 2) -> None:
    import torch
    from torch import nn

    dtype = getattr(torch, dtype_name)
    experts, tokens, width, inner = 8, 4096, 1024, 2048

    class MoE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.router = nn.Linear(width, experts, dtype=dtype)
            self.w1 = nn.Parameter(torch.randn(experts, width, inner, dtype=dtype) * 0.02)
            self.w2 = nn.Parameter(torch.randn(experts, inner, width, dtype=dtype) * 0.02)

        def forward(self, x: Any, offs: Any) -> Any:
            # tokens already grouped by expert (equal groups): the grouped matmuls only
            gate = self.router(x).softmax(-1).amax(-1, keepdim=True)
            h = torch._grouped_mm(x, self.w1, offs)
            h = nn.functional.gelu(h)
            return torch._grouped_mm(h, self.w2, offs) * gate

    model = MoE().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    per = tokens // experts
    for _ in range(steps):
        x = torch.randn(tokens, width, device="cuda", dtype=dtype)
        offs = torch.arange(1, experts + 1, device="cuda", dtype=torch.int32) * per
        opt.zero_grad(set_to_none=True)
        model(x, offs).float().pow(2).mean().backward()
        opt.step()


def workload(case: str) -> Any:
    if case == "lstm":
        return lstm_step
    if case == "moe_fp32":
        return lambda: moe_step("float32")
    if case == "moe_bf16":
        return lambda: moe_step("bfloat16")
    raise SystemExit(f"unknown case {case}")


# -- one way of running a case (in the child) ----------------------------------------------


def child_real(case: str) -> dict[str, Any]:
    import torch

    torch.cuda.init()
    torch.cuda.synchronize()
    a0, r0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    workload(case)()
    torch.cuda.synchronize()
    return {
        "peak_allocated": torch.cuda.max_memory_allocated() - a0,
        "peak_reserved": torch.cuda.max_memory_reserved() - r0,
        "seconds": round(time.perf_counter() - t0, 3),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
    }


def without_kernels() -> None:
    """The dry run as it was before ``fake_kernels``: the kernels' context manager replaced
    by one that installs nothing."""
    import contextlib

    from jupyter_gpumem.collectors.dry_run import kernels as fake_kernels

    fake_kernels.fake_kernels = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment]


def _has_context(torch: Any) -> bool | None:
    try:
        return bool(torch._C._cuda_hasPrimaryContext(0))
    except Exception:  # no GPU visible
        return None


def child_dry(case: str, kernels: bool) -> dict[str, Any]:
    import torch

    if not kernels:
        without_kernels()
    from jupyter_gpumem.core.dry_run import dry_run

    stacks = watch_cuda_start()

    r = dry_run(workload(case))
    devices = list(r.devices)
    return {
        "peak_allocated": max((d.peak_allocated for d in devices), default=0),
        "peak_reserved": max((d.peak_reserved for d in devices), default=0),
        "workspaces": sum(d.workspaces for d in devices),
        "stopped": r.stopped,
        "notes": list(r.notes),
        "seconds": round(r.seconds, 3),
        "cuda_initialized": torch.cuda.is_initialized(),
        "context": _has_context(torch),
        "cuda_started_at": stacks[0] if stacks else None,
    }


# -- where CUDA starts (in a dry run's child) -----------------------------------------------


def watch_cuda_start() -> list[str]:
    """Records the Python stack of the first ``torch.cuda._lazy_init`` that finds CUDA not
    started (C++'s ``device_lazy_init`` calls it too), in every torch module holding the
    function; CUDA still starts. The list it returns fills in then."""
    import traceback

    import torch

    original = torch.cuda._lazy_init
    stacks: list[str] = []

    def lazy_init(*args: Any, **kwargs: Any) -> Any:
        if not stacks and not torch.cuda.is_initialized():
            stacks.append("".join(traceback.format_stack(limit=18)[:-1]))
        return original(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.startswith("torch") and getattr(module, "_lazy_init", None) is original:
            setattr(module, "_lazy_init", lazy_init)  # noqa: B010 (a module's attribute)
    return stacks


# -- the allocator's own history (real ops, in the child) -----------------------------------


def _history(on: bool) -> None:
    import torch

    if on:
        torch.cuda.memory._record_memory_history(
            "all", context="alloc", stacks="python", max_entries=1_000_000, clear_history=True
        )
    else:
        torch.cuda.memory._record_memory_history(None)


def traced(fn: Any) -> tuple[Any, list[dict[str, Any]], int]:
    """``fn()``'s result, the caching allocator's trace during it (``alloc``,
    ``free_completed``, ``segment_alloc``, ...) and the peak allocated above the start."""
    import torch

    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    _history(True)
    try:
        out = fn()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally:
        _history(False)
    trace = snap["device_traces"][torch.cuda.current_device()]
    return out, trace, torch.cuda.max_memory_allocated() - start


def _where(entry: dict[str, Any]) -> str:
    """The innermost Python frame of a trace entry outside torch's dispatch machinery."""
    for f in entry.get("frames") or []:
        name = str(f.get("filename", ""))
        if name and "_python_dispatch" not in name and "/autograd/graph" not in name:
            return f"{f.get('name')}@{os.path.basename(name)}:{f.get('line')}"
    return ""


def sequence(trace: list[dict[str, Any]]) -> dict[str, Any]:
    """A trace in short: ``events`` in order (``+size`` an allocation, ``-size`` its block
    back in the cache, ``S+size``/``S-size`` a cudaMalloc/cudaFree; ``@stream`` where not
    the first stream seen); ``transients``: the sizes allocated and freed inside, in order
    of allocation; ``kept``: the sizes allocated and still held at the end."""
    first_stream = next((e.get("stream", 0) for e in trace), 0)
    events: list[str] = []
    live: dict[int, int] = {}
    order: list[tuple[int, int]] = []
    freed: set[int] = set()
    for i, e in enumerate(trace):
        action, size = e["action"], int(e["size"])
        at = "" if e.get("stream", 0) == first_stream else f"@{e.get('stream')}"
        if action == "alloc":
            events.append(f"+{size}{at}")
            live[int(e["addr"])] = i
            order.append((i, size))
        elif action == "free_completed":
            events.append(f"-{size}{at}")
            j = live.pop(int(e["addr"]), None)
            if j is not None:
                freed.add(j)
        elif action in ("segment_alloc", "segment_map"):
            events.append(f"S+{size}{at}")
        elif action in ("segment_free", "segment_unmap"):
            events.append(f"S-{size}{at}")
        elif action == "oom":
            events.append(f"OOM{size}{at}")
    return {
        "events": events,
        "transients": [n for i, n in order if i in freed],
        "kept": [n for i, n in order if i not in freed],
    }


def _storages(xs: Any) -> int:
    """Bytes of the distinct storages among ``xs`` (tensors, nested lists; None skipped),
    rounded as the caching allocator rounds them (512 B)."""
    import torch

    seen, total = set(), 0
    stack = [xs]
    while stack:
        x = stack.pop()
        if isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, torch.Tensor):
            st = x.untyped_storage()
            if st.data_ptr() not in seen and st.nbytes():
                seen.add(st.data_ptr())
                total += -(-st.nbytes() // 512) * 512
    return total


def _less(sizes: list[int], known: list[int]) -> list[int]:
    """``sizes`` without one occurrence of each of ``known`` (rounded up to 512 B)."""
    left = list(sizes)
    for k in known:
        r = -(-k // 512) * 512
        for n in (k, r):
            if n in left:
                left.remove(n)
                break
    return left


def _events(steps: list[Any]) -> list[str]:
    """``fake_rnn_sizes`` steps as :func:`sequence`'s events (``+size``, ``-size``)."""
    held: dict[str, int] = {}
    out = []
    for sign, name, n in steps:
        if sign == "+":
            held[name] = n
            out.append(f"+{n}")
        else:
            out.append(f"-{held.pop(name)}")
    return out


def calibrate_rnn(cfg: dict[str, Any]) -> dict[str, Any]:
    """One RNN's calls, for real: the reserve space, the weight buffer, the dropout state,
    and inside the forward and the backward every allocation in order; the workspace is
    what is allocated and freed inside the call besides the copies RNN.cpp makes."""
    import torch
    from torch import nn

    from jupyter_gpumem.collectors.dry_run import rnn_sizes as rs

    cls = {"LSTM": nn.LSTM, "GRU": nn.GRU, "RNN_TANH": nn.RNN}[cfg["mode"]]
    dtype = getattr(torch, cfg.get("dtype", "float32"))
    names = ("num_layers", "bidirectional", "batch_first", "dropout")
    kw: dict[str, Any] = {k: cfg[k] for k in names if k in cfg}
    proj = cfg.get("proj", 0)
    if proj:
        kw["proj_size"] = proj
    m = cls(cfg["input"], cfg["hidden"], **kw).cuda().to(dtype)
    mode = rs.MODES[cfg["mode"]]
    B, T = cfg["batch"], cfg["seq"]
    batch_first = cfg.get("batch_first", False)
    shape_in = (B, T, cfg["input"]) if batch_first else (T, B, cfg["input"])
    x = torch.randn(*shape_in, device="cuda", dtype=dtype, requires_grad=True)
    layers, dirs = m.num_layers, 2 if m.bidirectional else 1
    hidden = cfg["hidden"]
    hx = torch.zeros(layers * dirs, B, proj or hidden, device="cuda", dtype=dtype)
    cx = (
        torch.zeros(layers * dirs, B, hidden, device="cuda", dtype=dtype)
        if mode == rs.LSTM
        else None
    )
    weights = list(m._flat_weights)
    st = weights[0].untyped_storage()
    weight_buf = torch.empty(0, device="cuda", dtype=dtype).set_(st)
    stride0 = (4 if m.bias else 2) + (1 if proj else 0)
    train = cfg.get("train", True)
    dropout = cfg.get("dropout", 0.0)
    state = None
    if train and dropout > 0:
        state = torch._cudnn_init_dropout_state(dropout, True, 0, dtype=torch.uint8, device="cuda")
    shape = rs.RnnShape(
        mode, cfg["input"], hidden, proj, layers, dirs, B * T, B, x.element_size(),
        dropout if train else 0.0,
    )  # fmt: skip
    x_copy = x.numel() * x.element_size() if batch_first else 0
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def forward() -> Any:
        return torch.ops.aten._cudnn_rnn.default(
            x, weights, stride0, weight_buf, hx, cx, mode, hidden, proj, layers,
            batch_first, dropout, train, dirs == 2, [], state,
        )  # fmt: skip

    with torch.no_grad():
        out, fwd_trace, fwd_peak = traced(forward)
    fwd = sequence(fwd_trace)
    fwd_outputs = _storages(out[:4])
    row: dict[str, Any] = {
        "config": cfg,
        "weight_buf": st.nbytes(),
        "weight_buf_est": rs.rnn_num_weights(mode, cfg["input"], hidden, proj, layers, dirs == 2)
        * x.element_size(),
        "dropout_state": state.numel() if state is not None else None,
        "dropout_state_est": rs.dropout_state_bytes(sms) if state is not None else None,
        "forward": {
            "reserve": out[3].numel(),
            "reserve_est": rs.rnn_reserve_bytes(shape) if train else 0,
            "outputs": fwd_outputs,
            "peak_inside": fwd_peak,
            "peak_minus_outputs": fwd_peak - fwd_outputs,
            "x_copy": x_copy,
            "workspace": _less(fwd["transients"], [x_copy] if x_copy else []),
            "workspace_est": rs.rnn_workspace_bytes(shape),
            "events_est": _events(
                rs.ForwardCall.of(shape, x, hx, cx, train, batch_first, False, False).steps()
            ),
            **fwd,
        },
    }
    if train:
        # the gradient as a head's backward gives it: contiguous in the output's shape
        # (batch-major when batch_first, so that RNN.cpp copies it seq-major)
        gy = torch.randn(tuple(out[0].shape), device="cuda", dtype=dtype)

        def backward() -> Any:
            return torch.ops.aten._cudnn_rnn_backward.default(
                x, weights, stride0, weight_buf, hx, cx, out[0], gy, None, None, mode,
                hidden, proj, layers, batch_first, dropout, train, dirs == 2, [],
                state, out[3], [True, True, cx is not None, True],
            )  # fmt: skip

        with torch.no_grad():
            grads, bwd_trace, bwd_peak = traced(backward)
        bwd = sequence(bwd_trace)
        outputs = _storages(grads)
        call = rs.BackwardCall.of(
            shape, x, hx, cx, out[0], weight_buf, weights, batch_first, False, stride0
        )
        est = call.steps(
            (False, True, True), (not rs.seq_major(gy, batch_first, False).is_contiguous(),)
        )
        zeros = [hx.numel() * hx.element_size()] + (
            [cx.numel() * cx.element_size()] if cx is not None else []
        )
        dy_copy = 0 if gy.transpose(0, 1).is_contiguous() or not batch_first else gy.nbytes
        known = zeros + [c for c in (x_copy, dy_copy, x_copy) if c]
        row["backward"] = {
            "outputs": outputs,
            "peak_inside": bwd_peak,
            "peak_minus_outputs": bwd_peak - outputs,
            "peak_minus_outputs_est": rs.peak_of(est) - outputs,
            "events_est": _events(est),
            "zeros_x_dy_copies": known,
            "workspaces": _less(bwd["transients"], known),
            "workspace_est_each": call.workspace,
            "grads_share_one_storage": len({g.untyped_storage().data_ptr() for g in grads[3]}) == 1,
            **bwd,
        }
    # the module's own call, as a model makes it (_VF.lstm: the seed, the dropout state)
    torch.cuda.empty_cache()
    m.train(train)
    inp = x.detach().requires_grad_(train)
    if train:
        y, mod_fwd, _ = traced(lambda: m(inp)[0])
        ones = torch.ones(tuple(y.shape), device="cuda", dtype=dtype)
        _, mod_bwd, _ = traced(lambda: y.backward(ones))
        row["module_forward_events"] = sequence(mod_fwd)["events"]
        row["module_backward_events"] = sequence(mod_bwd)["events"]
    return row


RNN_GRID: list[dict[str, Any]] = [
    # the lstm case's RNN, exactly
    {"mode": "LSTM", "input": 1024, "hidden": 1024, "num_layers": 2, "batch": 32, "seq": 128,
     "batch_first": True, "dropout": 0.2},
    # without dropout: does cuDNN's reserve grow with dropout's masks?
    {"mode": "LSTM", "input": 1024, "hidden": 1024, "num_layers": 2, "batch": 32, "seq": 128,
     "batch_first": True},
    {"mode": "LSTM", "input": 1024, "hidden": 1024, "num_layers": 2, "batch": 32, "seq": 128,
     "batch_first": True, "train": False},
    {"mode": "LSTM", "input": 512, "hidden": 512, "num_layers": 1, "batch": 64, "seq": 64},
    {"mode": "LSTM", "input": 512, "hidden": 512, "num_layers": 4, "batch": 64, "seq": 64},
    {"mode": "LSTM", "input": 256, "hidden": 256, "num_layers": 2, "batch": 16, "seq": 200,
     "bidirectional": True},
    {"mode": "LSTM", "input": 256, "hidden": 512, "num_layers": 2, "batch": 16, "seq": 50,
     "proj": 128},
    {"mode": "LSTM", "input": 1024, "hidden": 1024, "num_layers": 2, "batch": 32, "seq": 128,
     "dtype": "float16"},
    {"mode": "LSTM", "input": 123, "hidden": 320, "num_layers": 4, "batch": 50, "seq": 500},
    {"mode": "GRU", "input": 123, "hidden": 320, "num_layers": 4, "batch": 50, "seq": 500},
    {"mode": "GRU", "input": 512, "hidden": 512, "num_layers": 2, "batch": 32, "seq": 128},
    {"mode": "RNN_TANH", "input": 512, "hidden": 512, "num_layers": 2, "batch": 32, "seq": 128},
    {"mode": "LSTM", "input": 128, "hidden": 128, "num_layers": 1, "batch": 32, "seq": 64},
]  # fmt: skip


def calibrate_grouped_mm(dtype_name: str) -> dict[str, Any]:
    """``_grouped_mm`` for real, in a new thread of a fresh process (its first cuBLAS
    handle, so that a cuBLAS call shows its workspace): the output's strides and what else
    the call allocates."""
    import threading

    import torch

    from jupyter_gpumem.collectors.dry_run.kernels import grouped_mm_out

    dtype = getattr(torch, dtype_name)
    E, T, D, N = 8, 4096, 1024, 2050  # N not a multiple of 8: the padded stride shows
    a = torch.randn(T, D, device="cuda", dtype=dtype)
    b = torch.randn(E, N, D, device="cuda", dtype=dtype).transpose(-2, -1)
    offs = torch.arange(1, E + 1, device="cuda", dtype=torch.int32) * (T // E)
    torch.cuda.synchronize()
    found: dict[str, Any] = {}

    def work() -> None:
        try:
            found["out"] = traced(lambda: torch._grouped_mm(a, b, offs))
        except Exception as e:
            found["error"] = e

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    if "error" in found:
        raise found["error"]
    y, trace, peak = found["out"]
    _, stride = grouped_mm_out((T, D), (E, D, N), E, a.element_size(), rocm=False)
    seq = sequence(trace)
    out_bytes = y.untyped_storage().nbytes()
    return {
        "dtype": dtype_name,
        "shape": list(y.shape),
        "stride": list(y.stride()),
        "stride_est": list(stride),
        "out_bytes": out_bytes,
        "scratch": peak - _storages(y),
        "besides_the_output": _less(seq["transients"] + seq["kept"], [out_bytes]),
        "events": seq["events"],
    }


def child_calibrate() -> list[dict[str, Any]]:
    import torch

    rows: list[dict[str, Any]] = []
    torch.backends.cudnn.enabled = True
    head = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version()}  # fmt: skip
    rows.append({"calibrate": "versions", **head})
    for cfg in RNN_GRID:
        try:
            rows.append({"calibrate": "rnn", **calibrate_rnn(cfg)})
        except Exception as e:  # one shape cuDNN refuses: say so, go on
            rows.append({"calibrate": "rnn", "config": cfg, "error": repr(e)[:300]})
        torch.cuda.empty_cache()
    return rows


# -- a whole step, real and dry, request by request ----------------------------------------


def _replay(requests: list[Any]) -> dict[str, Any]:
    from jupyter_gpumem.analysis.caching import replay

    p = replay(requests)
    return {
        "peak_allocated": p.peak_allocated,
        "peak_reserved": p.peak_reserved,
        "segment_allocs": list(p.segment_allocations),
        "segments_at_end": [[s.size, sum(b.size for b in s.blocks if b.allocated), s.stream]
                            for s in p.segments],
    }  # fmt: skip


def _short(requests: list[Any], labels: dict[Any, str]) -> list[list[Any]]:
    """Requests as ``[key, size, label]`` (an allocation; label for 1 MiB and more) and
    ``[key]`` (its block back in the cache)."""
    out: list[list[Any]] = []
    for r in requests:
        if hasattr(r, "size"):
            out.append(
                [r.key, r.size, labels.get(r.key, "")] if r.size >= 1 << 20 else [r.key, r.size]
            )
        else:
            out.append([r.key])
    return out


def child_trace_real(case: str) -> dict[str, Any]:
    """The case run for real with the allocator's history on from the first allocation:
    its requests, where each large one was made, every cudaMalloc, the segments after the
    step (``torch.cuda.memory_snapshot()``), and the allocator model's replay of exactly
    these requests (it should give the same peaks: if not, the model is wrong, not the
    dry run's events)."""
    import torch

    from jupyter_gpumem.analysis.caching import requests_from_trace

    torch.cuda.init()
    _, trace, _ = traced(workload(case))
    requests = requests_from_trace(trace)
    labels: dict[Any, str] = {}
    n = 0
    for e in trace:
        if e["action"] in ("alloc", "oom"):
            n += 1
            labels[n] = _where(e)
    segments = [[s["total_size"], s["allocated_size"], s["stream"], s.get("segment_type", "")]
                for s in torch.cuda.memory_snapshot()]  # fmt: skip
    return {
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "peak_reserved": torch.cuda.max_memory_reserved(),
        "segment_allocs": [int(e["size"]) for e in trace if e["action"] == "segment_alloc"],
        "segments_after": sorted(segments, reverse=True),
        "model_replay": _replay(requests),
        "requests": _short(requests, labels),
    }


def child_trace_dry(case: str) -> dict[str, Any]:
    """The case's dry run, its events as requests (labelled with the op that made each
    large one) and the allocator model's replay of them: what the dry run predicts, cudaMalloc
    by cudaMalloc; and where CUDA started, if it did."""
    import torch

    from jupyter_gpumem.analysis.caching import Alloc, Free
    from jupyter_gpumem.collectors.dry_run import run as fake_run

    stacks = watch_cuda_start()
    seen = fake_run.record(workload(case), device_type="cuda")
    requests: list[Any] = []
    labels: dict[Any, str] = {}
    for e in seen.events:
        if isinstance(e, fake_run.Alloc):
            requests.append(Alloc(e.key, e.nbytes, e.stream))
            labels[e.key] = f"{e.op} t{e.thread}" + ("" if e.kind == "tensor" else f" {e.kind}")
        elif isinstance(e, fake_run.Free):
            requests.append(Free(e.key))
    return {
        "stopped": seen.error.line if seen.error is not None else None,
        "cuda_initialized": torch.cuda.is_initialized(),
        "context": _has_context(torch),
        "cuda_started_at": stacks[0] if stacks else None,
        "notes": list(seen.notes),
        "model_replay": _replay(requests),
        "requests": _short(requests, labels),
    }


def diff_large(real: list[list[Any]], dry: list[list[Any]], limit: int = 60) -> list[Any]:
    """Where the two runs' allocations of 1 MiB and more differ, in order: each differing
    stretch as ``{"real": [[size, where], ...], "dry": [[size, op], ...]}``, after the
    count of allocations that matched before it."""
    import difflib

    def large(rs: list[list[Any]]) -> list[list[Any]]:
        return [[-(-r[1] // 512) * 512, r[2]] for r in rs if len(r) == 3]

    a, b = large(real), large(dry)
    matcher = difflib.SequenceMatcher(a=[x[0] for x in a], b=[x[0] for x in b], autojunk=False)
    out: list[Any] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            out.append({"same": i2 - i1})
        else:
            out.append({"real": a[i1:i2], "dry": b[j1:j2]})
        if len(out) >= limit:
            break
    return out


# -- the parent ------------------------------------------------------------------------------


def run_child(*args: str) -> list[dict[str, Any]]:
    p = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", *args],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
    )
    rows = []
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            rows.append(json.loads(line))
    if not rows:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        rows.append({"error": tail[:400], "returncode": p.returncode})
    return rows


def calibrate() -> None:
    for row in run_child("calibrate"):
        print(json.dumps(row), flush=True)
    # bfloat16 first: a thread's cuBLAS handle (and its workspace) goes back to a pool
    # when the thread ends, so each dtype gets a process of its own
    for dtype in ("bfloat16", "float32", "float16"):
        row = run_child("grouped_mm", dtype)[0]
        print(json.dumps({"calibrate": "grouped_mm", **row}), flush=True)
    real = run_child("trace-real", "lstm")[0]
    print(json.dumps({"calibrate": "lstm_step_real", **real}), flush=True)
    dry = run_child("trace-dry", "lstm")[0]
    print(json.dumps({"calibrate": "lstm_step_dry", **dry}), flush=True)
    if "requests" in real and "requests" in dry:
        summary = {
            "calibrate": "lstm_step_diff",
            "real_peak_reserved": real.get("peak_reserved"),
            "real_replayed_peak_reserved": real["model_replay"]["peak_reserved"],
            "dry_replayed_peak_reserved": dry["model_replay"]["peak_reserved"],
            "real_segment_allocs": real["model_replay"]["segment_allocs"],
            "dry_segment_allocs": dry["model_replay"]["segment_allocs"],
            "differences": diff_large(real["requests"], dry["requests"]),
        }
        print(json.dumps(summary), flush=True)


def pct(dry: int | None, real: int | None) -> float | None:
    if not dry or not real:
        return None
    return round(100.0 * (dry - real) / real, 2)


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--child":
        sys.path.insert(0, ROOT)
        what = argv[1]
        if what == "calibrate":
            for row in child_calibrate():
                print(json.dumps(row), flush=True)
            return
        arg = argv[2]
        try:
            if what == "real":
                row = child_real(arg)
            elif what == "grouped_mm":
                row = calibrate_grouped_mm(arg)
            elif what == "trace-real":
                row = child_trace_real(arg)
            elif what == "trace-dry":
                row = child_trace_dry(arg)
            else:
                row = child_dry(arg, kernels=(what == "dry"))
        except Exception as e:  # say what failed, as one row
            import traceback

            row = {"error": repr(e)[:400], "where": traceback.format_exc()[-1500:]}
        print(json.dumps(row), flush=True)
        return
    wanted = argv or [*CASES, "calibrate"]
    for case in wanted:
        if case == "calibrate":
            calibrate()
            continue
        real = run_child("real", case)[0]
        print(json.dumps({"case": case, "run": "real", **real}), flush=True)
        dry = run_child("dry", case)[0]
        print(json.dumps({"case": case, "run": "dry_run+fake_kernels", **dry}), flush=True)
        base = run_child("baseline", case)[0]
        print(json.dumps({"case": case, "run": "dry_run_without_kernels", **base}), flush=True)
        print(
            json.dumps(
                {
                    "case": case,
                    "compare": "dry_run+fake_kernels vs real",
                    "real_peak_allocated": real.get("peak_allocated"),
                    "dry_peak_allocated": dry.get("peak_allocated"),
                    "allocated_diff_pct": pct(
                        dry.get("peak_allocated"), real.get("peak_allocated")
                    ),
                    "real_peak_reserved": real.get("peak_reserved"),
                    "dry_peak_reserved": dry.get("peak_reserved"),
                    "reserved_diff_pct": pct(dry.get("peak_reserved"), real.get("peak_reserved")),
                    "dry_stopped": dry.get("stopped"),
                    "dry_started_cuda": dry.get("cuda_initialized"),
                    "dry_cuda_started_at": dry.get("cuda_started_at"),
                    "baseline_stopped": base.get("stopped"),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
