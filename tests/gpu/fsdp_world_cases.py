"""Multi-GPU training steps of real models (not written here), each predicted for rank 0
by ``jupyter_gpumem.dry_run(step, world_size=2)`` in a fresh process that never runs a
kernel, and run for real with two processes on two GPUs.

    python3 tests/gpu/fsdp_world_cases.py --all [CASE ...]   # one JSON line per case
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 \\
        tests/gpu/fsdp_world_cases.py --real CASE              # one JSON line per rank
    python3 tests/gpu/fsdp_world_cases.py --dry CASE         # one JSON line: the prediction
    python3 tests/gpu/fsdp_world_cases.py --list             # the cases

Needs two CUDA GPUs, torch with NCCL, and transformers (the models are built from their
configs: no download). ``--all`` runs ``--real`` through ``torch.distributed.run`` and
``--dry`` in a fresh process for each case, each under a timeout (its whole process group
is killed past it), and prints the real peaks of each rank, the predicted ones and the
error of the prediction against rank 0 (the rank a dry run plays) in percent.

What is compared: what one step function allocates in a fresh process. The step builds its
model itself (inside the function, under ``with torch.device("cuda")`` or on the meta
device), shards it, and trains it for ``STEPS`` steps; the model's build counts in both the
real peak and the prediction. The real run resets PyTorch's peak counters after
``init_process_group`` (which allocates nothing from PyTorch's allocator: NCCL's
communicator and buffers are its own) and before the step, with nothing allocated yet, so
``max_memory_allocated`` / ``max_memory_reserved`` are the step's peaks above an empty
allocator, as the dry run predicts them. NCCL's own memory is in neither.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORLD_SIZE = 2
STEPS = 2
REAL_TIMEOUT = 300  # seconds for one case's real run (both ranks), start included
DRY_TIMEOUT = 300  # seconds for one case's prediction, torch's imports included
# NVLink multicast stays off (the GPU machines ask for it; a run must not turn it on)
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


# -- the cases: one step function each, the same code for the real run and the dry run --------
def _fully_shard_blocks(model: Any, blocks: Any) -> None:
    from torch.distributed.fsdp import fully_shard

    for block in blocks:
        fully_shard(block)
    fully_shard(model)


def _train(model: Any, opt: Any, batch: Callable[[], Any], steps: int = STEPS) -> None:
    for _ in range(steps):
        ids = batch()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()


def gpt2_fsdp2() -> None:
    """GPT-2 (124M), fp32, each block and the root ``fully_shard``-ed, AdamW, 8 x 512."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("cuda"):
        model = GPT2LMHeadModel(GPT2Config())
    _fully_shard_blocks(model, model.transformer.h)
    opt = torch.optim.AdamW(model.parameters())
    _train(model, opt, lambda: torch.randint(0, 50257, (8, 512), device="cuda"))


def _llama_config() -> Any:
    from transformers import LlamaConfig

    # about 0.9 B parameters: 16 layers of 2048, grouped-query attention (8 KV heads)
    return LlamaConfig(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=8,
        vocab_size=32000,
        max_position_embeddings=4096,
    )


def llama_fsdp2_bf16() -> None:
    """A Llama of 0.9 B parameters in bf16, built on the meta device, each decoder layer
    and the root ``fully_shard``-ed, then materialised on the GPU (``to_empty``: each rank
    holds only its shards; their values are left as they come, which a memory test does
    not mind), AdamW, 4 x 1024. bf16 by the default dtype: ``.to(dtype)`` on a module
    can't swap its parameters under the fake mode."""
    import torch
    from transformers import LlamaForCausalLM

    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            model = LlamaForCausalLM(_llama_config())
    finally:
        torch.set_default_dtype(dtype)
    _fully_shard_blocks(model, model.model.layers)
    model.to_empty(device="cuda")
    opt = torch.optim.AdamW(model.parameters())
    _train(model, opt, lambda: torch.randint(0, 32000, (4, 1024), device="cuda"))


def gpt2_ddp() -> None:
    """GPT-2 (124M), fp32, in DistributedDataParallel (its gradient buckets), AdamW,
    8 x 512."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("cuda"):
        model = GPT2LMHeadModel(GPT2Config())
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters())
    _train(ddp, opt, lambda: torch.randint(0, 50257, (8, 512), device="cuda"))


CASES: dict[str, Callable[[], None]] = {
    "gpt2_fsdp2": gpt2_fsdp2,
    "llama_0.9b_fsdp2_bf16": llama_fsdp2_bf16,
    "gpt2_ddp": gpt2_ddp,
}


# -- one process each ---------------------------------------------------------------------------
def real(name: str) -> dict[str, Any]:
    """One rank of the real job (started by torch.distributed.run): its peaks."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", timeout=timedelta(seconds=120))
    before = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    CASES[name]()
    torch.cuda.synchronize()
    out = {
        "rank": rank,
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "peak_reserved": torch.cuda.max_memory_reserved(),
        "allocated_before": before[0],
        "reserved_before": before[1],
        "seconds": round(time.perf_counter() - t0, 2),
        "device": torch.cuda.get_device_name(local),
        "torch": torch.__version__,
    }
    dist.barrier()
    dist.destroy_process_group()
    return out


def predicted(name: str) -> dict[str, Any]:
    """The dry run of the same step as rank 0 of ``WORLD_SIZE``, in this fresh process."""
    import torch

    sys.path.insert(0, ROOT)
    import jupyter_gpumem

    t0 = time.perf_counter()
    r = jupyter_gpumem.dry_run(CASES[name], world_size=WORLD_SIZE)
    d = r.devices[0] if r.devices else None
    return {
        "peak_allocated": d.peak_allocated if d else None,
        "peak_reserved": d.peak_reserved if d else None,
        "workspaces": d.workspaces if d else None,
        "world_size": r.world_size,
        "seconds": round(time.perf_counter() - t0, 2),
        "stopped": r.stopped,
        "notes": list(r.notes),
        "cuda_initialized": torch.cuda.is_initialized(),
    }


# -- the driver -----------------------------------------------------------------------------------
def _run(cmd: list[str], timeout: float) -> tuple[int | None, str, str]:
    """Run ``cmd`` in its own process group; past ``timeout`` the whole group is killed
    (torch.distributed.run's workers too). Returns (exit code or None, stdout, stderr)."""
    env = {
        **os.environ,
        **SAFE_ENV,
        "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    p = subprocess.Popen(
        cmd,
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out, err + f"\n(killed after {timeout:.0f} s)"


def _json_lines(text: str) -> list[dict[str, Any]]:
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                pass
    return found


def _percent(predicted: int | None, real: int | None) -> float | None:
    if not predicted or not real:
        return None
    return round(100 * (predicted - real) / real, 2)


def measure(name: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    code, out, err = _run(
        [*launcher, "--nproc-per-node", str(WORLD_SIZE), __file__, "--real", name], REAL_TIMEOUT
    )
    ranks = sorted(_json_lines(out), key=lambda r: r.get("rank", -1))
    result: dict[str, Any] = {"case": name, "world_size": WORLD_SIZE, "real": ranks}
    if code != 0 or len(ranks) != WORLD_SIZE:
        result["real_error"] = err[-2000:]
    code, out, err = _run([sys.executable, __file__, "--dry", name], DRY_TIMEOUT)
    lines = _json_lines(out)
    result["predicted"] = lines[-1] if lines else None
    if code != 0 or not lines:
        result["predicted_error"] = err[-2000:]
    rank0 = next((r for r in ranks if r.get("rank") == 0), None)
    pred = result["predicted"] or {}
    if rank0 is not None:
        result["error_allocated_pct"] = _percent(
            pred.get("peak_allocated"), rank0["peak_allocated"]
        )
        result["error_reserved_pct"] = _percent(pred.get("peak_reserved"), rank0["peak_reserved"])
    result["seconds"] = round(time.perf_counter() - t0, 1)
    return result


def main(argv: list[str]) -> int:
    if argv[:1] == ["--real"] and len(argv) == 2:
        print(json.dumps(real(argv[1])), flush=True)
        return 0
    if argv[:1] == ["--dry"] and len(argv) == 2:
        print(json.dumps(predicted(argv[1])), flush=True)
        return 0
    if argv[:1] == ["--list"]:
        print("\n".join(CASES))
        return 0
    if argv[:1] == ["--all"]:
        names = argv[1:] or list(CASES)
        unknown = [n for n in names if n not in CASES]
        if unknown:
            print(f"no such case: {', '.join(unknown)} (--list)", file=sys.stderr)
            return 2
        for name in names:
            print(json.dumps(measure(name)), flush=True)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
