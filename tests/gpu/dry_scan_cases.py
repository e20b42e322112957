"""The largest batch that fits a card, predicted by dry runs (nothing runs on the GPU)
against the true largest found by bisection with real runs under the same cap, each run in
a fresh process.

    python3 tests/gpu/dry_scan_cases.py [CASE ...]      # one JSON line per case

The cap is what the scan assumes PyTorch may reserve on the card: its memory minus the
memory beside PyTorch (core/dry_run.py's table), set with
``set_per_process_memory_fraction`` in each real run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

# case -> (target card, step(batch), values the scan starts from)
# The targets are the cards' memory as sizes: for a named card of another kind the dry run
# counts that card's cuBLAS workspaces (9 MiB on a T4 or an RTX 4090 against 33 MiB here),
# which a real run on this GPU under the card's cap does not have.
CASES = {
    "gpt2_batch_rtx4090": ("24564MiB", "gpt2", (2, 4, 8)),
    "resnet50_batch_t4": ("15360MiB", "resnet50", (16, 32, 64)),
    # a Llama-architecture model of 130M parameters (bf16, AdamW), batch 1: sequence length
    "llama_seq_len_t4": ("15360MiB", "llama_seq", (1024, 2048, 4096)),
}


def step(kind: str, batch: int) -> None:
    import torch

    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        with torch.device("cuda"):
            model = GPT2LMHeadModel(GPT2Config())
            ids = torch.randint(0, 50257, (batch, 512))
        opt = torch.optim.AdamW(model.parameters())
        model(ids, labels=ids).loss.backward()
        opt.step()
    elif kind == "llama_seq":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=12,
            num_attention_heads=12,
            num_key_value_heads=12,
            vocab_size=32000,
            max_position_embeddings=1 << 17,
        )
        torch.set_default_dtype(torch.bfloat16)
        with torch.device("cuda"):
            model = LlamaForCausalLM(config)
            ids = torch.randint(0, 32000, (1, batch))
        torch.set_default_dtype(torch.float32)
        opt = torch.optim.AdamW(model.parameters())
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    else:
        import torchvision

        with torch.device("cuda"):
            model = torchvision.models.resnet50()
            x = torch.randn(batch, 3, 224, 224)
            y = torch.randint(0, 1000, (batch,))
        opt = torch.optim.AdamW(model.parameters())
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def cap_of(card: str) -> int:
    from jupyter_gpumem.analysis.targets import parse_target
    from jupyter_gpumem.core.dry_run import outside_for

    target = parse_target(card)
    return target.bytes - outside_for(target, None)[0]


def real_fits(kind: str, batch: int, cap: int) -> bool:
    code = (
        f"import sys, torch; sys.path.insert(0, {ROOT!r})\n"
        "from tests.gpu.dry_scan_cases import step\n"
        f"total = torch.cuda.get_device_properties(0).total_memory\n"
        f"torch.cuda.set_per_process_memory_fraction({cap} / total)\n"
        f"try:\n    step({kind!r}, {batch}); print('ok')\n"
        "except torch.OutOfMemoryError:\n    print('oom')\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    out = p.stdout.strip()
    if not out.endswith(("ok", "oom")):
        raise RuntimeError(f"{kind} batch {batch}: {p.stderr[-1500:]}")
    return out.endswith("ok")


def true_largest(kind: str, cap: int, start: int) -> tuple[int, int]:
    lo, hi, runs = 0, start, 0
    while real_fits(kind, hi, cap):  # double until one does not fit
        runs += 1
        lo, hi = hi, hi * 2
    runs += 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        runs += 1
        if real_fits(kind, mid, cap):
            lo = mid
        else:
            hi = mid
    return lo, runs


def predicted(card: str, kind: str, values: tuple[int, ...]) -> dict:
    import torch  # the user's import: the dry run needs it

    from jupyter_gpumem.analysis.targets import parse_target
    from jupyter_gpumem.core.dry_run import dry_run, outside_for
    from jupyter_gpumem.core.dry_scan import search
    from jupyter_gpumem.model import DryScanPoint

    target = parse_target(card)
    outside = outside_for(target, None)

    def at(v: float) -> DryScanPoint:
        r = dry_run(lambda: step(kind, int(v)), target=target)
        d = max(r.devices, key=lambda d: d.peak_reserved)
        return DryScanPoint(v, d.peak_allocated, d.peak_reserved, r.need, r.fits, r.stopped)

    t0 = time.perf_counter()
    points, largest, failing, notes = search(at, values, True)
    return {
        "largest": largest,
        "smallest_failing": failing,
        "dry_runs": len(points),
        "seconds": time.perf_counter() - t0,
        "cuda_initialized": torch.cuda.is_initialized(),
        "notes": notes,
        "outside": outside[0],
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--predict"]:
        card, kind = CASES[sys.argv[2]][:2]
        print(json.dumps(predicted(card, kind, CASES[sys.argv[2]][2])))
        sys.exit(0)
    for name in sys.argv[1:] or list(CASES):
        card, kind, values = CASES[name]
        p = subprocess.run(
            [sys.executable, __file__, "--predict", name], capture_output=True, text=True
        )
        pred = (
            json.loads(p.stdout.strip().splitlines()[-1])
            if p.returncode == 0
            else {"error": p.stderr[-1500:]}
        )
        cap = cap_of(card)
        truth, runs = true_largest(kind, cap, values[0])
        print(
            json.dumps(
                {
                    "case": name,
                    "cap": cap,
                    "true_largest": truth,
                    "real_runs": runs,
                    "predicted": pred,
                }
            ),
            flush=True,
        )
