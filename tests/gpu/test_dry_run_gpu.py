"""A dry run's prediction against the same step run for real, each in a fresh process:
peak allocated within 1 % of the allocator's own counter, peak reserved within 3 %, and
torch's CUDA never initialised by the dry run (tests/gpu/dry_run_cases.py
runs the whole list of models; here two of them: the small MLP's reserved is 24 % under,
as docs/planning.md explains)."""

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
        "resnet50_adamw",
        "vit_b16_inference_mode",
        "gpt2_adamw",
        "gpt2_amp_fp16_gradscaler",
        "llama_1b_bf16_adamw",
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
