"""Which cuDNN convolutions an op runs, as plain records (:class:`ConvCall`), for the sizes of
their workspaces (``collectors/dry_run/cudnn.py``).

PyTorch's ``convolution`` and ``convolution_backward`` pick a backend
(``_select_conv_backend`` in aten/src/ATen/native/Convolution.cpp; asked here through
``torch._C._select_conv_backend`` on the fake tensors, which reads only their shapes,
dtypes and layouts). For cuDNN, each call runs one to two cuDNN operations
(aten/src/ATen/native/cudnn/ConvShared.cpp and Conv_v8.cpp): a forward, or in backward the
data gradient then the filter gradient, each on tensors made contiguous in the layout
``cudnn_conv_suggest_memory_format`` picks (NHWC when the input or weight is channels
last), with 1-d convolutions seen as 2-d of height 1. Each takes a workspace of the size of
the plan cuDNN's heuristics rank first from PyTorch's caching allocator (``run_conv_plan``)
and gives it back when the operation ends. The records carry what the cuDNN descriptors
need: dims and strides (with ``fixSizeOneDimStride``'s strides for dimensions of size 1),
the data type, the pointer's alignment, the convolution's parameters. No torch import at
module level: the caller's torch is passed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .conv_call import DATA_TYPES, ConvCall, ConvOp, TensorDesc


def _expand(values: Sequence[int], n: int) -> tuple[int, ...]:
    values = tuple(int(v) for v in values)
    return values * n if len(values) == 1 else values


def _contiguous_strides(dims: Sequence[int], channels_last: bool) -> tuple[int, ...]:
    order = list(range(len(dims) - 1, -1, -1))  # innermost first
    if channels_last:  # N, spatial..., C
        order = [1, *range(len(dims) - 1, 1, -1), 0]
    strides = [0] * len(dims)
    z = 1
    for d in order:
        strides[d] = z
        z *= max(int(dims[d]), 1)
    return tuple(strides)


def _fix_size_one(
    dims: Sequence[int], strides: Sequence[int], channels_last: bool
) -> tuple[int, ...]:
    """PyTorch's ``fixSizeOneDimStride`` (aten/src/ATen/cudnn/Descriptors.h)."""
    n = len(dims)
    order = ([1] if channels_last else []) + list(range(n - 1, 1, -1))
    order += ([] if channels_last else [1]) + [0]
    out, z = list(strides), 1
    for d in order:
        if dims[d] == 1:
            out[d] = z
        else:
            z *= dims[d]
    return tuple(out)


def _alignment(x: Any) -> int:
    """``getAlignment``: the pointer's alignment, up to 32 bytes; the allocator's blocks
    start at multiples of 512 bytes, so only the storage offset decides."""
    offset = int(x.storage_offset()) * x.element_size()
    alignment = 1
    while alignment < 32 and offset % (alignment * 2) == 0:
        alignment *= 2
    return alignment


def _desc(source: Any, dims: Sequence[int], channels_last: bool) -> TensorDesc:
    """A tensor made contiguous in the layout: ``source`` (the tensor it comes from, when
    it is one) decides the alignment; a new tensor's is 32."""
    dims = tuple(int(d) for d in dims)
    strides = _contiguous_strides(dims, channels_last)
    alignment = _alignment(source) if source is not None else 32
    return TensorDesc(dims, _fix_size_one(dims, strides, channels_last), alignment)


def _channels_last(t: Any, x: Any, w: Any) -> bool:
    """``cudnn_conv_suggest_memory_format``: NHWC (or NDHWC) when the input or the weight
    is channels last, never for float64."""
    if str(x.dtype) == "torch.float64" or str(w.dtype) == "torch.float64":
        return False
    from torch._prims_common import suggest_memory_format

    if w.dim() == 4:
        fmt = t.channels_last
    elif w.dim() == 5:
        fmt = t.channels_last_3d
    else:
        return False
    return suggest_memory_format(x) == fmt or suggest_memory_format(w) == fmt


def backend(t: Any, args: Sequence[Any]) -> str | None:
    """The backend PyTorch picks for a convolution with these arguments (input, weight,
    bias, stride, padding, dilation, transposed, output_padding, groups), by its own
    ``_select_conv_backend``; None when torch cannot say."""
    x, w, bias, stride, padding, dilation, transposed, output_padding, groups = args[:9]
    try:
        chosen = t._C._select_conv_backend(
            x, w, bias, stride, padding, dilation, transposed, output_padding, groups, None
        )
    except Exception:
        return None
    return str(chosen).rsplit(".", 1)[-1]


def conv_calls(
    t: Any, name: str, args: Sequence[Any], out: Any, switches: tuple[bool, bool]
) -> list[ConvCall] | None:
    """The cuDNN operations one ``convolution`` or ``convolution_backward`` call runs, in
    order ([] when its backend is not cuDNN; None when that cannot be told).
    ``switches``: ``torch.backends.cudnn``'s (deterministic, allow_tf32)."""
    if name == "convolution":  # (input, weight, bias, stride, padding, dilation, ...)
        x, w, dy, y = args[0], args[1], None, out
        params = tuple(args[2:9])
        mask: Sequence[bool] = (True, True, True)
    else:  # (grad_output, input, weight, bias_sizes, stride, ..., groups, output_mask)
        dy, x, w, y = args[0], args[1], args[2], args[0]
        params = (None, *args[4:10])
        mask = args[10] if len(args) > 10 else (True, True, True)
    which = backend(t, (x, w, *params))
    data_type = DATA_TYPES.get(str(x.dtype))
    if which is None or data_type is None:
        return None
    if which not in ("Cudnn", "CudnnTranspose"):
        return []
    # groups are implied by the channels of x and w
    k = x.dim() - 2
    stride, padding, dilation = (_expand(v, k) for v in params[1:4])
    last = _channels_last(t, x, w)
    xs, ws, ys = tuple(x.shape), tuple(w.shape), tuple(y.shape)
    if k == 1:  # seen as 2-d, of height 1 (view4d)
        xs, ws, ys = (*xs[:2], 1, xs[2]), (*ws[:2], 1, ws[2]), (*ys[:2], 1, ys[2])
        stride, padding, dilation = (1, *stride), (0, *padding), (1, *dilation)
        last = False
    common: dict[str, Any] = {
        "data_type": data_type,
        "padding": padding,
        "stride": stride,
        "dilation": dilation,
        "device": x.device.index or 0,
        "deterministic": switches[0],
        "allow_tf32": switches[1],
    }

    def call(op: ConvOp, xd: tuple[Any, tuple[int, ...]], yd: tuple[Any, tuple[int, ...]],
             new_w: bool = False) -> ConvCall:  # fmt: skip
        """``xd``, ``yd``: (the tensor it is, None for a new one; its dims)."""
        w_desc = _desc(None if new_w else w, ws, last)
        return ConvCall(op, _desc(xd[0], xd[1], last), w_desc, _desc(yd[0], yd[1], last), **common)

    calls = []
    if which == "Cudnn":
        if name == "convolution":
            return [call("forward", (x, xs), (None, ys))]
        if mask[0]:  # the input's gradient first, then the weight's
            calls.append(call("backward data", (None, xs), (dy, ys)))
        if mask[1]:
            calls.append(call("backward filter", (x, xs), (dy, ys), new_w=True))
        return calls
    # transposed: its forward is cuDNN's backward data, the roles of x and y swapped
    if name == "convolution":
        return [call("backward data", (None, ys), (x, xs))]
    if mask[0]:
        calls.append(call("forward", (dy, ys), (None, xs)))
    if mask[1]:
        calls.append(call("backward filter", (dy, ys), (x, xs), new_w=True))
    return calls


class ConvWorkspaces:
    """The workspaces of a dry run's cuDNN convolutions: each call's is recorded where it
    happens as an allocation of 0 bytes, freed at once (:meth:`see`), and sized when the
    run is over (:meth:`size`), by cuDNN where it can be asked (``cudnn.sizer``): by then a
    training step's autograd has made the context that asking needs. An allocation still of
    0 bytes is not replayed."""

    def __init__(self, t: Any) -> None:
        self.t = t
        self.pending: list[tuple[int, ConvCall]] = []  # (index into the events, call)

    def calls(self, name: str, args: Sequence[Any], out: Any) -> list[ConvCall] | None:
        cudnn = self.t.backends.cudnn
        if not cudnn.enabled:
            return []
        return conv_calls(self.t, name, args, out, (cudnn.deterministic, cudnn.allow_tf32))

    def size(self, events: list[Any]) -> tuple[int, int, str]:
        """Sizes the recorded workspaces in ``events`` (replaced in place); (how many were
        sized, how many were not, where the sizes come from or why not)."""
        from dataclasses import replace

        from .cudnn import sizer

        sized = unsized = 0
        how = ""
        asks: dict[int, Any] = {}
        for index, call in self.pending:
            if call.device not in asks:
                asks[call.device], reason = sizer(self.t, call.device)
                how = how or reason
            ask = asks[call.device]
            nbytes = ask(call) if ask is not None else None
            if nbytes is None:
                unsized += 1
                continue
            sized += 1
            if nbytes:
                events[index] = replace(events[index], nbytes=nbytes)
        return sized, unsized, how
