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
from typing import Any

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


def _gpt2_amp_fp16_gradscaler() -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("cuda"):
        model = GPT2LMHeadModel(GPT2Config())
        ids = torch.randint(0, 50257, (8, 512))
    opt = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(ids, labels=ids).loss
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


def llama_config(size: str) -> Any:
    from transformers import LlamaConfig

    if size == "1b":  # TinyLlama-1.1B's shape
        return LlamaConfig(
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=22,
            num_attention_heads=32,
            num_key_value_heads=4,
            vocab_size=32000,
        )
    # Llama-3-8B's shape
    return LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=8192,
        rope_theta=500000.0,
    )


def _llama(size: str, batch: int, seq: int, dtype: str, lora: bool = False) -> None:
    """A Llama-architecture model from its config (no checkpoint), built in ``dtype``
    directly, one training step with AdamW (with ``lora``: peft's LoRA on q/v, r=16;
    with ``dtype="float32"``: bf16 autocast over fp32 weights)."""
    import torch
    from transformers import LlamaForCausalLM

    config = llama_config(size)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16 if dtype == "bfloat16" else torch.float32)
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(config)
            if lora:
                from peft import LoraConfig, get_peft_model

                model = get_peft_model(
                    model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"])
                )
            ids = torch.randint(0, config.vocab_size, (batch, seq))
    finally:
        torch.set_default_dtype(old)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    if dtype == "float32":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
    else:
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()


def _torchvision(name: str, batch: int, size: int = 224, train: bool = True, amp: bool = False):
    """A torchvision model's step: AdamW training (fp16 autocast with GradScaler when
    ``amp``), or inference under ``inference_mode``."""
    import torch
    import torchvision

    build: Any = torchvision.models
    for part in name.split("."):
        build = getattr(build, part)
    with torch.device("cuda"):  # no weights: nothing is downloaded
        model = build(
            weights=None, **({"weights_backbone": None} if "segmentation" in name else {})
        )
        x = torch.randn(batch, 3, size, size)
    if not train:
        with torch.inference_mode():
            model.eval()(x)
        return
    opt = torch.optim.AdamW(model.parameters())
    if amp:
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(x)
        out = out["out"] if isinstance(out, dict) else out
        scaler.scale(out.float().square().mean()).backward()
        scaler.step(opt)
        scaler.update()
        return
    out = model(x)
    out = out["out"] if isinstance(out, dict) else out
    out.square().mean().backward()
    opt.step()


def _transformers(kind: str) -> None:
    """Families from transformers' configs (no checkpoint): an encoder-decoder (T5-small's
    shape), speech (Whisper-tiny's, wav2vec2-base's), a mixture of experts (a small Mixtral),
    a decoder with a 152k vocabulary (Qwen2-0.5B's shape, bf16)."""
    import torch
    import transformers as tf

    with torch.device("cuda"):
        if kind == "t5":
            model = tf.T5ForConditionalGeneration(
                tf.T5Config(decoder_start_token_id=0, pad_token_id=0)
            )
            ids = torch.randint(0, 32000, (16, 256))
            batch = {"input_ids": ids, "labels": ids}
        elif kind == "whisper":
            model = tf.WhisperForConditionalGeneration(
                tf.WhisperConfig(d_model=384, encoder_layers=4, decoder_layers=4,
                                 encoder_attention_heads=6, decoder_attention_heads=6)
            )  # fmt: skip
            batch = {
                "input_features": torch.randn(8, 80, 3000),
                "labels": torch.randint(0, 51865, (8, 64)),
            }
        elif kind == "wav2vec2":
            # SpecAugment off: its mask embedding is made with torch.Tensor(n), on the CPU
            # whatever the default device, so the real step fails on a model built on the GPU;
            # LayerDrop off: it skips random layers, so no two real steps hold the same
            model = tf.Wav2Vec2ForCTC(tf.Wav2Vec2Config(mask_time_prob=0.0, layerdrop=0.0))
            batch = {
                "input_values": torch.randn(8, 160000),
                "labels": torch.randint(1, 32, (8, 100)),
            }
        elif kind == "mixtral":
            config = tf.MixtralConfig(
                hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                num_attention_heads=8, num_key_value_heads=8, num_local_experts=8,
                num_experts_per_tok=2, vocab_size=32000,
            )  # fmt: skip
            model = tf.MixtralForCausalLM(config)
            ids = torch.randint(0, 32000, (8, 512))
            batch = {"input_ids": ids, "labels": ids}
        else:  # qwen2
            torch.set_default_dtype(torch.bfloat16)
            config = tf.Qwen2Config(
                hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
            )  # fmt: skip
            model = tf.Qwen2ForCausalLM(config)
            ids = torch.randint(0, 151936, (4, 1024))
            batch = {"input_ids": ids, "labels": ids}
    model.train()
    opt = torch.optim.AdamW(model.parameters())
    model(**batch).loss.backward()
    opt.step()


def _lstm_lm() -> None:
    import torch
    from torch import nn

    with torch.device("cuda"):
        emb, head = nn.Embedding(10000, 1024), nn.Linear(1024, 10000)
        lstm = nn.LSTM(1024, 1024, num_layers=2, batch_first=True, dropout=0.2)
        ids = torch.randint(0, 10000, (32, 128))
    params = [*emb.parameters(), *lstm.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params)
    out, _ = lstm(emb(ids))
    nn.functional.cross_entropy(head(out).flatten(0, 1), ids.flatten()).backward()
    opt.step()


def _gpt2_generate() -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("cuda"):
        model = GPT2LMHeadModel(GPT2Config()).eval()
        ids = torch.randint(0, 50257, (8, 128))
    model.generate(ids, max_new_tokens=64, do_sample=False, pad_token_id=0)


CASES: dict[str, Callable[[], None]] = {
    "mlp_adamw": _mlp_adamw,
    "resnet50_adamw": _resnet50_adamw,
    "vit_b16_inference_mode": _vit_b16_inference,
    "gpt2_adamw": _gpt2,
    "gpt2_checkpointing": lambda: _gpt2(checkpointing=True),
    "gpt2_bf16_autocast": _gpt2_bf16_autocast,
    "bert_base_adamw": _bert_base,
    "gpt2_amp_fp16_gradscaler": _gpt2_amp_fp16_gradscaler,
    "llama_1b_bf16_adamw": lambda: _llama("1b", 4, 1024, "bfloat16"),
    # too large for most single GPUs: LoRA fits an H100, full fine-tuning fits no H200
    "llama_8b_lora": lambda: _llama("8b", 1, 1024, "bfloat16", lora=True),
    "llama_8b_full_fp32_autocast": lambda: _llama("8b", 1, 2048, "float32"),
    # more families: vision, speech, encoder-decoder, mixture of experts, RNN, generation
    "convnext_tiny_adamw": lambda: _torchvision("convnext_tiny", 64),
    "efficientnet_b0_fp16_gradscaler": lambda: _torchvision("efficientnet_b0", 64, amp=True),
    "deeplabv3_resnet50_512": lambda: _torchvision("segmentation.deeplabv3_resnet50", 4, 512),
    "swin_t_inference": lambda: _torchvision("swin_t", 64, train=False),
    "vit_b16_adamw": lambda: _torchvision("vit_b_16", 32),
    "t5_small_adamw": lambda: _transformers("t5"),
    "whisper_tiny_adamw": lambda: _transformers("whisper"),
    "wav2vec2_base_ctc": lambda: _transformers("wav2vec2"),
    "mixtral_small_moe_adamw": lambda: _transformers("mixtral"),
    "qwen2_0_5b_bf16_adamw": lambda: _transformers("qwen2"),
    "lstm_lm_adamw": _lstm_lm,
    "gpt2_generate_64_tokens": _gpt2_generate,
}
# cases also planned for a card they do not fit, and run for real under that card's cap
# (the cap the dry run assumes: the card's memory minus what sits beside PyTorch), where
# the real run must run out of memory. "here": this GPU's own memory, no cap.
TARGETS: dict[str, str] = {
    "llama_8b_lora": "T4",  # it runs under an RTX 4090's cap (23.35 GB allocated, H200)
    "llama_8b_full_fp32_autocast": "here",
}
NOT_RUN_WHOLE = {"llama_8b_full_fp32_autocast"}  # no GPU here holds it: real run = OOM only


def cap_of(card: str) -> int | None:
    if card == "here":
        return None
    from jupyter_gpumem.analysis.targets import parse_target
    from jupyter_gpumem.core.dry_run import outside_for

    target = parse_target(card)
    return target.bytes - outside_for(target, None)[0]


def real(name: str, card: str | None = None) -> dict:
    import torch

    torch.cuda.init()
    cap = cap_of(card) if card else None
    if cap is not None:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(cap / total)
    out: dict = {"cap": cap}
    try:
        CASES[name]()
        torch.cuda.synchronize()
        out["out_of_memory"] = False
    except torch.OutOfMemoryError as e:
        out["out_of_memory"] = True
        out["message"] = str(e).splitlines()[0][:300]
    out["peak_allocated"] = torch.cuda.max_memory_allocated()
    out["peak_reserved"] = torch.cuda.max_memory_reserved()
    return out


def predicted(name: str, card: str | None = None) -> dict:
    import time

    import torch

    import jupyter_gpumem

    if card == "here":  # this GPU's card, read through NVML (torch's would start CUDA)
        import pynvml

        pynvml.nvmlInit()
        gpu = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        card = "H200" if "H200" in str(gpu) else "H100"
    t0 = time.perf_counter()
    r = jupyter_gpumem.dry_run(CASES[name], fit_in=card)
    d = max(r.devices, key=lambda d: d.peak_reserved) if r.devices else None
    return {
        "peak_allocated": d.peak_allocated if d else None,
        "peak_reserved": d.peak_reserved if d else None,
        "workspaces": d.workspaces if d else None,
        "seconds": time.perf_counter() - t0,
        "stopped": r.stopped,
        "notes": list(r.notes),
        "target": card,
        "fits": r.fits,
        "headroom": r.headroom,
        "need": r.need,
        "cuda_initialized": torch.cuda.is_initialized(),
        "gpus_visible": torch.cuda.device_count(),
        "contexts": [
            i for i in range(torch.cuda.device_count()) if torch._C._cuda_hasPrimaryContext(i)
        ],
    }


def one(name: str, how: str, card: str | None = None, *, hide_gpus: bool = False) -> dict:
    """``how`` ("real" or "predicted") of case ``name`` in a fresh process; ``hide_gpus``:
    with CUDA_VISIBLE_DEVICES empty (torch's CUDA build sees no GPU)."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if hide_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    p = subprocess.run(
        [sys.executable, __file__, "--one", how, name, card or ""],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if p.returncode != 0:
        return {"error": p.stderr[-1500:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def measure(name: str) -> dict:
    """Case ``name`` predicted and run for real; with ``GPUMEM_CASES_OUT`` set, its JSON
    line is also appended to that file (the tests' figures, for the docs)."""
    out: dict = {"case": name}
    if name not in NOT_RUN_WHOLE:
        out["real"] = one(name, "real")
        out["predicted"] = one(name, "predicted")
    card = TARGETS.get(name)
    if card is not None:
        out["target"] = card
        out["predicted_for_target"] = one(name, "predicted", card)
        out["real_under_target"] = one(name, "real", card)
    path = os.environ.get("GPUMEM_CASES_OUT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(out) + "\n")
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        how, name = sys.argv[2], sys.argv[3]
        card = (sys.argv[4] if len(sys.argv) > 4 else "") or None
        print(json.dumps(real(name, card) if how == "real" else predicted(name, card)))
    else:
        for case in sys.argv[1:] or list(CASES):
            print(json.dumps(measure(case)), flush=True)
