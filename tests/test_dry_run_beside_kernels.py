"""What a dry run adds beside the fake kernels, on the CPU: cuDNN convolutions' workspaces
(the calls PyTorch's cuDNN path makes, as the descriptors cuDNN is asked with, and the
0-byte placeholders sized when the run ends), CTC loss's ``log_alpha`` (sized by the
longest target), dropouts that return their input (as ATen's do, where the fake mode's
decomposition clones it), composite ops split into their recorded parts under inference
mode, and fused attention's temporaries. The GPU side (cuDNN asked on an H200, whole models
against real steps) is tests/gpu/test_dry_run_gpu.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from jupyter_gpumem.collectors.dry_run import Alloc, record  # noqa: E402
from jupyter_gpumem.collectors.dry_run import conv as conv_module  # noqa: E402
from jupyter_gpumem.collectors.dry_run import cudnn as cudnn_module  # noqa: E402
from jupyter_gpumem.core.dry_run import dry_run  # noqa: E402

MiB = 1 << 20


@pytest.fixture
def cudnn_backend(monkeypatch):
    """PyTorch's backend choice answered "Cudnn", as on a GPU (a CPU build picks its own)."""
    monkeypatch.setattr(conv_module, "backend", lambda t, args: "Cudnn")


def _calls(name, args, out):
    return conv_module.conv_calls(torch, name, args, out, (False, True))


def _conv_args(x, w, stride=(1, 1), padding=(1, 1)):
    return (x, w, None, list(stride), list(padding), [1] * len(stride), False, [0] * len(stride), 1)


def test_a_forward_is_one_call_with_the_tensors_as_cudnn_sees_them(cudnn_backend):
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    y = torch.nn.functional.conv2d(x, w, padding=1)
    (call,) = _calls("convolution", _conv_args(x, w), y)
    assert call.op == "forward"
    assert (call.x.dims, call.x.strides) == ((2, 3, 8, 8), (192, 64, 8, 1))
    assert (call.w.dims, call.y.dims) == ((4, 3, 3, 3), (2, 4, 8, 8))
    assert (call.padding, call.stride, call.dilation) == ((1, 1), (1, 1), (1, 1))
    assert call.x.alignment == 32 and call.data_type == 0 and call.compute_type == 0


def test_channels_last_gives_nhwc_strides_and_size_one_dims_follow_pytorch(cudnn_backend):
    x = torch.randn(2, 3, 1, 5).to(memory_format=torch.channels_last)
    w = torch.randn(4, 3, 1, 1).to(memory_format=torch.channels_last)
    y = torch.nn.functional.conv2d(x, w)
    (call,) = _calls("convolution", _conv_args(x, w, padding=(0, 0)), y)
    # NHWC: C innermost; H (size 1) gets fixSizeOneDimStride's stride W * C
    assert call.x.strides == (15, 1, 15, 3)
    assert call.w.strides == (3, 1, 3, 3)


def test_a_1d_convolution_is_seen_as_2d_of_height_one(cudnn_backend):
    x, w = torch.randn(2, 3, 10), torch.randn(4, 3, 3)
    y = torch.nn.functional.conv1d(x, w, stride=2, padding=1)
    args = (x, w, None, [2], [1], [1], False, [0], 1)
    (call,) = _calls("convolution", args, y)
    assert call.x.dims == (2, 3, 1, 10) and call.y.dims == (2, 4, 1, 5)
    assert (call.stride, call.padding, call.dilation) == ((1, 2), (0, 1), (1, 1))


def test_a_backward_runs_the_data_gradient_then_the_filter_gradient(cudnn_backend):
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    dy = torch.randn(2, 4, 8, 8)
    args = (dy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    both = _calls("convolution_backward", (*args, [True, True, False]), None)
    assert [c.op for c in both] == ["backward data", "backward filter"]
    assert both[0].x.dims == (2, 3, 8, 8) and both[0].y.dims == (2, 4, 8, 8)
    only_w = _calls("convolution_backward", (*args, [False, True, True]), None)
    assert [c.op for c in only_w] == ["backward filter"]


def test_a_transposed_convolution_is_cudnns_backward_data(monkeypatch):
    monkeypatch.setattr(conv_module, "backend", lambda t, args: "CudnnTranspose")
    x, w = torch.randn(2, 4, 5, 5), torch.randn(4, 3, 2, 2)
    y = torch.nn.functional.conv_transpose2d(x, w, stride=2)
    args = (x, w, None, [2, 2], [0, 0], [1, 1], True, [0, 0], 1)
    (call,) = _calls("convolution", args, y)
    assert call.op == "backward data"
    assert call.x.dims == (2, 3, 10, 10) and call.y.dims == (2, 4, 5, 5)


def test_the_alignment_follows_the_storage_offset(cudnn_backend):
    base = torch.randn(2 * 3 * 8 * 8 + 1)
    x = base[1:].view(2, 3, 8, 8)  # 4 bytes past the block's start
    w = torch.randn(4, 3, 3, 3)
    y = torch.nn.functional.conv2d(x, w, padding=1)
    (call,) = _calls("convolution", _conv_args(x, w), y)
    assert call.x.alignment == 4


def test_another_backend_runs_no_cudnn_call():
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    y = torch.nn.functional.conv2d(x, w, padding=1)
    assert _calls("convolution", _conv_args(x, w), y) == []


def _step():
    conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    x = torch.randn(4, 3, 32, 32)
    conv(x).sum().backward()


def test_each_call_takes_its_workspace_sized_at_the_end_and_gives_it_back(
    cudnn_backend, monkeypatch
):
    sizes = {"forward": 1 * MiB, "backward data": 3 * MiB, "backward filter": 2 * MiB}
    monkeypatch.setattr(cudnn_module, "sizer", lambda t, d: (lambda c: sizes[c.op], "sizes given"))
    run = record(_step, device_type="cpu")
    assert run.error is None
    spaces = [e for e in run.events if isinstance(e, Alloc) and e.kind == "cudnn workspace"]
    # the input needs no gradient: backward runs the filter gradient only
    assert [e.nbytes for e in spaces] == [1 * MiB, 2 * MiB]
    at = [run.events.index(e) for e in spaces]
    assert all(run.events[i + 1].key == spaces[n].key for n, i in enumerate(at))  # freed at once
    assert any("2 calls sized, sizes given" in n for n in run.notes), run.notes
    assert "cuDNN's workspace for convolutions" not in run.unseen
    with_spaces = dry_run(_step, device_type="cpu").devices[0].peak_allocated
    monkeypatch.setattr(cudnn_module, "sizer", lambda t, d: (lambda c: 0, "none"))
    without = dry_run(_step, device_type="cpu").devices[0].peak_allocated
    assert 0 < with_spaces - without <= 2 * MiB


def test_without_a_context_the_workspaces_are_not_seen_and_said_so(cudnn_backend, monkeypatch):
    monkeypatch.setattr(cudnn_module, "sizer", lambda t, d: (None, "no CUDA context"))
    run = record(_step, device_type="cpu")
    spaces = [e for e in run.events if isinstance(e, Alloc) and e.kind == "cudnn workspace"]
    assert spaces and all(e.nbytes == 0 for e in spaces)
    assert "cuDNN's workspace for convolutions" in run.unseen
    assert any("not seen" in n and "no CUDA context" in n for n in run.notes), run.notes


def _ctc(lengths):
    def run():
        log_probs = torch.randn(50, 4, 20).log_softmax(2)
        targets = torch.randint(1, 20, (4, 30))
        torch.nn.functional.ctc_loss(log_probs, targets, torch.full((4,), 50), lengths())

    return run


def _log_alpha(run) -> list[int]:
    return [e.nbytes for e in record(run, device_type="cpu").events
            if isinstance(e, Alloc) and "ctc_loss" in e.op and e.nbytes > 16]  # fmt: skip


def test_ctc_loss_is_sized_by_the_longest_target_when_the_lengths_are_known():
    known = _ctc(lambda: torch.tensor([10, 25, 7, 12]))
    assert _log_alpha(known) == [4 * 50 * (2 * 25 + 1) * 4]


def test_ctc_loss_with_unknown_lengths_is_planned_as_the_worst_case_and_said_so():
    unknown = _ctc(lambda: torch.randint(5, 30, (4,)))
    assert _log_alpha(unknown) == [4 * 50 * (2 * 30 + 1) * 4]
    r = record(unknown, device_type="cpu")
    assert any("worst case" in n and "_ctc_loss" in n for n in r.notes), r.notes


def test_a_dropout_that_does_nothing_returns_its_input():
    def run():
        x = torch.randn(256, 1024)
        with torch.inference_mode():  # the recorder sees aten.dropout here, as on CUDA
            a = torch.nn.functional.dropout(x, 0.1, training=False)
            b = torch.nn.functional.dropout(x, 0.0, training=True)
        return a, b

    allocs = [e for e in record(run, device_type="cpu").events if isinstance(e, Alloc)]
    assert [e.op for e in allocs] == ["aten.randn.default"]


def test_composite_ops_under_inference_mode_record_their_parts():
    """Under inference mode aten.layer_norm reaches the recorder whole: its C++ kernel's
    parts are recorded, native_layer_norm's mean and rstd with them."""
    norm = torch.nn.LayerNorm(256)

    def run():
        x = torch.randn(8, 10, 256)
        with torch.inference_mode():
            norm(x)

    allocs = [e for e in record(run, device_type="cpu").events if isinstance(e, Alloc)]
    parts = [e.nbytes for e in allocs if e.op == "aten.native_layer_norm.default"]
    assert parts == [8 * 10 * 256 * 4, 8 * 10 * 4, 8 * 10 * 4]


def test_fused_attention_takes_its_projection_and_attention_output_inside():
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True).eval()

    def run(need_weights=False):
        q = torch.randn(4, 10, 64)
        with torch.inference_mode():
            mha(q, q, q, need_weights=need_weights)

    r = record(run, device_type="cpu")
    inside = [e for e in r.events if isinstance(e, Alloc) and "multi_head" in e.op]
    unit = 4 * 10 * 64 * 4
    assert [e.nbytes for e in inside] == [unit, 3 * unit, unit]  # the output, then both
    freed = {e.key for e in r.events if type(e).__name__ == "Free"}
    assert {inside[1].key, inside[2].key} <= freed
    unfused = record(lambda: run(need_weights=True), device_type="cpu")
    assert any("unfused" in u for u in unfused.unseen), unfused.unseen


def test_an_op_with_its_own_kernel_is_not_split_even_where_it_has_a_composite_one(
    monkeypatch,
):
    """``silu_backward`` has a composite kernel beside the device's own, which the real
    run takes: a training step's events are the same as with no op split at all."""
    from jupyter_gpumem.collectors.dry_run import composite

    def step():
        m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.SiLU(), torch.nn.Flatten())
        m(torch.randn(4, 3, 16, 16)).sum().backward()

    def sizes(r):
        return [(e.op, e.nbytes) for e in r.events if isinstance(e, Alloc)]

    split = sizes(record(step, device_type="cpu"))
    monkeypatch.setattr(composite.Composites, "__call__", lambda self, func: False)
    assert split == sizes(record(step, device_type="cpu"))


def test_memory_efficient_attention_s_backward_workspace_is_noted_without_a_lower_bound():
    """Its workspace is not sized (and not always there: GPT-2's step replays exactly):
    a note says so, and the figures are not marked a lower bound."""

    def run():
        q, out = torch.randn(2, 4, 16, 64), torch.randn(2, 4, 16, 64)
        lse, seed, offset = torch.randn(2, 4, 32), torch.tensor(0), torch.tensor(0)
        torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            out, q, q, q, None, out, lse, seed, offset, 0.0, [True, True, True, False]
        )

    r = record(run, device_type="cpu")
    assert r.error is None
    expected = (
        "not sized: memory-efficient attention's backward workspace, which its kernel takes "
        "and gives back (up to 132 MiB a layer measured on an H200): the reserved peak may be "
        "higher (aten._scaled_dot_product_efficient_attention_backward.default)"
    )
    assert [n for n in r.notes if n.startswith("not sized:")] == [expected]
    assert not r.unseen


def _torch_like(initialized: bool, current: int, contexts: set[int]):
    from types import SimpleNamespace

    cuda = SimpleNamespace(is_initialized=lambda: initialized, current_device=lambda: current)
    c = SimpleNamespace(_cuda_hasPrimaryContext=lambda d: d in contexts)
    return SimpleNamespace(cuda=cuda, _C=c)


def test_cudnn_is_asked_only_where_a_context_is_there_on_the_current_device():
    """No context on the device: not asked (a dry run makes none), and why; another device
    than the current one: not asked either. Nothing here loads cuDNN."""
    ask, why = cudnn_module.sizer(_torch_like(False, 0, set()), 0)
    assert ask is None and "no CUDA context" in why
    ask, why = cudnn_module.sizer(_torch_like(True, 0, {0, 1}), 1)
    assert ask is None and "current device only (device 0)" in why


def test_planning_for_another_card_says_cudnn_may_pick_other_plans_there(monkeypatch):
    from jupyter_gpumem.collectors import dry_run as dry_run_package
    from jupyter_gpumem.core import dry_run as core

    assert core._same_card("h200", (500 << 20, "NVIDIA H200"), "cuda")
    assert not core._same_card("t4", (500 << 20, "NVIDIA H200"), "cuda")
    monkeypatch.setattr(dry_run_package, "capability", lambda t, i: (9, 0))
    assert core._same_card("h100-80gb", None, "cuda")  # no measurement: by capability
    assert not core._same_card("a100-40gb", None, "cuda")
