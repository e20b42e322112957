"""A dry run's prediction against the same step run for real, each in a fresh process:
peak allocated within 1 % of the allocator's own counter, peak reserved within 3 %, and
torch's CUDA never initialised by the dry run, for 15 models of 13 families
(tests/gpu/dry_run_cases.py runs the whole list: the small MLP's reserved is 24 % under,
a ViT-B/16's inference 3.0 %, wav2vec2's and a ViT-B/16's training step's 4-5 %, as
docs/planning.md explains)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize(
    "case",
    [
        # vision: CNNs (cuDNN's workspaces asked of cuDNN), segmentation, shifted windows
        "resnet50_adamw",
        "convnext_tiny_adamw",
        "efficientnet_b0_fp16_gradscaler",
        "deeplabv3_resnet50_512",
        "swin_t_inference",
        # text: decoders, an encoder, an encoder-decoder, a 152k vocabulary in bf16
        "gpt2_adamw",
        "gpt2_amp_fp16_gradscaler",
        "bert_base_adamw",
        "t5_small_adamw",
        "qwen2_0_5b_bf16_adamw",
        "llama_1b_bf16_adamw",
        # audio, mixture of experts, RNN (cuDNN's LSTM), generation with a KV cache
        "whisper_tiny_adamw",
        "mixtral_small_moe_adamw",
        "lstm_lm_adamw",
        "gpt2_generate_64_tokens",
    ],
)
def test_the_prediction_matches_the_real_step(case):
    from tests.gpu.dry_run_cases import measure

    m = measure(case)
    real, pred = m["real"], m["predicted"]
    assert "error" not in real and "error" not in pred, m
    assert pred["stopped"] is None, pred
    assert pred["cuda_initialized"] is False  # the dry run never starts CUDA
    assert abs(pred["peak_allocated"] - real["peak_allocated"]) <= 0.01 * real["peak_allocated"], m
    assert abs(pred["peak_reserved"] - real["peak_reserved"]) <= 0.03 * real["peak_reserved"], m


def this_card() -> str:
    name = torch.cuda.get_device_name(0)
    return "H200" if "H200" in name else "H100"


def test_with_the_gpus_hidden_inference_is_predicted_the_same_and_a_backward_says_why_not():
    """In a process whose torch sees no GPU (CUDA_VISIBLE_DEVICES empty), an inference
    step's peak allocated is predicted for this card to the byte as where the GPU is
    visible, and no context is made anywhere; cuDNN cannot be asked there, so the patch
    embedding's workspace is said not seen (where the GPU is visible and a context is
    there, it is sized); a training step stops at its backward with a plain line (torch's
    autograd asks CUDA about the device). Where the GPU is visible, the context the driver
    makes is told."""
    from tests.gpu.dry_run_cases import one

    card = this_card()
    hidden = one("vit_b16_inference_mode", "predicted", card, hide_gpus=True)
    seen = one("vit_b16_inference_mode", "predicted", card)
    assert "error" not in hidden and "error" not in seen, (hidden, seen)
    assert hidden["gpus_visible"] == 0 and hidden["stopped"] is None, hidden
    assert hidden["peak_allocated"] > 500 << 20  # ViT-B/16, batch 64: about 880 MiB
    assert hidden["peak_allocated"] == seen["peak_allocated"]
    assert any(n.startswith("not seen: cuDNN's workspace") for n in hidden["notes"]), hidden
    sized = "cuDNN's workspace for convolutions: 1 calls sized"
    if seen["contexts"]:
        assert any(n.startswith(sized) for n in seen["notes"]), seen
    assert not any("CUDA context" in n for n in hidden["notes"]), hidden["notes"]
    assert seen["cuda_initialized"] is False, seen
    if seen["contexts"]:
        assert any("CUDA context" in n for n in seen["notes"]), seen["notes"]
    training = one("mlp_adamw", "predicted", card, hide_gpus=True)
    assert "error" not in training, training
    assert training["stopped"].startswith("this torch sees no GPU"), training["stopped"]
    import inspect

    from tests.gpu import dry_run_cases

    lines, first = inspect.getsourcelines(dry_run_cases._mlp_adamw)
    line = first + next(i for i, text in enumerate(lines) if ".backward()" in text)
    assert training["stopped"].endswith(f"at dry_run_cases.py:{line}"), training["stopped"]


def test_a_dry_run_runs_nothing_on_a_gpu_already_in_use():
    """In a process that already uses the GPU, a dry run of a step whose constructors make
    small tensors on the device (BatchNorm's ``num_batches_tracked``, ``torch.tensor``
    with ``device=``, ``torch.tensor([]).to``) allocates nothing for real: the
    allocator's cumulative counts of allocations and segments stay where they were."""
    import jupyter_gpumem

    keep = torch.ones(1, device="cuda")
    torch.cuda.synchronize()

    def step():
        with torch.device("cuda"):
            bn = torch.nn.BatchNorm2d(8)
            lin = torch.nn.Linear(64, 8 * 4 * 4)
            scale = torch.tensor([0.5, 2.0], device="cuda")
            empty = torch.tensor([]).to("cuda")
            x = torch.randn(16, 64)
        y = bn(lin(x).view(16, 8, 4, 4)) * scale[0] + empty.sum()
        y.square().mean().backward()

    before = torch.cuda.memory_stats()
    plan = jupyter_gpumem.dry_run(step)
    after = torch.cuda.memory_stats()
    assert plan.stopped is None, plan.notes
    (d,) = plan.devices
    assert d.peak_allocated > 0
    for key in (
        "allocation.all.allocated",
        "segment.all.allocated",
        "allocated_bytes.all.allocated",
        "reserved_bytes.all.allocated",
    ):
        assert after[key] == before[key], (key, before[key], after[key])
    assert not any("changed by" in n for n in plan.notes), plan.notes
    del keep


def test_the_cell_magic_predicts_then_checks_against_the_real_run(shell):
    """`%%gpumem --dry-run --check` in a real shell on the GPU: the prediction first (the
    cell's names untouched by it), then the real run, whose measured peaks are the
    allocator's own, side by side."""
    from IPython.utils.capture import capture_output

    shell.run_line_magic("load_ext", "jupyter_gpumem")
    try:
        shell.run_cell("import torch\nwarm = torch.ones(1, device='cuda')")
        body = (
            "%%gpumem --dry-run --check --fit-in H200 -o plan\n"
            "big = torch.empty(300 << 20, dtype=torch.uint8, device='cuda')\n"
            "tmp = torch.empty(100 << 20, dtype=torch.uint8, device='cuda')\n"
            "del tmp\n"
        )
        with capture_output() as cap:
            res = shell.run_cell(body)
        assert res.success, res.error_in_exec
        plan = shell.user_ns["plan"]
        (d,) = plan.devices
        assert (d.peak_allocated, d.peak_reserved) == (400 << 20, 400 << 20)
        (c,) = plan.checks
        assert c.ran and (c.peak_allocated, c.peak_reserved) == (400 << 20, 400 << 20)
        assert plan.fits is True
        assert "big" in shell.user_ns  # the real run bound it; the dry run did not
        text = cap.outputs[0].data["text/plain"]
        assert "check, run for real on cuda:0: peak allocated 400.00 MiB measured" in text
        # what the peak was made of, measured by --breakdown's machinery beside the prediction
        assert c.breakdown is not None and d.breakdown is not None
        assert c.breakdown.bytes_of("temporaries") == d.breakdown.bytes_of("temporaries")
        assert d.breakdown.bytes_of("temporaries") == 400 << 20
        assert "what the peak was made of, predicted / measured" in text
    finally:
        shell.run_line_magic("unload_ext", "jupyter_gpumem")
        for name in ("big", "warm", "plan"):
            shell.user_ns.pop(name, None)


def test_an_8b_model_is_planned_and_a_card_it_does_not_fit_is_told():
    """Llama-3-8B's shape from its config, LoRA with peft: predicted within the bounds of
    the real step on this GPU, and for a T4 predicted not to fit, where the real step
    under the T4's cap runs out of memory."""
    pytest.importorskip("peft")
    from tests.gpu.dry_run_cases import measure

    m = measure("llama_8b_lora")
    real, pred = m["real"], m["predicted"]
    assert "error" not in real and "error" not in pred, m
    assert pred["stopped"] is None and pred["cuda_initialized"] is False, pred
    assert abs(pred["peak_allocated"] - real["peak_allocated"]) <= 0.01 * real["peak_allocated"], m
    assert abs(pred["peak_reserved"] - real["peak_reserved"]) <= 0.03 * real["peak_reserved"], m
    assert m["predicted_for_target"]["fits"] is False, m
    assert m["real_under_target"]["out_of_memory"] is True, m


def test_a_full_8b_fine_tune_is_predicted_not_to_fit_this_gpu_where_it_runs_out():
    from tests.gpu.dry_run_cases import measure

    m = measure("llama_8b_full_fp32_autocast")
    pred, real = m["predicted_for_target"], m["real_under_target"]
    assert "error" not in pred and "error" not in real, m
    assert pred["stopped"] is None and pred["fits"] is False, pred
    assert real["out_of_memory"] is True, real
    # it ran out at a point below the predicted need: the prediction is not an underestimate
    assert pred["peak_allocated"] >= real["peak_allocated"], m


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_fsdp2_on_two_gpus_per_rank_peak_within_5_percent():
    from tests.gpu.fsdp_world_cases import measure

    m = measure("gpt2_fsdp2")
    assert "real_error" not in m and "predicted_error" not in m, m
    assert abs(m["error_allocated_pct"]) <= 5 and abs(m["error_reserved_pct"]) <= 5, m
