"""The sizes of cuDNN's RNNs for the dry run's fake kernels (``collectors/fake_rnn.py``):
cuDNN's weight buffer as PyTorch lays it out, and what only cuDNN knows (the reserve space,
the workspace, the dropout state), each an estimate with its reason; and the scratch the
backward call holds inside it, from the order in which RNN.cpp allocates.
``benchmarks/probes/probe_fake_kernels_gpu.py calibrate`` measures them on a GPU.

Plain arithmetic on shapes: no torch (the tensors :meth:`BackwardScratch.of` reads are
only asked their sizes)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..units import MiB

# cuDNN's RNN modes (cudnnRNNMode_t), as torch.backends.cudnn.rnn.get_cudnn_mode gives them
RNN_RELU, RNN_TANH, LSTM, GRU = 0, 1, 2, 3
MODES = {"RNN_RELU": RNN_RELU, "RNN_TANH": RNN_TANH, "LSTM": LSTM, "GRU": GRU}
# weight matrices (gates) per direction and layer
GATES = {RNN_RELU: 1, RNN_TANH: 1, LSTM: 4, GRU: 3}

# -- estimates of what only cuDNN knows --------------------------------------------------

# Reserve space for training, in hidden-wide rows per direction and layer and per input
# row (time step x batch). One measurement anchors it: pytorch/pytorch#2895 (cuDNN 6/7, a
# P100), a 4-layer unidirectional RNN, hidden 320, input 123 (from its parameter counts,
# 3,038,090 for the LSTM, 2,279,370 for the GRU, 761,930 for the RNN, each with a Linear to
# 10 classes), 25,000 input rows, float32: the LSTM's reserve 736,000,000 B = 23 blocks of
# rows x hidden x 4 B, the GRU's 864,000,000 B = 27 blocks. 23 = 5 x 4 + 3 and 27 = 6 x 4
# + 3: five blocks per layer for the LSTM (its 4 gates and the cell), six for the GRU, and
# one for each layer's output but the last (the next layer's input; the last one's is the
# op's output). The RNN's one block per layer is by analogy, not measured; a projection
# (proj_size) adds the unprojected hidden state, by analogy too.
RESERVE_BLOCKS = {RNN_RELU: 1, RNN_TANH: 1, LSTM: 5, GRU: 6}
# Workspace for training, as a fraction of the reserve space (numerator, denominator): the
# same measurement's workspace was 17,730,560 B for the LSTM and 13,169,920 B for the GRU.
WORKSPACE_PER_RESERVE = {
    RNN_RELU: (17_730_560, 736_000_000),
    RNN_TANH: (17_730_560, 736_000_000),
    LSTM: (17_730_560, 736_000_000),
    GRU: (13_169_920, 864_000_000),
}
# cuDNN's dropout state (cudnnDropoutGetStatesSize), which PyTorch keeps per device for
# the process: "slightly over 2MB" in RNN.cpp's comment (get_dropout_state).
DROPOUT_STATE_BYTES = 2 * MiB
# get_dropout_state draws the state's seed on the device first: at::empty({}, kLong)
# .random_(gen).item(), one int64 freed before the state is made (RNN.cpp)
SEED_BYTES = 8

ESTIMATES = (
    "cuDNN RNN sizes that only cuDNN knows are estimates: the reserve space "
    "(5 hidden-wide rows per layer for an LSTM, 6 for a GRU, 1 for an RNN, plus each "
    "layer's output but the last, per time step and batch row, from pytorch/pytorch#2895's "
    "measurement), the workspace (2.4 % of the reserve for training, 1.5 % for a GRU, from "
    "the same measurement; one layer's gates for inference) and the dropout state (2 MiB)"
)


@dataclass(frozen=True, slots=True)
class RnnShape:
    """What sizes a cuDNN RNN: ``mode`` (cuDNN's), ``input_size``, ``hidden``, ``proj``
    (0: none), ``layers``, ``dirs`` (1 or 2), ``rows`` (time steps x batch, or the packed
    rows), ``batch`` (the largest), ``elem`` (bytes per element of the input)."""

    mode: int
    input_size: int
    hidden: int
    proj: int
    layers: int
    dirs: int
    rows: int
    batch: int
    elem: int

    @property
    def out(self) -> int:
        return self.proj or self.hidden


def rnn_shape(
    mode: int,
    input: Any,
    batch_sizes: Sequence[int],
    hidden: int,
    proj: int,
    layers: int,
    bidirectional: bool,
    batch_first: bool,
) -> RnnShape:
    """The :class:`RnnShape` of a call's ``input`` (packed when ``batch_sizes``)."""
    if batch_sizes:
        rows, batch = int(input.shape[0]), int(batch_sizes[0])
    else:
        seq = int(input.shape[1] if batch_first else input.shape[0])
        batch = int(input.shape[0] if batch_first else input.shape[1])
        rows = seq * batch
    return RnnShape(
        mode=mode,
        input_size=int(input.shape[-1]),
        hidden=hidden,
        proj=proj,
        layers=layers,
        dirs=2 if bidirectional else 1,
        rows=rows,
        batch=batch,
        elem=int(input.element_size()),
    )


def rnn_weight_layout(
    mode: int,
    input_size: int,
    hidden: int,
    proj: int,
    layers: int,
    bidirectional: bool,
) -> tuple[list[tuple[str, tuple[int, ...], int]], int]:
    """cuDNN's weight buffer as PyTorch reads it (``get_parameters`` in RNN.cpp): for each
    layer and direction (pseudo-layer ``layer * dirs + dir``), ``w_ih`` (gates x hidden by
    the layer's input), ``w_hh`` (gates x hidden by the output size), ``b_ih`` and ``b_hh``
    (always: PyTorch's descriptor has cuDNN's double bias) and, with a projection,
    ``w_hr`` (proj by hidden). Returns ``[(name, shape, offset)]`` in that order and the
    total elements (``cudnnGetRNNWeightSpaceSize`` / element size, assuming cuDNN packs
    them without padding). The order of the blocks inside cuDNN's buffer is not PyTorch's
    to say; only the total is used for sizes."""
    gates = GATES[mode] * hidden
    dirs = 2 if bidirectional else 1
    out = proj or hidden
    parts: list[tuple[str, tuple[int, ...], int]] = []
    offset = 0
    for layer in range(layers):
        in_size = input_size if layer == 0 else out * dirs
        for d in range(dirs):
            suffix = f"_l{layer}{'_reverse' if d else ''}"
            shapes: list[tuple[str, tuple[int, ...]]] = [
                ("weight_ih" + suffix, (gates, in_size)),
                ("weight_hh" + suffix, (gates, out)),
                ("bias_ih" + suffix, (gates,)),
                ("bias_hh" + suffix, (gates,)),
            ]
            if proj:
                shapes.append(("weight_hr" + suffix, (proj, hidden)))
            for name, shape in shapes:
                parts.append((name, shape, offset))
                offset += math.prod(shape)
    return parts, offset


def rnn_num_weights(
    mode: int, input_size: int, hidden: int, proj: int, layers: int, bidirectional: bool
) -> int:
    """Elements of cuDNN's weight buffer (see :func:`rnn_weight_layout`)."""
    return rnn_weight_layout(mode, input_size, hidden, proj, layers, bidirectional)[1]


def module_places(
    layout: list[tuple[str, tuple[int, ...], int]], bias: bool
) -> list[tuple[str, tuple[int, ...], int]]:
    """The layout's entries for a module's ``_flat_weights`` (no bias: its weights only)."""
    if bias:
        return layout
    return [p for p in layout if not p[0].startswith("bias_")]


def params_per_layer(proj: int) -> int:
    """``get_parameters``' parameters per layer and direction (its ``weight_stride0``): 4
    (the biases always), 5 with a projection."""
    return 5 if proj else 4


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(strides))


def rnn_reserve_bytes(s: RnnShape) -> int:
    """The reserve space a training call keeps for the backward (an estimate, see
    :data:`RESERVE_BLOCKS`): per input row, ``RESERVE_BLOCKS`` hidden-wide rows for each
    layer and direction (one more with a projection) and each layer's output but the
    last."""
    per_layer = (RESERVE_BLOCKS[s.mode] + (1 if s.proj else 0)) * s.hidden
    between = (s.layers - 1) * s.out
    return s.elem * s.rows * s.dirs * (s.layers * per_layer + between)


def rnn_workspace_bytes(s: RnnShape, train: bool) -> int:
    """The workspace cuDNN asks for around one call (an estimate): for training, a share
    of the reserve space (:data:`WORKSPACE_PER_RESERVE`); the backward's two calls each ask
    for the training size (``CUDNN_FWD_MODE_TRAINING`` in RNN.cpp); for inference, where
    there is no reserve, one layer's gates for every input row."""
    if train:
        num, den = WORKSPACE_PER_RESERVE[s.mode]
        return -(-rnn_reserve_bytes(s) * num // den)
    return s.elem * s.rows * s.dirs * GATES[s.mode] * s.hidden


def nbytes(x: Any) -> int:
    return int(x.numel()) * int(x.element_size())


@dataclass(frozen=True, slots=True)
class BackwardScratch:
    """What the backward's scratch depends on, kept from the forward (sizes only: no
    tensor, so that nothing is kept alive by the hooks that use it)."""

    output_bytes: int  # zeros_like(output) when its gradient is undefined
    hx_bytes: int
    cx_bytes: int  # 0 without cx
    input_copy: int  # x = input.contiguous() (batch_first), in each of the two calls
    grad_out_transposed: bool  # batch_first: dy = grad_output.transpose(0, 1).contiguous()
    workspace: int  # each of the two calls
    outputs: int  # dx, dhx, dcx
    dw: int  # zeros of weight_buf's size
    separate: int  # the weights' own gradients when they are not views into dw (else -1)

    @classmethod
    def of(
        cls,
        s: RnnShape,
        input: Any,
        hx: Any,
        cx: Any,
        out: Any,
        params: Sequence[Any],
        batch_first: bool,
        packed: bool,
        weight_stride0: int,
    ) -> BackwardScratch:
        """From the forward's input, hidden states, outputs (``_cudnn_rnn``'s five) and
        parameters."""
        copy = 0
        if batch_first and not packed and not input.transpose(0, 1).is_contiguous():
            copy = nbytes(input)
        wants = any(getattr(p, "requires_grad", False) for p in params)
        dw = nbytes(out[4]) if wants else 0  # output_mask[3]: the weights' gradients
        views = weight_stride0 == params_per_layer(s.proj)
        separate = -1 if views else sum(nbytes(p) for p in params)
        cx_bytes = nbytes(cx) if cx is not None else 0
        return cls(
            output_bytes=nbytes(out[0]),
            hx_bytes=nbytes(hx),
            cx_bytes=cx_bytes,
            input_copy=copy,
            grad_out_transposed=batch_first and not packed,
            workspace=rnn_workspace_bytes(s, train=True),
            outputs=nbytes(input) + nbytes(hx) + cx_bytes,
            dw=dw,
            separate=separate,
        )

    def scratch(self, grads: Sequence[Any]) -> int:
        """Bytes to hold around the backward call so that its peak is the real one: the
        real call holds ``dx, dhx, dcx`` (O), zeros for undefined gradients (Z) and, in
        turn, ``x`` and ``dy`` copies and a workspace (phase A), ``x``, ``dw`` and a
        workspace (B), then ``dw`` and the separate gradients (C); the recorded call holds
        this scratch, O and its final outputs. ``grads``: the gradients of ``output``,
        ``hy`` and ``cy`` as autograd gives them (None: undefined)."""
        g_out = grads[0] if len(grads) > 0 else None
        g_hy = grads[1] if len(grads) > 1 else None
        g_cy = grads[2] if len(grads) > 2 else None
        zeros = 0
        if g_out is None:
            zeros += self.output_bytes
        if g_hy is None:
            zeros += self.hx_bytes
        if self.cx_bytes and g_cy is None:
            zeros += self.cx_bytes
        if g_out is None:
            dy = self.output_bytes if self.grad_out_transposed else 0
        else:
            t_out = g_out.transpose(0, 1) if self.grad_out_transposed else g_out
            dy = 0 if t_out.is_contiguous() else nbytes(g_out)
        o, x, ws = self.outputs, self.input_copy, self.workspace
        phase_a = o + zeros + x + dy + ws
        phases = [phase_a]
        final = o
        if self.dw:
            phases.append(o + zeros + x + self.dw + ws)
            if self.separate >= 0:
                phases.append(o + zeros + self.dw + self.separate)
                final = o + self.separate
            else:
                final = o + self.dw
        return max(0, max(phases) - final)
