"""The dry run in the notebook workflow, on a GPU (tests/gpu/notebook_cases.py): the model
and optimizer built for real in one cell, the step planned in the next. The dry run's need
in a fresh process within 3 % of a real fresh process's (peak reserved plus what it holds
beside PyTorch); nothing real changes (every parameter, gradient and optimizer state equal
by value, allocated unchanged); the scan without running within 3 % below the largest
batch that really runs under the same cap, never above it (the target a card's memory as a
size, so that the dry run counts this GPU's workspaces, as the capped real run has them).
Also hostile cells on a GPU: in-place writes to real CUDA weights, a CUDA counter,
torch.save."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# three families (a decoder, an encoder, a CNN): the need within 3 %, the scan's answer runs
# and 3 % more does not. cuDNN's convolution workspaces are asked of cuDNN in the kernel's
# CUDA context (collectors/dry_run/cudnn.py): before they were, the CNN's need was a lower
# bound (-1.0 %) and its scan's answer an upper one. A ViT-B/16's step is not among them:
# memory-efficient attention's backward takes workspaces inside its kernel that the dry
# run does not size yet (its need -4.0 %, docs/planning.md)
CASES = ["gpt2_adamw", "bert_base_adamw", "resnet50_adamw"]


@pytest.mark.parametrize("case", CASES)
def test_the_need_in_a_fresh_process_counts_the_model_built_before(case):
    from tests.gpu.notebook_cases import measure

    m = measure(case)
    real, pred = m["real"], m["predicted"]
    assert "error" not in real and "error" not in pred, m
    assert pred["stopped"] is None, pred
    assert pred["unchanged"] and pred["allocated_unchanged"], pred
    assert pred["held"] > 0 and pred["held_by"], pred  # the model's parameters, at least
    assert not pred["unseen"], pred
    assert abs(pred["need"] - real["need"]) <= 0.03 * real["need"], m
    assert abs(pred["peak_allocated"] - real["peak_allocated"]) <= 0.01 * real["peak_allocated"], m


@pytest.mark.parametrize("case", CASES)
def test_a_scan_without_running_never_answers_above_what_runs(case):
    from tests.gpu.notebook_cases import scan

    s = scan(case)
    p = s["predicted"]
    assert "error" not in p and p["largest"] is not None, s
    assert not p["unseen"], p
    assert s["real_at_largest"]["out_of_memory"] is False, s  # never above the truth
    assert s["real_above"]["out_of_memory"] is True, s  # within 3 % below it


def test_hostile_cells_change_nothing_real_on_the_gpu(tmp_path):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_gpumem")
    ckpt = tmp_path / "lin.pt"
    shell.user_ns.update(torch=torch, ckpt=str(ckpt))
    shell.run_cell(
        "lin = torch.nn.Linear(256, 256).cuda()\n"
        "steps = torch.zeros((), device='cuda')\n"
        "torch.save(lin.state_dict(), ckpt)\n"
    )
    data = ckpt.read_bytes()
    weight = shell.user_ns["lin"].weight.detach().clone()
    allocated = torch.cuda.memory_allocated()
    stats = torch.cuda.memory_stats()
    r = shell.run_cell(
        "%%gpumem --dry-run -q -o plan\n"
        "with torch.no_grad():\n"
        "    lin.weight.mul_(0)\n"
        "steps += 1\n"
        "torch.save(lin.state_dict(), ckpt)\n"
    )
    after = torch.cuda.memory_stats()  # before the checks below, which allocate themselves
    assert r.success
    plan = shell.user_ns["plan"]
    assert torch.equal(shell.user_ns["lin"].weight, weight)
    assert shell.user_ns["steps"].item() == 0
    assert ckpt.read_bytes() == data
    assert plan.stopped is not None and "torch.save" in plan.stopped and "In[" in plan.stopped
    assert after["allocated_bytes.all.current"] == allocated
    for key in ("allocation.all.allocated", "segment.all.allocated"):
        assert after[key] == stats[key], key  # no real allocation, no cudaMalloc
