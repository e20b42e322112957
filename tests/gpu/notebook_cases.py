"""The dry run in the notebook workflow: the model (and its optimizer) built for real in one
cell, the step planned in the next with ``%%gpumem --dry-run``, in a real IPython shell;
against the same model built and stepped for real in a fresh process. Each side runs in a
fresh process of its own.

    python3 tests/gpu/notebook_cases.py [CASE ...]          # one JSON line per case
    python3 tests/gpu/notebook_cases.py --scan [CASE ...]   # the scan without running

What is compared: the dry run's need in a fresh process (its predicted peak reserved, with
what the cell uses of the kernel's tensors held from the start, plus the memory beside
PyTorch) against the real fresh process's peak reserved plus what it holds beside PyTorch
(NVML's figure for the process at the end, else the device's used less what it held
before the process started, less reserved). For the scan: the largest batch predicted to
fit a card, checked with two real runs under the card's cap: the predicted batch runs, and
one 3 % larger does not.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

# case -> (the cell that builds the model, the step cell reading `batch`, batch, scan card,
# scan start values)
CASES: dict[str, tuple[str, str, int, str, tuple[int, ...]]] = {
    "gpt2_adamw": (
        (
            "from transformers import GPT2Config, GPT2LMHeadModel\n"
            "gpt = GPT2LMHeadModel(GPT2Config()).cuda().train()\n"
            "opt = torch.optim.AdamW(gpt.parameters())\n"
        ),
        (
            "ids = torch.randint(0, 50257, (batch, 512), device='cuda')\n"
            "gpt(ids, labels=ids).loss.backward()\n"
            "opt.step()\n"
            "opt.zero_grad()\n"
        ),
        8,
        "24564MiB",  # an RTX 4090's memory
        (2, 4, 8),
    ),
    "resnet50_adamw": (
        (
            "import torchvision\n"
            "net = torchvision.models.resnet50().cuda().train()\n"
            "opt = torch.optim.AdamW(net.parameters())\n"
        ),
        (
            "x = torch.randn(batch, 3, 224, 224, device='cuda')\n"
            "net(x).sum().backward()\n"
            "opt.step()\n"
            "opt.zero_grad()\n"
        ),
        64,
        "15360MiB",  # a T4's memory
        (16, 32, 64),
    ),
    "vit_b16_adamw": (
        (
            "import torchvision\n"
            "vit = torchvision.models.vit_b_16().cuda().train()\n"
            "opt = torch.optim.AdamW(vit.parameters())\n"
        ),
        (
            "x = torch.randn(batch, 3, 224, 224, device='cuda')\n"
            "vit(x).sum().backward()\n"
            "opt.step()\n"
            "opt.zero_grad()\n"
        ),
        32,
        "15360MiB",
        (8, 16, 32),
    ),
    "bert_base_adamw": (
        (
            "from transformers import BertConfig, BertForMaskedLM\n"
            "bert = BertForMaskedLM(BertConfig()).cuda().train()\n"
            "opt = torch.optim.AdamW(bert.parameters())\n"
        ),
        (
            "ids = torch.randint(0, 30522, (batch, 256), device='cuda')\n"
            "bert(input_ids=ids, labels=ids).loss.backward()\n"
            "opt.step()\n"
            "opt.zero_grad()\n"
        ),
        16,
        "24564MiB",
        (4, 8, 16),
    ),
}


def _device_used() -> int:
    import pynvml

    pynvml.nvmlInit()
    return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)


def _process_used() -> int | None:
    """What NVML says this process holds on GPU 0 (None where it does not list it: a PID
    namespace of its own); unlike the device's used memory, other processes on the GPU do
    not move it."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if p.pid == os.getpid() and p.usedGpuMemory:
            return int(p.usedGpuMemory)
    return None


def real(name: str, batch: int, cap: int | None, before: int) -> dict:
    """The model built, then the step, for real, in this fresh process."""
    import torch

    build, step, *_ = CASES[name]
    torch.cuda.init()
    if cap is not None:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(cap / total)
    ns: dict = {"torch": torch, "batch": batch}
    out: dict = {"batch": batch, "cap": cap}
    try:
        exec(build, ns)
        exec(step, ns)
        torch.cuda.synchronize()
        out["out_of_memory"] = False
    except torch.OutOfMemoryError:
        out["out_of_memory"] = True
    out["peak_allocated"] = torch.cuda.max_memory_allocated()
    out["peak_reserved"] = torch.cuda.max_memory_reserved()
    own = _process_used()
    used = own if own is not None else _device_used() - before
    out["beside"] = used - torch.cuda.memory_reserved()
    out["need"] = out["peak_reserved"] + out["beside"]
    return out


def _shell_with_model(name: str):
    import torch
    from IPython.core.interactiveshell import InteractiveShell

    build, *_ = CASES[name]
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_gpumem")
    shell.user_ns["torch"] = torch
    result = shell.run_cell(build)
    assert result.success, result.error_in_exec
    return shell


def predicted(name: str, batch: int) -> dict:
    """The model built for real in one cell; the step dry-run in the next."""
    import torch

    shell = _shell_with_model(name)
    _, step, *_ = CASES[name]
    before = {k: v.detach().clone() for k, v in _state(shell).items()}
    shell.user_ns["batch"] = batch
    allocated = torch.cuda.memory_allocated()
    used_before = _process_used()
    result = shell.run_cell(f"%%gpumem --dry-run -q -o plan\n{step}")
    used_after = _process_used()
    assert result.success, result.error_in_exec
    plan = shell.user_ns["plan"]
    d = max(plan.devices, key=lambda d: d.peak_reserved)
    after = _state(shell)
    return {
        "batch": batch,
        "peak_allocated": d.peak_allocated,
        "peak_reserved": d.peak_reserved,
        "held": d.held,
        "held_by": [list(h) for h in plan.held_by],
        "outside": plan.outside,
        "outside_source": plan.outside_source,
        "need": plan.need,
        "stopped": plan.stopped,
        "unseen": list(plan.unseen),
        "notes": list(plan.notes),
        "seconds": plan.seconds,
        "unchanged": all(torch.equal(before[k], after[k]) for k in before)
        and set(before) == set(after),
        "allocated_unchanged": torch.cuda.memory_allocated() == allocated,
        # what the process holds beside PyTorch grew by (cuDNN's handle, when asked)
        "process_used_change": None
        if used_before is None or used_after is None
        else used_after - used_before,
    }


def _state(shell) -> dict:
    """The kernel's real tensors: parameters, gradients, optimizer state, by name."""
    import torch

    out = {}
    for name, obj in shell.user_ns.items():
        if isinstance(obj, torch.nn.Module):
            for k, p in obj.named_parameters():
                out[f"{name}.{k}"] = p
                if p.grad is not None:
                    out[f"{name}.{k}.grad"] = p.grad
        elif isinstance(obj, torch.optim.Optimizer):
            for i, s in enumerate(obj.state.values()):
                for k, v in s.items():
                    out[f"{name}.state{i}.{k}"] = v
    return out


def predicted_scan(name: str) -> dict:
    """``%%gpumem --scan batch=... --dry-run --fit-in CARD`` in the notebook workflow."""
    shell = _shell_with_model(name)
    _, step, _, card, values = CASES[name]
    spec = ",".join(map(str, values))
    result = shell.run_cell(
        f"%%gpumem --scan batch={spec} --dry-run --fit-in {card} -q -o s\n{step}"
    )
    assert result.success, result.error_in_exec
    s = shell.user_ns["s"]
    from jupyter_gpumem.reporters.dry_run import scan_answer

    return {
        "card": card,
        "target": s.target.label,
        "answer": scan_answer(s),
        "outside": s.outside,
        "unseen": list(s.unseen),
        "largest": s.largest,
        "runs": len(s.points),
        "seconds": s.seconds,
        "held_by": [list(h) for h in s.held_by],
        "notes": list(s.notes),
    }


def cap_of(card: str, outside: int | None = None) -> int:
    """What PyTorch may reserve on a card of that much memory: the card less what sits
    beside PyTorch (the scan's own figure where given, else the table's)."""
    from jupyter_gpumem.analysis.targets import parse_target
    from jupyter_gpumem.core.dry_run import outside_for

    target = parse_target(card)
    if outside is None:
        outside = outside_for(target, None)[0]
    return target.bytes - outside


def one(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run(
        [sys.executable, __file__, "--one", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if p.returncode != 0:
        return {"error": p.stderr[-2000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def _keep(out: dict) -> dict:
    """With ``GPUMEM_CASES_OUT`` set, the result's JSON line appended to that file."""
    path = os.environ.get("GPUMEM_CASES_OUT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(out) + "\n")
    return out


def measure(name: str) -> dict:
    batch = CASES[name][2]
    before = _device_used()
    return _keep({
        "case": name,
        "real": one("real", name, str(batch), "", str(before)),
        "predicted": one("predicted", name, str(batch)),
    })  # fmt: skip


def scan(name: str) -> dict:
    """The predicted largest batch, and two real runs under the card's cap: at it (must
    run) and 3 % above it (must run out)."""
    card = CASES[name][3]
    p = one("scan", name)
    out: dict = {"case": name, "predicted": p}
    largest = p.get("largest")
    if largest is None:
        return out
    cap = cap_of(card, p.get("outside"))
    above = math.floor(largest / 0.97) + 1
    before = _device_used()
    out["real_at_largest"] = one("real", name, str(int(largest)), str(cap), str(before))
    out["real_above"] = one("real", name, str(above), str(cap), str(before))
    return _keep(out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        how, name = sys.argv[2], sys.argv[3]
        if how == "real":
            batch, cap, before = int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
            print(json.dumps(real(name, batch, int(cap) if cap else None, before)))
        elif how == "predicted":
            print(json.dumps(predicted(name, int(sys.argv[4]))))
        else:
            print(json.dumps(predicted_scan(name)))
    elif sys.argv[1:2] == ["--scan"]:
        for case in sys.argv[2:] or list(CASES):
            print(json.dumps(scan(case)), flush=True)
    else:
        for case in sys.argv[1:] or list(CASES):
            print(json.dumps(measure(case)), flush=True)
