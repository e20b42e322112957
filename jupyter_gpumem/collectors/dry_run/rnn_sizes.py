"""The sizes of cuDNN's RNNs for the dry run's fake kernels (``collectors/dry_run/rnn.py``):
cuDNN's weight buffer as PyTorch lays it out; what only cuDNN knows (the reserve space, the
workspace, the dropout state), measured on an H200 (cuDNN 9.19, torch 2.11) where the
measurement settles it and estimated where it does not, each with its reason; and the
allocations of one forward or backward call in RNN.cpp's order (:class:`ForwardCall`,
:class:`BackwardCall`). ``benchmarks/probes/probe_fake_kernels_gpu.py calibrate`` measures
them on a GPU (``benchmarks/results/h200-dry-run-rnn-calibrate.jsonl``: ten calls of nine
LSTM shapes; its GRU and RNN calls failed in the probe, so those modes are by analogy).

Plain arithmetic on shapes: no torch (the tensors the ``of`` constructors read are only
asked their sizes)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from ...units import KiB, MiB

# cuDNN's RNN modes (cudnnRNNMode_t), as torch.backends.cudnn.rnn.get_cudnn_mode gives them
RNN_RELU, RNN_TANH, LSTM, GRU = 0, 1, 2, 3
MODES = {"RNN_RELU": RNN_RELU, "RNN_TANH": RNN_TANH, "LSTM": LSTM, "GRU": GRU}
# weight matrices (gates) per direction and layer
GATES = {RNN_RELU: 1, RNN_TANH: 1, LSTM: 4, GRU: 3}

# -- what only cuDNN knows -----------------------------------------------------------------

# Reserve space for training, in hidden-wide rows per direction and layer and per input
# row (time step x batch), plus each layer's output but the last (the next layer's input;
# the last one's is the op's output). Measured on an H200, cuDNN 9.19, torch 2.11: each
# LSTM shape of the calibration without a projection (1 to 4 layers, hidden 128 to 1024,
# bidirectional, float16, 25,000 rows) reserved exactly 5 blocks per layer + the outputs
# between layers, plus RESERVE_EXTRA; pytorch/pytorch#2895 (cuDNN 6/7, a P100) gave the
# same 5 for an LSTM (its 4 gates and the cell) and 6 for a GRU. The RNN's 1 block is by
# analogy, not measured.
RESERVE_BLOCKS = {RNN_RELU: 1, RNN_TANH: 1, LSTM: 5, GRU: 6}
# bytes cuDNN adds to every reserve space (measured on an H200, cuDNN 9.19, torch 2.11:
# all nine LSTM shapes)
RESERVE_EXTRA = 256
# With a projection (proj_size), per layer and direction: RESERVE_BLOCKS + 1 hidden-wide
# rows (the unprojected hidden state) and this many projection-wide rows, nothing between
# layers. Measured on an H200, cuDNN 9.19, torch 2.11, for one shape only (2 layers, hidden
# 512, projection 128: 12 hidden-wide and 6 projection-wide rows in all); how the
# projection-wide rows split between layers and outputs is not settled.
RESERVE_PROJ_ROWS = 3
# Dropout between layers (training, p > 0) adds one bit per element of each layer's input
# but the first to the reserve space (the masks the backward reapplies). Measured on an H200,
# cuDNN 9.19, torch 2.11: 2 layers, 4,096 rows, hidden 1024: 524,288 B more than without.

# Workspace, the same for training and inference and asked for again by each of the
# backward's two calls (measured equal in all ten calls): one layer's gates for every input
# row (rows x gates x hidden x directions), WORKSPACE_PER_WEIGHTS times the weight buffer,
# WORKSPACE_PER_DIRECTION, and with dropout between layers one layer's input (rows x
# output x directions). An empirical fit, not cuDNN's rule: within 16 % of every call
# measured on an H200, cuDNN 9.19, torch 2.11 (1.3 % for the lstm case's RNN, 203,948,544 B;
# -16 % hidden 128, -14 % 4 layers, +15 % a projection); the dropout term is that
# measurement's difference with and without dropout (16,777,216 B = one layer's input).
# No simple closed form fits them all exactly. (pytorch/pytorch#2895's cuDNN 7 asked for
# 2.4 % of the reserve, the estimate before: 10 to 46 times too little on cuDNN 9.)
WORKSPACE_PER_WEIGHTS = (3, 2)  # numerator, denominator
WORKSPACE_PER_DIRECTION = 21 * MiB

# cuDNN's dropout state (cudnnDropoutGetStatesSize), which PyTorch keeps per device for the
# process (get_dropout_state in RNN.cpp, whose comment says "slightly over 2MB": older
# cards). Measured on an H200 (132 SMs), cuDNN 9.19, torch 2.11: 6,488,064 B = 48 KiB per
# SM (as if 1,024 curand states of 48 B each); other cards are taken to scale by their SMs
# (not measured), and where the card is not known (CUDA not started) the H200's is used.
DROPOUT_STATE_PER_SM = 48 * KiB
H200_SMS = 132
DROPOUT_STATE_BYTES = H200_SMS * DROPOUT_STATE_PER_SM  # 6,488,064
# get_dropout_state draws the state's seed on the device first: at::empty({}, kLong)
# .random_(gen).item(), one int64 freed before the state is made (RNN.cpp)
SEED_BYTES = 8

ESTIMATES = (
    "cuDNN RNN sizes: the reserve space as measured on an H200 with cuDNN 9.19 (5 hidden-wide "
    "rows per layer for an LSTM and each layer's output but the last, per time step and "
    "batch row; a GRU's 6 and an RNN's 1 are estimates, as is the split of a projection's); "
    "the workspace an estimate within 16 % of those measured (one layer's gates per row, "
    "1.5 times the weights, 21 MiB per direction); the dropout state 48 KiB per SM as on "
    "the H200"
)


def dropout_state_bytes(sms: int | None = None) -> int:
    """cuDNN's dropout state on a card of ``sms`` multiprocessors (None: not known, the
    H200's), see :data:`DROPOUT_STATE_PER_SM`."""
    return (sms if sms and sms > 0 else H200_SMS) * DROPOUT_STATE_PER_SM


@dataclass(frozen=True, slots=True)
class RnnShape:
    """What sizes a cuDNN RNN: ``mode`` (cuDNN's), ``input_size``, ``hidden``, ``proj``
    (0: none), ``layers``, ``dirs`` (1 or 2), ``rows`` (time steps x batch, or the packed
    rows), ``batch`` (the largest), ``elem`` (bytes per element of the input), ``dropout``
    (the probability applied between layers: 0 in inference)."""

    mode: int
    input_size: int
    hidden: int
    proj: int
    layers: int
    dirs: int
    rows: int
    batch: int
    elem: int
    dropout: float = 0.0

    @property
    def out(self) -> int:
        return self.proj or self.hidden

    @property
    def drops(self) -> bool:
        """Whether cuDNN applies dropout (between layers: none with one layer)."""
        return self.dropout > 0 and self.layers > 1


def rnn_shape(
    mode: int,
    input: Any,
    batch_sizes: Sequence[int],
    hidden: int,
    proj: int,
    layers: int,
    bidirectional: bool,
    batch_first: bool,
    dropout: float = 0.0,
) -> RnnShape:
    """The :class:`RnnShape` of a call's ``input`` (packed when ``batch_sizes``);
    ``dropout``: the call's when it trains, else 0."""
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
        dropout=float(dropout),
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
    total elements (``cudnnGetRNNWeightSpaceSize`` / element size: cuDNN packs them without
    padding, as measured on an H200 with cuDNN 9.19 for every shape of the calibration).
    The order of the blocks inside cuDNN's buffer is not PyTorch's to say; only the total
    is used for sizes."""
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
    """The reserve space a training call keeps for the backward: per input row,
    :data:`RESERVE_BLOCKS` hidden-wide rows for each layer and direction and each layer's
    output but the last (with a projection, :data:`RESERVE_PROJ_ROWS`), the dropout masks
    (one bit per element of each layer's input but the first), and
    :data:`RESERVE_EXTRA`."""
    blocks = RESERVE_BLOCKS[s.mode]
    if s.proj:
        per_row = s.layers * ((blocks + 1) * s.hidden + RESERVE_PROJ_ROWS * s.proj)
    else:
        per_row = s.layers * blocks * s.hidden + (s.layers - 1) * s.hidden
    n = s.elem * s.rows * s.dirs * per_row
    if s.drops:
        n += -(-s.rows * s.out * s.dirs * (s.layers - 1) // 8)
    return n + RESERVE_EXTRA


def rnn_workspace_bytes(s: RnnShape) -> int:
    """The workspace cuDNN asks for around one call (an estimate, see
    :data:`WORKSPACE_PER_DIRECTION`): one layer's gates for every input row, 1.5 times the
    weight buffer, 21 MiB per direction and, with dropout, one layer's input. The same for
    training and inference and for each of the backward's two calls (which ask for the
    training size, ``CUDNN_FWD_MODE_TRAINING`` in RNN.cpp)."""
    gates = s.elem * s.rows * s.dirs * GATES[s.mode] * s.hidden
    weights = s.elem * rnn_num_weights(
        s.mode, s.input_size, s.hidden, s.proj, s.layers, s.dirs == 2
    )
    num, den = WORKSPACE_PER_WEIGHTS
    n = gates + -(-weights * num // den) + s.dirs * WORKSPACE_PER_DIRECTION
    if s.drops:
        n += s.elem * s.rows * s.out * s.dirs
    return n


def nbytes(x: Any) -> int:
    return int(x.numel()) * int(x.element_size())


def seq_major(x: Any, batch_first: bool, packed: bool) -> Any:
    """The input (output, a gradient) as RNN.cpp hands it to cuDNN: time steps first."""
    return x.transpose(0, 1) if batch_first and not packed else x


# One allocation or free of a call, in order: ("+", name, bytes) or ("-", name, 0).
Step = tuple[Literal["+", "-"], str, int]


@dataclass(frozen=True, slots=True)
class ForwardCall:
    """``_cudnn_rnn``'s allocations (RNN.cpp), in its order: ``x = input.contiguous()``
    when the seq-major input is not contiguous (``batch_first``), the output, ``hy``, ``cy``
    (none without ``cx``), the weight buffer when the weights are not in one (a copy per
    call), the workspace, the reserve space (training); then the workspace and ``x`` freed
    at the end of the call. The op keeps ``output``, ``hy``, ``cy``, ``reserve`` and
    ``weight_buf`` (:data:`KEPT`)."""

    input_copy: int  # 0: no copy
    output: int
    hy: int
    cy: int
    weight_buf: int  # 0: the flat buffer exists
    workspace: int
    reserve: int  # 0 in inference

    KEPT: ClassVar[tuple[str, ...]] = ("output", "hy", "cy", "reserve", "weight_buf")

    @classmethod
    def of(
        cls,
        s: RnnShape,
        input: Any,
        hx: Any,
        cx: Any,
        train: bool,
        batch_first: bool,
        packed: bool,
        copies_weights: bool,
    ) -> ForwardCall:
        copy = 0 if seq_major(input, batch_first, packed).is_contiguous() else nbytes(input)
        elem = s.elem
        weights = rnn_num_weights(s.mode, s.input_size, s.hidden, s.proj, s.layers, s.dirs == 2)
        return cls(
            input_copy=copy,
            output=elem * s.rows * s.out * s.dirs,
            hy=elem * s.layers * s.dirs * s.batch * s.out,
            cy=nbytes(cx) if cx is not None else 0,
            weight_buf=elem * weights if copies_weights else 0,
            workspace=rnn_workspace_bytes(s),
            reserve=rnn_reserve_bytes(s) if train else 0,
        )

    def steps(self) -> list[Step]:
        out: list[Step] = []
        if self.input_copy:
            out.append(("+", "x", self.input_copy))
        out += [("+", "output", self.output), ("+", "hy", self.hy)]
        if self.cy:
            out.append(("+", "cy", self.cy))
        if self.weight_buf:
            out.append(("+", "weight_buf", self.weight_buf))
        out.append(("+", "workspace", self.workspace))
        if self.reserve:
            out.append(("+", "reserve", self.reserve))
        out.append(("-", "workspace", 0))
        if self.input_copy:
            out.append(("-", "x", 0))
        return out


@dataclass(frozen=True, slots=True)
class BackwardCall:
    """``_cudnn_rnn_backward``'s allocations (RNN.cpp), from the forward's sizes (no
    tensor, so that nothing is kept alive by the hooks that use it), in the order of
    :meth:`steps`. ``weights``: the sizes of the weights' own gradients when they are not
    views into ``dw`` (the module has no biases), else None."""

    output: int  # zeros_like(output) when its gradient is undefined; dy's copy
    zeros_dy_copy: bool  # zeros_like(output) is batch-major: dy copies it (batch_first)
    hx: int
    cx: int  # 0 without cx
    input: int  # dx, and x = input.contiguous() when input_copy
    input_copy: bool
    workspace: int  # each of the two calls
    dw: int  # the weight buffer's size when the weights want gradients, else 0
    weights: tuple[int, ...] | None

    @classmethod
    def of(
        cls,
        s: RnnShape,
        input: Any,
        hx: Any,
        cx: Any,
        output: Any,
        weight_buf: Any,
        params: Sequence[Any],
        batch_first: bool,
        packed: bool,
        weight_stride0: int,
    ) -> BackwardCall:
        """From the forward's input, hidden states, output, weight buffer and parameters."""
        wants = any(getattr(p, "requires_grad", False) for p in params)
        views = weight_stride0 == params_per_layer(s.proj)
        seq, batch = (int(output.shape[1]), int(output.shape[0])) if batch_first else (0, 0)
        return cls(
            output=nbytes(output),
            zeros_dy_copy=batch_first and not packed and seq > 1 and batch > 1,
            hx=nbytes(hx),
            cx=nbytes(cx) if cx is not None else 0,
            input=nbytes(input),
            input_copy=not seq_major(input, batch_first, packed).is_contiguous(),
            workspace=rnn_workspace_bytes(s),
            dw=nbytes(weight_buf) if wants else 0,
            weights=None if views else tuple(nbytes(p) for p in params),
        )

    def kept(self) -> tuple[str, ...]:
        """The names of :meth:`steps` that the op returns."""
        grads: tuple[str, ...] = ()
        if self.dw:
            grads = ("dw",) if self.weights is None else self.grad_names()
        return ("dx", "dhx", *(("dcx",) if self.cx else ()), *grads)

    def grad_names(self) -> tuple[str, ...]:
        return tuple(f"grad{i}" for i in range(len(self.weights or ())))

    def steps(
        self,
        undefined: Sequence[bool],
        copies: Sequence[bool] = (False, False, False),
    ) -> list[Step]:
        """The call's allocations and frees, as RNN.cpp makes them. ``undefined``: whether
        the gradients of ``output``, ``hy`` and ``cy`` are undefined (zeros are made for
        them); ``copies``: whether the defined ones are copied by ``.contiguous()``
        (``output``'s transposed seq-major for ``batch_first``).

        ``_cudnn_rnn_backward``: the zeros; ``_cudnn_rnn_backward_input``: ``x``, ``dy``,
        ``dx``, ``dhy`` and ``dcy`` copies, ``dhx``, ``dcx``, the workspace, then the
        workspace, the copies, ``dy`` and ``x`` freed at its end (C++ frees locals in
        reverse order); ``_cudnn_rnn_backward_weight`` (weights wanting gradients): ``x``,
        ``dw`` (zeros of the weight buffer's size), the workspace, the separate gradients
        (a module without biases), then the workspace, ``dw`` when not returned, and ``x``
        freed; last, the zeros."""
        u_out, u_hy, u_cy = [*undefined, True, True, True][:3]
        c_out, c_hy, c_cy = [*copies, False, False, False][:3]
        out: list[Step] = []
        zeros: list[str] = []
        if u_out:
            zeros.append("zeros_output")
            out.append(("+", "zeros_output", self.output))
        if u_hy:
            zeros.append("zeros_hy")
            out.append(("+", "zeros_hy", self.hx))
        if self.cx and u_cy:
            zeros.append("zeros_cy")
            out.append(("+", "zeros_cy", self.cx))
        if self.input_copy:
            out.append(("+", "x", self.input))
        dy = self.zeros_dy_copy if u_out else c_out
        if dy:
            out.append(("+", "dy", self.output))
        out.append(("+", "dx", self.input))
        dhy = c_hy and not u_hy
        dcy = bool(self.cx) and c_cy and not u_cy
        if dhy:
            out.append(("+", "dhy", self.hx))
        if dcy:
            out.append(("+", "dcy", self.cx))
        out.append(("+", "dhx", self.hx))
        if self.cx:
            out.append(("+", "dcx", self.cx))
        out += [("+", "workspace", self.workspace), ("-", "workspace", 0)]
        for name, made in (("dcy", dcy), ("dhy", dhy), ("dy", dy), ("x", self.input_copy)):
            if made:
                out.append(("-", name, 0))
        if self.dw:
            if self.input_copy:
                out.append(("+", "x", self.input))
            out += [("+", "dw", self.dw), ("+", "workspace", self.workspace)]
            if self.weights is not None:
                names = self.grad_names()
                out += [("+", n, b) for n, b in zip(names, self.weights, strict=True)]
            out.append(("-", "workspace", 0))
            if self.weights is not None:
                out.append(("-", "dw", 0))
            if self.input_copy:
                out.append(("-", "x", 0))
        out += [("-", name, 0) for name in reversed(zeros)]
        return out


def peak_of(steps: Sequence[Step]) -> int:
    """The most bytes the steps hold at once (the call's own peak, from zero)."""
    held: dict[str, int] = {}
    now = peak = 0
    for sign, name, n in steps:
        if sign == "+":
            held[name] = n
            now += n
            peak = max(peak, now)
        else:
            now -= held.pop(name)
    return peak
