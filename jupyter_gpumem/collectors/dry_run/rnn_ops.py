"""The fake kernels of cuDNN's RNN ops, ``aten._cudnn_rnn`` and ``_cudnn_rnn_backward``:
the real op's outputs (shapes, dtypes, strides; the weight buffer when ``weight_buf`` is
undefined; the reserve space; the weights' gradients as views into one buffer when the
module has biases), taking the tensors ``rnn.py`` made around the call, in the real call's
order, where it made them. :class:`RnnOpKernels` is the part of ``rnn.RnnKernels`` they are;
the helpers at the end are shared with it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from .rnn_sizes import (
    LSTM,
    Step,
    contiguous_strides,
    params_per_layer,
    rnn_num_weights,
    rnn_reserve_bytes,
    rnn_shape,
    rnn_weight_layout,
    seq_major,
)


class RnnOpKernels:
    """The op kernels of :class:`~jupyter_gpumem.collectors.dry_run.rnn.RnnKernels`."""

    t: Any
    handed: threading.local

    def take(self, which: str) -> dict[str, Any]:
        """The outputs made around the call for its kernel (once), or none."""
        handed = getattr(self.handed, which, None)
        setattr(self.handed, which, None)
        return handed or {}

    # -- the fake kernels --------------------------------------------------------------
    def cudnn_rnn(
        self,
        input: Any,
        weight: Sequence[Any],
        weight_stride0: int,
        weight_buf: Any,
        hx: Any,
        cx: Any,
        mode: int,
        hidden_size: int,
        proj_size: int,
        num_layers: int,
        batch_first: bool,
        dropout: float,
        train: bool,
        bidirectional: bool,
        batch_sizes: Sequence[int],
        dropout_state: Any = None,
    ) -> Any:
        """``_cudnn_rnn``'s outputs as the CUDA kernel makes them (RNN.cpp): ``output``
        seq-major, transposed back for ``batch_first``; ``hy``, ``cy`` (empty without
        ``cx``); the reserve space (training); ``weight_buf`` itself, or a new buffer of
        cuDNN's weight space when it is undefined. Those :meth:`cudnn_impl` made around
        the call are returned as views; the rest (a direct call of the op) are new."""
        t = self.t
        mode, hidden, proj, layers = int(mode), int(hidden_size), int(proj_size), int(num_layers)
        if mode != LSTM and cx is not None:
            raise RuntimeError("rnn: illegal defined cx for non-LSTM RNN")
        if not hx.is_contiguous() or (cx is not None and not cx.is_contiguous()):
            raise RuntimeError("rnn: hx is not contiguous")
        if any(w.dtype != input.dtype for w in weight) or hx.dtype != input.dtype:
            raise RuntimeError("cuDNN RNN: input and parameter tensors are not the same dtype")
        sizes = [int(n) for n in batch_sizes]
        bidir, first = bool(bidirectional), bool(batch_first)
        train = bool(train)
        s = rnn_shape(
            mode, input, sizes, hidden, proj, layers, bidir, first, float(dropout) if train else 0.0
        )
        dirs = s.dirs
        handed = self.take("forward")
        if sizes:
            seq_shape: tuple[int, ...] = (s.rows, s.out * dirs)
        else:
            seq = int(input.shape[1] if batch_first else input.shape[0])
            seq_shape = (seq, s.batch, s.out * dirs)
        output = output_of(handed, "output", seq_shape, input.dtype)
        if output is None:
            output = input.new_empty(seq_shape)
        if batch_first and not sizes:
            output = output.transpose(0, 1)
        hy_shape = (layers * dirs, s.batch, s.out)
        hy = output_of(handed, "hy", hy_shape, hx.dtype)
        if hy is None:
            hy = hx.new_empty(hy_shape)
        if cx is not None:
            if tuple(cx.shape) != (layers * dirs, s.batch, hidden):
                raise RuntimeError(
                    f"Expected cell size {[layers * dirs, s.batch, hidden]}, got {list(cx.shape)}"
                )
            cy = output_of(handed, "cy", tuple(cx.shape), cx.dtype)
            if cy is None:
                cy = cx.new_empty((layers * dirs, s.batch, hidden))
        else:
            cy = hx.new_empty((0,))
        n = rnn_reserve_bytes(s) if train else 0
        reserve = output_of(handed, "reserve", (n,), t.uint8) if n else None
        if reserve is None:
            reserve = input.new_empty((n,), dtype=t.uint8)
        if weight_buf is None:
            total = rnn_num_weights(mode, s.input_size, hidden, proj, layers, dirs == 2)
            weight_buf = output_of(handed, "weight_buf", (total,), input.dtype)
            if weight_buf is None:
                weight_buf = input.new_empty((total,))
        return output, hy, cy, reserve, weight_buf

    def cudnn_rnn_backward(
        self,
        input: Any,
        weight: Sequence[Any],
        weight_stride0: int,
        weight_buf: Any,
        hx: Any,
        cx: Any,
        output: Any,
        grad_output: Any,
        grad_hy: Any,
        grad_cy: Any,
        mode: int,
        hidden_size: int,
        proj_size: int,
        num_layers: int,
        batch_first: bool,
        dropout: float,
        train: bool,
        bidirectional: bool,
        batch_sizes: Sequence[int],
        dropout_state: Any,
        reserve: Any,
        output_mask: Sequence[bool],
    ) -> Any:
        """``_cudnn_rnn_backward``'s outputs (RNN.cpp): ``dx`` seq-major (transposed back
        for ``batch_first``), ``dhx``, ``dcx`` (None without ``cx``), and, when the weights
        want gradients, views into one ``dw`` buffer of ``weight_buf``'s size in the weights'
        shapes when ``weight_stride0`` is ``get_parameters``' (a module with biases), else
        one new tensor per weight (``dw`` freed inside the call). Those the node's hook
        made before the call are returned as views; the rest are new."""
        handed = self.take("backward")
        if not train:
            raise RuntimeError("cudnn RNN backward can only be called in training mode")
        if grad_output is None and grad_hy is None and grad_cy is None:
            return None, None, None, [None] * len(weight)
        mode, hidden, proj, layers = int(mode), int(hidden_size), int(proj_size), int(num_layers)
        sizes = [int(n) for n in batch_sizes]
        bidir, first = bool(bidirectional), bool(batch_first)
        s = rnn_shape(mode, input, sizes, hidden, proj, layers, bidir, first)
        seq = tuple(int(n) for n in seq_major(input, first, bool(sizes)).shape)
        dx = output_of(handed, "dx", seq, input.dtype)
        if dx is None:
            dx = input.new_empty(seq)
        if batch_first and not sizes:
            dx = dx.transpose(0, 1)
        hx_shape = (layers * s.dirs, s.batch, s.out)
        dhx = output_of(handed, "dhx", hx_shape, hx.dtype)
        if dhx is None:
            dhx = hx.new_empty(hx_shape)
        dcx = None
        if cx is not None:
            cx_shape = (layers * s.dirs, s.batch, hidden)
            dcx = output_of(handed, "dcx", cx_shape, cx.dtype)
            if dcx is None:
                dcx = cx.new_empty(cx_shape)
        grads: list[Any] = []
        if output_mask[3]:
            if int(weight_stride0) == params_per_layer(proj):
                buf_shape = tuple(int(n) for n in weight_buf.shape)
                dw = output_of(handed, "dw", buf_shape, weight_buf.dtype)
                if dw is None:
                    dw = weight_buf.new_empty(buf_shape)
                layout, _ = rnn_weight_layout(mode, s.input_size, hidden, proj, layers, s.dirs == 2)
                for w, (_, shape, offset) in zip(weight, layout, strict=True):
                    view = dw.as_strided(shape, contiguous_strides(shape), offset)
                    grads.append(view.view(tuple(w.shape)))
                del dw
            else:
                for i, w in enumerate(weight):
                    g = output_of(handed, f"grad{i}", tuple(w.shape), w.dtype)
                    grads.append(g if g is not None else w.new_empty(tuple(w.shape)))
        return dx, dhx, dcx, grads


def run_steps(steps: Sequence[Step], make: Callable[[str, int], Any]) -> dict[str, Any]:
    """A call's allocations and frees in order (``make(name, bytes)`` makes each); what
    is held at the end, by name."""
    held: dict[str, Any] = {}
    for sign, name, n in steps:
        if sign == "+":
            held[name] = make(name, n)
        else:
            del held[name]
    return held


def output_of(handed: dict[str, Any], name: str, shape: tuple[int, ...], dtype: Any) -> Any:
    """The output ``name`` made around the call, as a new view (the kernel's own output),
    when it has the shape and dtype the kernel makes; else None (the kernel makes it)."""
    x = handed.get(name)
    if x is None or tuple(x.shape) != tuple(shape) or x.dtype != dtype:
        return None
    return x.view(tuple(shape))


def storage_key(x: Any) -> int:
    """Which storage a tensor's data lies in (its StorageImpl)."""
    return int(x.untyped_storage()._cdata)


def flat_buffer(params: list[Any], total: int) -> Any:
    """``try_get_weight_buf``: the weights' shared buffer as one flat view, when every
    weight lies in one storage of at least cuDNN's size and the last is contiguous (the
    real test compares each weight's address with cuDNN's layout; weights that share one
    storage got there through flatten_parameters)."""
    first = params[0]
    try:
        key = storage_key(first)
        if any(storage_key(p) != key or p.dtype != first.dtype for p in params):
            return None
        if first.untyped_storage().nbytes() < total * first.element_size():
            return None
    except Exception:
        return None
    if not params[-1].is_contiguous():
        return None
    return first.detach().as_strided((total,), (1,), 0)
