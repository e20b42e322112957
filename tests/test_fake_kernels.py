"""The fake kernels of collectors/dry_run/kernels.py and collectors/dry_run/rnn.py: cuDNN's RNN
ops and ``_grouped_mm`` under the fake mode, with the real CUDA op's outputs and
allocations.

A CPU build of torch makes no fake CUDA tensor that reaches cuDNN's path, so most tests run
the kernels on fake CPU tensors with ``cudnn=True`` (the cuDNN path taken for the CPU's
storages, as a dry run with ``device_type="cpu"`` counts them). The last tests run only on a
CUDA build (a GPU need not be visible): a forward of an LSTM on fake CUDA tensors takes
cuDNN's path without starting CUDA."""

from __future__ import annotations

import contextlib
import itertools
import math
import traceback
import types

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from jupyter_gpumem.collectors.dry_run import run as fake_run  # noqa: E402
from jupyter_gpumem.collectors.dry_run.events import Alloc, Free  # noqa: E402
from jupyter_gpumem.collectors.dry_run.kernels import fake_kernels, grouped_mm_out  # noqa: E402
from jupyter_gpumem.collectors.dry_run.rnn import cudnn_accepts  # noqa: E402
from jupyter_gpumem.collectors.dry_run.rnn_sizes import (  # noqa: E402
    DROPOUT_STATE_BYTES,
    GRU,
    LSTM,
    RESERVE_EXTRA,
    RNN_TANH,
    SEED_BYTES,
    BackwardCall,
    ForwardCall,
    RnnShape,
    dropout_state_bytes,
    peak_of,
    rnn_num_weights,
    rnn_reserve_bytes,
    rnn_weight_layout,
    rnn_workspace_bytes,
)
from jupyter_gpumem.collectors.dry_run.workspaces import (  # noqa: E402
    Workspaces,
    grouped_mm_uses_cublas,
    op_kind,
)
from jupyter_gpumem.collectors.torch_build import gpu_build  # noqa: E402

F32 = 4


@contextlib.contextmanager
def fake(device: str = "cpu", **kw):
    """A fake mode with the kernels installed (cuDNN's path forced on a CPU build)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    kw.setdefault("cudnn", True if device == "cpu" else None)
    with fake_kernels(torch, device, **kw) as k, FakeTensorMode(allow_non_fake_inputs=True):
        yield k


def nbytes(x) -> int:
    return x.untyped_storage().nbytes()


def lstm_weights(i: int, h: int, layers: int, *, bias: bool = True, dirs: int = 1):
    ws = []
    for layer in range(layers):
        in_size = i if layer == 0 else h * dirs
        for _ in range(dirs):
            ws += [torch.empty(4 * h, in_size), torch.empty(4 * h, h)]
            if bias:
                ws += [torch.empty(4 * h), torch.empty(4 * h)]
    return ws


# -- sizes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "mode", "kw"),
    [
        (nn.LSTM, LSTM, {}),
        (nn.LSTM, LSTM, {"num_layers": 3, "bidirectional": True}),
        (nn.LSTM, LSTM, {"num_layers": 2, "proj_size": 5}),
        (nn.LSTM, LSTM, {"num_layers": 2, "proj_size": 5, "bidirectional": True}),
        (nn.GRU, GRU, {"num_layers": 2}),
        (nn.RNN, RNN_TANH, {"num_layers": 2, "bidirectional": True}),
    ],
)
def test_the_weight_buffer_holds_the_module_s_parameters(cls, mode, kw):
    """cuDNN's weight space (double bias) holds exactly a module's parameters when it has
    biases, in the shapes and order of ``_flat_weights``; without biases, their slots too."""
    m = cls(7, 11, **kw)
    proj = kw.get("proj_size", 0)
    layout, total = rnn_weight_layout(
        mode, 7, 11, proj, kw.get("num_layers", 1), kw.get("bidirectional", False)
    )
    assert total == sum(p.numel() for p in m._flat_weights)
    assert [name for name, _, _ in layout] == m._flat_weights_names
    assert [shape for _, shape, _ in layout] == [tuple(p.shape) for p in m._flat_weights]
    offsets = [off for _, _, off in layout]
    assert offsets == sorted(offsets) and offsets[0] == 0
    nobias = cls(7, 11, bias=False, **kw)
    slots = sum(p.numel() for p in m._flat_weights if p.dim() == 1)
    assert total == sum(p.numel() for p in nobias._flat_weights) + slots


# Measured on an H200, cuDNN 9.19, torch 2.11 (benchmarks/results/
# h200-dry-run-rnn-calibrate.jsonl): float32 LSTMs unless said, (input, hidden, layers,
# batch, seq, dirs, proj, elem, dropout, train) -> weight buffer, reserve, workspace.
H200 = [
    ((1024, 1024, 2, 32, 128, 1, 0, 4, 0.2, True), 67_174_400, 185_073_920, 203_948_544),
    ((1024, 1024, 2, 32, 128, 1, 0, 4, 0.0, True), 67_174_400, 184_549_632, 187_171_328),
    ((1024, 1024, 2, 32, 128, 1, 0, 4, 0.0, False), 67_174_400, 0, 187_171_328),
    ((512, 512, 1, 64, 64, 1, 0, 4, 0.0, True), 8_404_992, 41_943_296, 68_551_424),
    ((512, 512, 4, 64, 64, 1, 0, 4, 0.0, True), 33_619_968, 192_938_240, 122_684_160),
    ((256, 256, 2, 16, 200, 2, 0, 4, 0.0, True), 10_518_528, 72_089_856, 93_979_008),
    ((256, 512, 2, 16, 50, 1, 128, 4, 0.0, True), 5_799_936, 22_118_656, 32_522_624),
    ((1024, 1024, 2, 32, 128, 1, 0, 2, 0.0, True), 33_587_200, 92_274_944, 101_974_528),
    ((123, 320, 4, 50, 500, 1, 0, 4, 0.0, True), 12_139_520, 736_000_256, 171_629_664),
    ((128, 128, 1, 32, 64, 1, 0, 4, 0.0, True), 528_384, 5_243_136, 32_113_152),
]


def h200_shape(cfg) -> RnnShape:
    i, h, layers, batch, seq, dirs, proj, elem, p, train = cfg
    return RnnShape(LSTM, i, h, proj, layers, dirs, batch * seq, batch, elem, p if train else 0.0)


@pytest.mark.parametrize(("cfg", "weights", "reserve", "workspace"), H200)
def test_the_sizes_against_their_measurement_on_an_h200(cfg, weights, reserve, workspace):
    """The weight buffer and the reserve space exactly (dropout's masks, a projection and
    float16 included); the workspace, an estimate, within 16 %."""
    s = h200_shape(cfg)
    elements = rnn_num_weights(LSTM, s.input_size, s.hidden, s.proj, s.layers, s.dirs == 2)
    assert elements * s.elem == weights
    assert (rnn_reserve_bytes(s) if cfg[-1] else 0) == reserve
    assert abs(rnn_workspace_bytes(s) / workspace - 1) < 0.16


def test_the_lstm_case_s_workspace_is_close_and_dropout_adds_one_layer_s_input():
    """The calibration's lstm case (2 layers, hidden 1024, 4,096 rows, dropout 0.2): 1.3 %
    over the 203,948,544 B measured; dropout's share is what was measured without it."""
    case, without = h200_shape(H200[0][0]), h200_shape(H200[1][0])
    assert 0 < rnn_workspace_bytes(case) - 203_948_544 < 0.015 * 203_948_544
    assert rnn_workspace_bytes(case) - rnn_workspace_bytes(without) == 203_948_544 - 187_171_328
    assert rnn_reserve_bytes(case) - rnn_reserve_bytes(without) == 185_073_920 - 184_549_632
    # inference asks for the training size (no reserve)
    inference = h200_shape(H200[2][0])
    assert rnn_workspace_bytes(inference) == rnn_workspace_bytes(without)


def test_the_reserve_counts_blocks_directions_projections_and_dropout():
    base = RnnShape(LSTM, 16, 32, 0, 2, 1, 100, 10, F32)
    bi = RnnShape(LSTM, 16, 32, 0, 2, 2, 100, 10, F32)
    proj = RnnShape(LSTM, 16, 32, 8, 2, 1, 100, 10, F32)
    drop = RnnShape(LSTM, 16, 32, 0, 2, 1, 100, 10, F32, 0.5)
    one = RnnShape(LSTM, 16, 32, 0, 1, 1, 100, 10, F32, 0.5)
    assert rnn_reserve_bytes(base) == F32 * 100 * (2 * 5 * 32 + 32) + RESERVE_EXTRA
    assert rnn_reserve_bytes(bi) - RESERVE_EXTRA == 2 * (rnn_reserve_bytes(base) - RESERVE_EXTRA)
    assert rnn_reserve_bytes(proj) == F32 * 100 * 2 * (6 * 32 + 3 * 8) + RESERVE_EXTRA
    assert rnn_reserve_bytes(drop) - rnn_reserve_bytes(base) == 100 * 32 // 8  # one bit each
    assert not one.drops and rnn_reserve_bytes(one) == F32 * 100 * 5 * 32 + RESERVE_EXTRA
    # pytorch/pytorch#2895 (cuDNN 7, a P100): a GRU keeps 6 blocks per layer
    gru = RnnShape(GRU, 123, 320, 0, 4, 1, 25_000, 50, F32)
    assert rnn_reserve_bytes(gru) - RESERVE_EXTRA == 864_000_000


def test_the_dropout_state_scales_with_the_multiprocessors():
    assert DROPOUT_STATE_BYTES == dropout_state_bytes() == dropout_state_bytes(132) == 6_488_064
    assert dropout_state_bytes(108) == 108 * 48 * 1024  # an A100, not measured


# The lstm case's calls on the H200, every allocation (+) and free (-) in order (the
# calibration's "events" without its cudaMallocs).
H200_FORWARD = [16777216, 16777216, 262144, 262144, 203948544, 185073920, -203948544, -16777216]
H200_BACKWARD = [
    262144, 262144, 16777216, 16777216, 16777216, 262144, 262144, 203948544, -203948544,
    -16777216, -16777216, 16777216, 67174400, 203948544, -203948544, -16777216, -262144,
    -262144,
]  # fmt: skip


def signed(steps, workspace: int) -> list[int]:
    """Steps as the calibration's events, the measured workspace for the estimated one."""
    held: dict[str, int] = {}
    out = []
    for sign, name, n in steps:
        if sign == "+":
            held[name] = workspace if name == "workspace" else n
            out.append(held[name])
        else:
            out.append(-held.pop(name))
    return out


def test_the_calls_allocate_in_the_order_measured_on_an_h200():
    """The lstm case (batch_first, dropout 0.2): the forward, and the backward of a
    batch-major gradient of the output with hy's and cy's undefined."""
    B, T, H, L = 32, 128, 1024, 2
    s = h200_shape(H200[0][0])
    with fake():
        x = torch.empty(B, T, H)
        hx, cx = torch.empty(L, B, H), torch.empty(L, B, H)
        fwd = ForwardCall.of(s, x, hx, cx, True, True, False, False)
        assert signed(fwd.steps(), 203_948_544) == H200_FORWARD
        output = torch.empty(T, B, H).transpose(0, 1)
        params = [w.requires_grad_() for w in lstm_weights(H, H, L)]
        buf = torch.empty(rnn_num_weights(LSTM, H, H, 0, L, False))
        back = BackwardCall.of(s, x, hx, cx, output, buf, params, True, False, 4)
        steps = back.steps((False, True, True), (True, False, False))
        assert signed(steps, 203_948_544) == H200_BACKWARD
        assert back.kept() == ("dx", "dhx", "dcx", "dw")

    # the peaks measured inside the calls (from their start; the allocator rounds to 512 B)
    def peak(events: list[int]) -> int:
        rounded = [(1 if n > 0 else -1) * -(-abs(n) // 512) * 512 for n in events]
        return max(itertools.accumulate(rounded))

    assert peak(H200_FORWARD) == 423_101_440 and peak(H200_BACKWARD) == 305_725_952
    assert peak_of(steps) == 305_725_952 + rnn_workspace_bytes(s) - 203_948_544


def test_the_backward_of_a_module_without_biases_copies_out_of_dw():
    """``_cudnn_rnn_backward_weight``: the separate gradients made while the workspace
    lives, then the workspace, dw and x freed; undefined gradients of all three outputs."""
    s = RnnShape(LSTM, 8, 16, 0, 1, 1, 20, 4, F32)
    with fake():
        x, hx, cx = torch.empty(4, 5, 8), torch.empty(1, 4, 16), torch.empty(1, 4, 16)
        params = [w.requires_grad_() for w in lstm_weights(8, 16, 1, bias=False)]
        buf = torch.empty(rnn_num_weights(LSTM, 8, 16, 0, 1, False))
        back = BackwardCall.of(s, x, hx, cx, torch.empty(5, 4, 16), buf, params, False, False, 2)
        names = [(sign, name) for sign, name, _ in back.steps((True, True, True))]
    assert names == [
        ("+", "zeros_output"), ("+", "zeros_hy"), ("+", "zeros_cy"), ("+", "dx"),
        ("+", "dhx"), ("+", "dcx"), ("+", "workspace"), ("-", "workspace"), ("+", "dw"),
        ("+", "workspace"), ("+", "grad0"), ("+", "grad1"), ("-", "workspace"), ("-", "dw"),
        ("-", "zeros_cy"), ("-", "zeros_hy"), ("-", "zeros_output"),
    ]  # fmt: skip
    assert back.kept() == ("dx", "dhx", "dcx", "grad0", "grad1")


@pytest.mark.parametrize(
    ("a", "b", "groups", "itemsize", "size", "stride"),
    [
        ((64, 32), (4, 32, 10), 4, 4, (64, 10), (12, 1)),  # 2d x 3d: fp32 pads to 4
        ((64, 32), (4, 32, 10), 4, 2, (64, 10), (16, 1)),  # bf16 pads to 8
        ((4, 64, 32), (4, 32, 16), None, 4, (4, 64, 16), (1024, 16, 1)),  # 3d x 3d
        ((16, 64), (64, 10), 4, 4, (4, 16, 10), (192, 12, 1)),  # 2d x 2d
        ((4, 16, 64), (64, 10), 4, 4, (16, 10), (12, 1)),  # 3d x 2d
    ],
)
def test_grouped_mm_output_layout(a, b, groups, itemsize, size, stride):
    assert grouped_mm_out(a, b, groups, itemsize, rocm=False) == (size, stride)
    assert grouped_mm_out(a, b, groups, itemsize, rocm=True)[0] == size


# -- _cudnn_rnn ----------------------------------------------------------------------------


def test_cudnn_rnn_outputs_as_the_cuda_kernel_makes_them():
    B, T, IN, H, L = 4, 16, 64, 128, 2
    with fake():
        x = torch.empty(B, T, IN)
        ws = lstm_weights(IN, H, L)
        hx, cx = torch.empty(L, B, H), torch.empty(L, B, H)
        out = torch.ops.aten._cudnn_rnn.default(
            x, ws, 4, None, hx, cx, LSTM, H, 0, L, True, 0.0, True, False, [], None
        )
        output, hy, cy, reserve, buf = out
        # batch_first: a seq-major buffer, transposed back
        assert tuple(output.shape) == (B, T, H) and output.stride() == (H, B * H, 1)
        assert nbytes(output) == B * T * H * F32
        assert tuple(hy.shape) == tuple(cy.shape) == (L, B, H)
        assert nbytes(hy) == nbytes(cy) == L * B * H * F32
        assert reserve.dtype == torch.uint8
        assert nbytes(reserve) == F32 * B * T * (L * 5 * H + (L - 1) * H) + RESERVE_EXTRA
        # weight_buf undefined: a new buffer of cuDNN's weight space
        assert buf.dtype == torch.float32 and nbytes(buf) == F32 * sum(w.numel() for w in ws)
        # given, it is returned itself (no allocation)
        given = torch.empty(sum(w.numel() for w in ws))
        again = torch.ops.aten._cudnn_rnn.default(
            x, ws, 4, given, hx, cx, LSTM, H, 0, L, True, 0.0, True, False, [], None
        )
        assert again[4] is given
        # inference: no reserve; seq-major input: contiguous output
        inf = torch.ops.aten._cudnn_rnn.default(
            x.transpose(0, 1).contiguous(), ws, 4, given, hx, cx, LSTM, H, 0, L, False, 0.0,
            False, False, [], None,
        )  # fmt: skip
        assert nbytes(inf[3]) == 0
        assert tuple(inf[0].shape) == (T, B, H) and inf[0].is_contiguous()


def test_cudnn_rnn_gru_bidirectional_packed_and_projected():
    with fake():
        # GRU, bidirectional, packed (rows = sum of batch sizes), no cx: cy is empty
        IN, H = 8, 16
        ws = []
        for layer in range(2):
            in_size = IN if layer == 0 else 2 * H
            for _ in range(2):
                ws += [torch.empty(3 * H, in_size), torch.empty(3 * H, H)]
                ws += [torch.empty(3 * H), torch.empty(3 * H)]
        data = torch.empty(9, IN)
        hx = torch.empty(4, 4, H)
        out = torch.ops.aten._cudnn_rnn.default(
            data, ws, 4, None, hx, None, GRU, H, 0, 2, False, 0.0, True, True, [4, 3, 2], None
        )
        assert tuple(out[0].shape) == (9, 2 * H)
        assert tuple(out[1].shape) == (4, 4, H) and nbytes(out[2]) == 0
        assert nbytes(out[3]) == F32 * 9 * 2 * (2 * 6 * H + H) + RESERVE_EXTRA
        # LSTM with a projection: hy has proj_size, cy hidden_size
        P = 4
        ws = [torch.empty(4 * H, IN), torch.empty(4 * H, P), torch.empty(4 * H)]
        ws += [torch.empty(4 * H), torch.empty(P, H)]
        x = torch.empty(5, 3, IN)
        out = torch.ops.aten._cudnn_rnn.default(
            x, ws, 5, None, torch.empty(1, 3, P), torch.empty(1, 3, H), LSTM, H, P, 1, False,
            0.0, True, False, [], None,
        )  # fmt: skip
        assert tuple(out[0].shape) == (5, 3, P) and tuple(out[1].shape) == (1, 3, P)
        assert tuple(out[2].shape) == (1, 3, H)
        assert nbytes(out[4]) == F32 * rnn_num_weights(LSTM, IN, H, P, 1, False)


def test_torch_s_own_meta_has_no_reserve_and_no_weight_buffer():
    """What this module replaces: torch's meta kernel gives a reserve of 0 bytes and
    returns the undefined weight_buf; its _grouped_mm refuses float32."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, ws = torch.empty(16, 4, 8), lstm_weights(8, 4, 1)
        hx = torch.empty(1, 4, 4)
        out = torch.ops.aten._cudnn_rnn.default(
            x, ws, 4, None, hx, hx.clone(), LSTM, 4, 0, 1, False, 0.0, True, False, [], None
        )
        assert out[4] is None and out[3].numel() == 0
        with pytest.raises(RuntimeError, match="BF16"):
            torch._grouped_mm(
                torch.empty(8, 16), torch.empty(2, 16, 16), torch.empty(2, dtype=torch.int32)
            )


def test_cudnn_rnn_backward_gives_views_into_one_buffer_with_biases():
    B, T, IN, H, L = 2, 5, 6, 8, 2
    with fake():
        x = torch.empty(B, T, IN)
        hx, cx = torch.empty(L, B, H), torch.empty(L, B, H)
        for bias, stride0 in ((True, 4), (False, 2)):
            ws = lstm_weights(IN, H, L, bias=bias)
            buf = torch.empty(rnn_num_weights(LSTM, IN, H, 0, L, False))
            out = torch.ops.aten._cudnn_rnn.default(
                x, ws, stride0, buf, hx, cx, LSTM, H, 0, L, True, 0.0, True, False, [], None
            )
            dx, dhx, dcx, dw = torch.ops.aten._cudnn_rnn_backward.default(
                x, ws, stride0, buf, hx, cx, out[0], torch.empty_like(out[0]), None, None,
                LSTM, H, 0, L, True, 0.0, True, False, [], None, out[3], [True, True, True, True],
            )  # fmt: skip
            assert tuple(dx.shape) == (B, T, IN) and dx.stride() == (IN, B * IN, 1)
            assert tuple(dhx.shape) == tuple(dcx.shape) == (L, B, H)
            assert [tuple(g.shape) for g in dw] == [tuple(w.shape) for w in ws]
            storages = {g.untyped_storage()._cdata for g in dw}
            if bias:  # views into dw, which has the weight buffer's size
                assert len(storages) == 1 and nbytes(dw[0]) == nbytes(buf)
                assert all(g.is_contiguous() for g in dw)
            else:  # a tensor of its own per weight
                assert len(storages) == len(ws)
                assert [nbytes(g) for g in dw] == [w.numel() * F32 for w in ws]
        # the weights want no gradient: none
        none = torch.ops.aten._cudnn_rnn_backward.default(
            x, ws, 2, buf, hx, cx, out[0], torch.empty_like(out[0]), None, None, LSTM, H, 0, L,
            True, 0.0, True, False, [], None, out[3], [True, True, True, False],
        )  # fmt: skip
        assert none[3] == []


# -- _grouped_mm ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_grouped_mm_takes_what_the_cuda_op_takes(dtype):
    with fake():
        a = torch.empty(64, 32, dtype=dtype)
        b = torch.empty(4, 10, 32, dtype=dtype).transpose(-2, -1)  # column-major, n=10
        offs = torch.empty(4, dtype=torch.int32)
        y = torch._grouped_mm(a, b, offs)
        size, stride = grouped_mm_out((64, 32), (4, 32, 10), 4, a.element_size(), rocm=False)
        assert tuple(y.shape) == size and y.stride() == stride and y.dtype == dtype
        assert nbytes(y) == (63 * stride[0] + 10) * a.element_size()
        y3 = torch._grouped_mm(
            torch.empty(4, 8, 32, dtype=dtype), torch.empty(4, 32, 16, dtype=dtype)
        )
        assert tuple(y3.shape) == (4, 8, 16) and nbytes(y3) == 4 * 8 * 16 * a.element_size()


def test_grouped_mm_refuses_what_the_cuda_op_refuses():
    offs = None
    with fake():
        offs = torch.empty(4, dtype=torch.int32)
        with pytest.raises(RuntimeError, match="Float32, BFloat16 or Float16"):
            torch._grouped_mm(torch.empty(8, 32, dtype=torch.float64), torch.empty(4, 32, 16), offs)
        with pytest.raises(RuntimeError, match="multiple of 16 bytes"):
            torch._grouped_mm(torch.empty(8, 32), torch.empty(4, 32, 10), offs)
        with pytest.raises(RuntimeError, match="offsets"):
            torch._grouped_mm(torch.empty(8, 32), torch.empty(4, 32, 16))
        with pytest.raises(RuntimeError, match="int32"):
            torch._grouped_mm(torch.empty(8, 32), torch.empty(4, 32, 16), offs.long())
        with pytest.raises(RuntimeError, match="must match `mat_a` dtype"):
            torch._grouped_mm(
                torch.empty(8, 32), torch.empty(4, 32, 16), offs, out_dtype=torch.bfloat16
            )


# -- _grouped_mm and cuBLAS's workspace --------------------------------------------------


WS = Workspaces(32 << 20, 1 << 20, "test")


@pytest.mark.parametrize(
    ("dtype", "out_dtype", "cublas"),
    [
        (torch.float32, None, True),  # _grouped_mm_fallback: one mm per group
        (torch.float16, None, True),
        (torch.bfloat16, None, False),  # CUTLASS on compute capability 9.x/10.x
        (torch.bfloat16, torch.bfloat16, False),
    ],
)
def test_grouped_mm_is_cublas_unless_bfloat16(dtype, out_dtype, cublas):
    assert op_kind(torch.ops.aten._grouped_mm.default) == "grouped_mm"
    a, b = torch.empty(8, 16, dtype=dtype), torch.empty(2, 16, 16, dtype=dtype)
    offs = torch.empty(2, dtype=torch.int32)
    kwargs = {} if out_dtype is None else {"out_dtype": out_dtype}
    assert grouped_mm_uses_cublas((a, b, offs), kwargs) is cublas


def _grouped_mm_run(dtype):
    def run():
        a = torch.empty(64, 32, dtype=dtype)
        w = torch.empty(4, 32, 16, dtype=dtype)
        torch._grouped_mm(a, w, torch.tensor([16, 32, 48, 64], dtype=torch.int32))

    return fake_run.record(run, device_type="cpu", workspaces=WS)


def test_a_float32_grouped_mm_takes_cublas_s_workspace():
    """A thread's first cuBLAS call may be a float32 ``_grouped_mm`` (a mixture of experts'
    backward): its workspace is taken there, as on an H200 (torch 2.11)."""
    r = _grouped_mm_run(torch.float32)
    assert r.error is None, r.error
    ws = [a for a in allocs(r) if a.kind == "cublas workspace"]
    assert [(a.nbytes, a.op) for a in ws] == [(WS.cublas, "aten._grouped_mm.default")]


def test_a_bfloat16_grouped_mm_takes_no_cublas_workspace():
    r = _grouped_mm_run(torch.bfloat16)
    assert r.error is None, r.error
    assert not [a for a in allocs(r) if a.kind != "tensor"]


# -- putting back --------------------------------------------------------------------------


def _state():
    from torch._library import simple_registry

    holders = tuple(
        len(simple_registry.singleton.find(q).fake_impl.kernels)
        for q in ("aten::_cudnn_rnn", "aten::_cudnn_rnn_backward", "aten::_grouped_mm")
    )
    return dict(vars(torch._VF)), nn.RNNBase.__dict__["flatten_parameters"], holders


def test_everything_is_put_back_also_after_an_error():
    from torch._subclasses.fake_tensor import FakeTensorMode

    before = _state()
    with pytest.raises(ValueError), fake():
        assert torch._VF.lstm is not before[0].get("lstm", torch._C._VariableFunctions.lstm)
        torch._grouped_mm(
            torch.empty(8, 32), torch.empty(4, 32, 16), torch.empty(4, dtype=torch.int32)
        )
        raise ValueError("the run's own error")
    assert _state() == before
    assert torch._VF.lstm is torch._C._VariableFunctions.lstm
    funcs = {torch.ops.aten._grouped_mm.default, torch.ops.aten._cudnn_rnn.default}
    assert not [k for k in FakeTensorMode.cache if k.key[0] in funcs]


def test_real_tensors_take_torch_s_own_path():
    """Outside a fake mode (another thread's real work) the RNN runs as it does without
    the kernels installed."""
    torch.manual_seed(0)
    m = nn.LSTM(4, 6, batch_first=True)
    x = torch.randn(2, 3, 4)
    expected = m(x)[0]
    with fake_kernels(torch, "cpu", cudnn=True):
        got = m(x)[0]
    assert torch.equal(got, expected)


# -- dry runs ------------------------------------------------------------------------------


def record(run, device: str = "cpu", **kw):
    """fake_run.record, its kernels entered with ``kw`` (on the CPU: as if cuDNN took the
    RNN, which it does only on CUDA)."""
    import functools

    from jupyter_gpumem.collectors.dry_run import kernels as module

    kw.setdefault("cudnn", True if device == "cpu" else None)
    original = module.fake_kernels
    module.fake_kernels = functools.partial(original, **kw)
    try:
        return fake_run.record(run, device_type=device)
    finally:
        module.fake_kernels = original


def allocs(r, op: str | None = None):
    return [e for e in r.events if isinstance(e, Alloc) and (op is None or op in e.op)]


def freed(r) -> set[int]:
    return {e.key for e in r.events if isinstance(e, Free)}


def events(r) -> list[int]:
    """A run's events as sizes: +bytes for an allocation, -bytes for its free."""
    size: dict[int, int] = {}
    out = []
    for e in r.events:
        if isinstance(e, Alloc):
            size[e.key] = e.nbytes
            out.append(e.nbytes)
        elif isinstance(e, Free) and e.key in size:
            out.append(-size[e.key])
    return out


def find(seq: list[int], part: list[int]) -> list[int]:
    """Where ``part`` lies in ``seq``, in a row."""
    return [i for i in range(len(seq) - len(part) + 1) if seq[i : i + len(part)] == part]


def test_a_dry_run_of_an_lstm_training_step():
    """Two steps: each call allocates in RNN.cpp's order at fake_rnn_sizes' sizes, the
    outputs made around the op (none by the op itself, also at the second call, whose
    outputs the fake mode's cache would otherwise make), the dropout state once."""
    B, T, V, E, H, L = 4, 16, 100, 32, 48, 2

    def run():
        emb = nn.Embedding(V, E)
        lstm = nn.LSTM(E, H, num_layers=L, batch_first=True, dropout=0.1)
        head = nn.Linear(H, V)
        opt = torch.optim.AdamW([*emb.parameters(), *lstm.parameters(), *head.parameters()])
        for _ in range(2):
            x = torch.randint(0, V, (B, T))
            out, _ = lstm(emb(x))
            head(out).sum().backward()
            opt.step()

    r = record(run)
    assert r.error is None, r.error
    weights = rnn_num_weights(LSTM, E, H, 0, L, False) * F32
    # flatten_parameters: one zeroed buffer, the weights' own storages freed
    flat = allocs(r, "new_zeros")
    assert [a.nbytes for a in flat] == [weights]
    params = [a for a in allocs(r) if a.key < flat[0].key and a.nbytes in
              {4 * H * E * F32, 4 * H * H * F32, 4 * H * F32}]  # fmt: skip
    assert len(params) == 4 * L and {a.key for a in params} <= freed(r)
    assert not allocs(r, "_cudnn_rnn")  # every allocation of the calls is made around them
    shape = RnnShape(LSTM, E, H, 0, L, 1, B * T, B, F32, 0.1)
    with fake():
        x, h = torch.empty(B, T, E), torch.empty(L, B, H)
        forward = ForwardCall.of(shape, x, h, h, True, True, False, False)
        out = torch.empty(T, B, H).transpose(0, 1)
        ws = [w.requires_grad_() for w in lstm_weights(E, H, L)]
        back = BackwardCall.of(shape, x, h, h, out, torch.empty(weights // F32), ws, True, False, 4)
    seq = events(r)
    fwd = signed(forward.steps(), forward.workspace)
    assert fwd[0] == B * T * E * F32 and fwd[4] == rnn_workspace_bytes(shape)  # x, workspace
    # the seed's int64 and the dropout state, then the first call; the second without them
    first = find(seq, [SEED_BYTES, -SEED_BYTES, DROPOUT_STATE_BYTES, *fwd])
    assert len(first) == 1 and len(find(seq, fwd)) == 2
    # the backward: the output's gradient batch-major (copied), hy's and cy's undefined
    bwd = signed(back.steps((False, True, True), (True, False, False)), back.workspace)
    at = find(seq, bwd)
    assert len(at) == 2
    assert [a.nbytes for a in allocs(r)].count(rnn_reserve_bytes(shape)) == 2
    assert seq.count(DROPOUT_STATE_BYTES) == 1  # kept for the run
    assert -DROPOUT_STATE_BYTES not in seq[: at[-1] + len(bwd)]
    assert any("estimates" in n for n in r.notes)


def test_weights_that_are_not_flattened_are_copied_at_every_call():
    """A module on the CPU under ``cudnn=False`` keeps its weights apart; calling the
    cuDNN path with them (cudnn=True for the call only) makes a buffer per call."""
    IN, H = 8, 16

    def run():
        ws = [w.requires_grad_() for w in lstm_weights(IN, H, 1)]
        x = torch.empty(3, 5, IN)
        h = (torch.zeros(1, 5, H), torch.zeros(1, 5, H))
        for _ in range(2):
            torch._VF.lstm(x, h, ws, True, 1, 0.0, False, False, False)

    r = record(run)
    assert r.error is None, r.error
    buf = F32 * 4 * H * (IN + H + 2)
    seq = events(r)
    # after hy and cy, before the workspace, and kept with the outputs
    shape = RnnShape(LSTM, IN, H, 0, 1, 1, 15, 5, F32)
    cell = 5 * H * F32
    assert len(find(seq, [cell, cell, buf, rnn_workspace_bytes(shape)])) == 2
    assert any("not in one buffer" in n for n in r.notes)


def test_a_module_flattened_before_the_run_uses_its_buffer():
    """A module the kernel already holds, its weights in one buffer (as on a GPU after
    ``.cuda()``; flattened by hand here, on the CPU): no buffer per call, the gradients
    views into one ``dw``, and the real parameters' gradients put back afterwards."""
    m = nn.LSTM(8, 16, num_layers=2)
    layout, total = rnn_weight_layout(LSTM, 8, 16, 0, 2, False)
    buf = torch.zeros(total)
    with torch.no_grad():
        for w, (_, shape, offset) in zip(m._flat_weights, layout, strict=True):
            strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
            view = buf.as_strided(shape, strides, offset)
            view.copy_(w)
            w.set_(view)

    def run():
        m(torch.randn(5, 3, 8))[0].sum().backward()

    r = record(run)
    assert r.error is None, r.error
    # no copy of the weights in the forward; the backward's dw has their size (the
    # module's buffer, held before the run, is no allocation of it)
    assert [a.nbytes for a in allocs(r, "new_empty")].count(total * F32) == 1
    assert not any("not in one buffer" in n for n in r.notes)
    shape = RnnShape(LSTM, 8, 16, 0, 2, 1, 15, 3, F32)
    seq = events(r)
    dw = find(seq, [total * F32, rnn_workspace_bytes(shape)])
    assert len(dw) == 1 and -total * F32 not in seq[: dw[0]]
    assert all(p.grad is None for p in m.parameters())


@pytest.mark.parametrize("cls", [nn.GRU, nn.RNN])
def test_gru_and_rnn_run_through(cls):
    def run():
        m = cls(8, 16, num_layers=2, bidirectional=True)
        m(torch.randn(5, 3, 8))[0].sum().backward()

    r = record(run)
    assert r.error is None, r.error
    mode = GRU if cls is nn.GRU else RNN_TANH
    shape = RnnShape(mode, 8, 16, 0, 2, 2, 15, 3, F32)
    sizes = [a.nbytes for a in allocs(r)]
    assert sizes.count(rnn_reserve_bytes(shape)) == 1
    assert sizes.count(rnn_workspace_bytes(shape)) == 3  # the forward's, the backward's two


def test_a_dry_run_of_a_float32_mixture_of_experts():
    E, M, K, N = 4, 64, 32, 16

    def run():
        router = nn.Linear(K, E)
        w1 = nn.Parameter(torch.randn(E, K, N))
        w2 = nn.Parameter(torch.randn(E, N, K))
        x = torch.randn(M, K, requires_grad=True)
        offs = torch.tensor([16, 32, 48, 64], dtype=torch.int32)
        h = torch._grouped_mm(x, w1, offs).relu()
        y = torch._grouped_mm(h, w2, offs)
        (y * router(x).softmax(-1).sum(-1, keepdim=True)).sum().backward()

    r = record(run)
    assert r.error is None, r.error
    outs = [a.nbytes for a in allocs(r, "_grouped_mm")]
    assert M * N * F32 in outs and M * K * F32 in outs  # the forwards (no padding needed)
    assert E * K * N * F32 in outs  # a weight's gradient: 2d x 2d


def test_an_lstm_on_a_cpu_dry_run_without_cudnn_is_untouched():
    def run():
        nn.LSTM(8, 16)(torch.randn(5, 3, 8))[0].sum().backward()

    r = record(run, cudnn=False)
    assert r.error is None and not allocs(r, "_cudnn_rnn")


# -- a CUDA build (no GPU needed) -------------------------------------------------------


cuda_build = pytest.mark.skipif(not gpu_build(torch), reason="needs a CUDA build of torch")


@cuda_build
def test_an_lstm_forward_on_fake_cuda_takes_cudnn_s_path_without_starting_cuda():
    started = torch.cuda.is_initialized()

    def run():
        lstm = nn.LSTM(32, 48, num_layers=2, batch_first=True).cuda().eval()
        with torch.no_grad():
            lstm(torch.randn(4, 16, 32, device="cuda"))

    r = record(run, device="cuda")
    assert r.error is None, r.error
    assert torch.cuda.is_initialized() == started
    assert [a.nbytes for a in allocs(r, "new_zeros")] == [
        rnn_num_weights(LSTM, 32, 48, 0, 2, False) * F32
    ]
    # x, output, hy, cy, the workspace, in RNN.cpp's order; no reserve in eval
    shape = RnnShape(LSTM, 32, 48, 0, 2, 1, 64, 4, F32)
    x, out, h = 64 * 32 * F32, 64 * 48 * F32, 2 * 4 * 48 * F32
    ws = rnn_workspace_bytes(shape)
    assert len(find(events(r), [x, out, h, h, ws, -ws, -x])) == 1


def test_cudnn_s_test_of_the_weights_does_not_start_cuda(monkeypatch):
    """``torch.backends.cudnn.is_acceptable`` runs ``cudnn._init()``, which asks every
    GPU's compute capability (CUDA starts); :func:`cudnn_accepts` makes its test without."""

    def init():
        raise AssertionError("torch.backends.cudnn._init ran")

    monkeypatch.setattr(torch.backends.cudnn, "_init", init)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    w = types.SimpleNamespace(device=torch.device("cuda"), dtype=torch.float32)
    assert cudnn_accepts(torch, w) is torch.backends.cudnn.enabled
    assert not cudnn_accepts(torch, types.SimpleNamespace(device=w.device, dtype=torch.int64))
    assert not cudnn_accepts(
        torch, types.SimpleNamespace(device=torch.device("cpu"), dtype=w.dtype)
    )


@cuda_build
def test_a_dry_run_of_an_lstm_step_does_not_start_cuda(monkeypatch):
    """Measured on an H200 (torch 2.11): a dry run of an LSTM's training step left
    ``torch.cuda.is_initialized()`` True. ``torch.cuda._lazy_init`` is replaced by one
    that refuses; where no GPU is visible, torch is told one is (the checks that start CUDA
    do so only then) and the run stops at the backward, which needs one."""
    if torch.cuda.is_initialized():
        pytest.skip("CUDA already started in this process")
    gpu = torch.cuda.is_available()
    calls: list[str] = []

    def lazy_init(*args, **kwargs):
        calls.append("".join(traceback.format_stack(limit=12)))
        raise RuntimeError("the dry run started CUDA")

    if not gpu:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "_lazy_init", lazy_init)
    # cudnn._init() asks the devices only the first time: make this the first time
    monkeypatch.setitem(torch.backends.cudnn._init.__globals__, "__cudnn_version", None)

    def run():
        emb = nn.Embedding(100, 32).cuda()
        lstm = nn.LSTM(32, 48, num_layers=2, batch_first=True, dropout=0.2).cuda()
        head = nn.Linear(48, 100).cuda()
        opt = torch.optim.AdamW([*emb.parameters(), *lstm.parameters(), *head.parameters()])
        x = torch.randint(0, 100, (4, 16), device="cuda")
        out, _ = lstm(emb(x))
        head(out).sum().backward()
        opt.step()

    r = record(run, device="cuda")
    assert not calls, calls[0]
    assert not torch.cuda.is_initialized()
    assert any("estimates" in n for n in r.notes)  # the forward took cuDNN's path
    if gpu:
        assert r.error is None, r.error


@cuda_build
def test_grouped_mm_float32_on_fake_cuda():
    with fake("cuda"):
        a = torch.empty(64, 32, device="cuda")
        b = torch.empty(4, 32, 12, device="cuda")
        y = torch._grouped_mm(a, b, torch.empty(4, dtype=torch.int32, device="cuda"))
        assert y.device.type == "cuda" and tuple(y.shape) == (64, 12) and y.stride() == (12, 1)
