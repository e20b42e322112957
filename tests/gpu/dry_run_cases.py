"""Real models' training and inference steps, each predicted by a dry run and measured for
real, each in a fresh process (an empty allocator, as the prediction assumes).

    python3 tests/gpu/dry_run_cases.py [CASE ...]      # one JSON line per case

A case builds its model inside the step under ``with torch.device("cuda")`` (so that the
dry run builds it too, fake) and runs one step. ``real``: the allocator's own peaks;
``predicted``: ``jupyter_gpumem.dry_run`` in another process that never starts CUDA.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _mlp_adamw() -> None:
    import torch

    with torch.device("cuda"):
        net = torch.nn.Sequential(
            torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
        )
        x = torch.randn(2048, 1024)
    opt = torch.optim.AdamW(net.parameters())
    net(x).square().mean().backward()
    opt.step()


def _resnet50_adamw() -> None:
    import torch
    import torchvision

    with torch.device("cuda"):
        model = torchvision.models.resnet50()
        x = torch.randn(32, 3, 224, 224)
        y = torch.randint(0, 1000, (32,))
    opt = torch.optim.AdamW(model.parameters())
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def _vit_b16_inference() -> None:
    import torch
    import torchvision

    with torch.device("cuda"):
        model = torchvision.models.vit_b_16().eval()
        x = torch.randn(64, 3, 224, 224)
    with torch.inference_mode():
        model(x)


def _gpt2(batch: int = 8, seq: int = 512, checkpointing: bool = False) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("cuda"):
        model = GPT2LMHeadModel(GPT2Config())
        ids = torch.randint(0, 50257, (batch, seq))
    if checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.AdamW(model.parameters())
    model(ids, labels=ids).loss.backward()
    opt.step()


def _gpt2_bf16_autocast() -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("cuda"):
        model = GPT2LMHeadModel(GPT2Config())
        ids = torch.randint(0, 50257, (8, 512))
    opt = torch.optim.AdamW(model.parameters())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(ids, labels=ids).loss
    loss.backward()
    opt.step()


def _bert_base() -> None:
    import torch
    from transformers import BertConfig, BertForMaskedLM

    with torch.device("cuda"):
        model = BertForMaskedLM(BertConfig())
        ids = torch.randint(0, 30522, (16, 512))
    opt = torch.optim.AdamW(model.parameters())
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()


CASES: dict[str, Callable[[], None]] = {
    "mlp_adamw": _mlp_adamw,
    "resnet50_adamw": _resnet50_adamw,
    "vit_b16_inference_mode": _vit_b16_inference,
    "gpt2_adamw": _gpt2,
    "gpt2_checkpointing": lambda: _gpt2(checkpointing=True),
    "gpt2_bf16_autocast": _gpt2_bf16_autocast,
    "bert_base_adamw": _bert_base,
}


def real(name: str) -> dict:
    import torch

    torch.cuda.init()
    CASES[name]()
    torch.cuda.synchronize()
    return {
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "peak_reserved": torch.cuda.max_memory_reserved(),
    }


def predicted(name: str) -> dict:
    import time

    import torch

    import jupyter_gpumem

    t0 = time.perf_counter()
    r = jupyter_gpumem.dry_run(CASES[name])
    d = r.devices[0] if r.devices else None
    return {
        "peak_allocated": d.peak_allocated if d else None,
        "peak_reserved": d.peak_reserved if d else None,
        "workspaces": d.workspaces if d else None,
        "seconds": time.perf_counter() - t0,
        "stopped": r.stopped,
        "notes": list(r.notes),
        "cuda_initialized": torch.cuda.is_initialized(),
    }


def one(name: str, how: str) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run(
        [sys.executable, __file__, "--one", how, name], env=env, capture_output=True, text=True
    )
    if p.returncode != 0:
        return {"error": p.stderr[-1500:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def measure(name: str) -> dict:
    return {"case": name, "real": one(name, "real"), "predicted": one(name, "predicted")}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        how, name = sys.argv[2], sys.argv[3]
        print(json.dumps(real(name) if how == "real" else predicted(name)))
    else:
        for case in sys.argv[1:] or list(CASES):
            print(json.dumps(measure(case)), flush=True)
