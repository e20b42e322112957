"""cuDNN's RNNs (``nn.LSTM``, ``nn.GRU``, ``nn.RNN`` on CUDA) under the dry run's fake
mode, with the real op's outputs and allocations; ``collectors/dry_run/kernels.py`` installs
them (:func:`install`), the sizes come from ``rnn_sizes``. Without them (the first two
seen with torch 2.11's CUDA build and no GPU; on an H200 the run stopped at the third):

- ``RNNBase.flatten_parameters`` keeps a fake module's weights apart: it compares their
  ``data_ptr()``, which is 0 for every fake tensor. The real module's weights are views
  into one buffer from ``_cudnn_rnn_flatten_weight`` (a zeroed buffer of cuDNN's weight
  space; each weight copied in and rebound to its view, its own storage freed).
- ``torch._VF.lstm`` (``gru``, ``rnn_tanh``, ``rnn_relu``) runs the C++ ``_cudnn_impl``
  (aten/src/ATen/native/cudnn/RNN.cpp), which asks cuDNN for a handle
  (``try_get_weight_buf``: CUDA starts, a context is made) and compares data pointers to
  find the flat buffer; fake weights never match, so ``weight_buf`` is undefined;
- ``aten._cudnn_rnn``'s meta kernel (``torch/_meta_registrations.py``) returns that
  ``weight_buf`` (None) as an output the schema types ``Tensor``. Its reserve space is 0
  bytes (a TODO there) and it has no workspace;
- ``aten._cudnn_rnn_backward`` has no fake kernel: the fake mode runs the real CUDA
  kernel on zero-filled tensors on the GPU (``run_fallback_kernel``).

Here ``flatten_parameters`` of fake weights does what the real one does; the ``_VF``
functions, under a fake mode and for an input cuDNN takes (``torch.cudnn_is_acceptable``),
do ``_cudnn_impl``'s work in Python and call ``aten._cudnn_rnn`` through the dispatcher
(autograd records ``CudnnRnnBackward0`` as for real); the fake kernels give the real op's
outputs: shapes, dtypes, strides (``batch_first``'s output is a transposed seq-major
buffer), the weight buffer when ``weight_buf`` is undefined, the reserve space, and the
weights' gradients as views into one ``dw`` buffer when the module has biases.

Every allocation of a call is made around it, in RNN.cpp's order, at the sizes of
``rnn_sizes`` (:class:`~.fake_rnn_sizes.ForwardCall`,
:class:`~.fake_rnn_sizes.BackwardCall`), so that the allocator's model meets the real
requests: the copy of a ``batch_first`` input, the outputs, the workspace (between ``cy``
and the reserve space, as measured on an H200), the reserve space; in the backward, zeros
for undefined gradients, the copies of ``x`` and ``dy``, ``dx``, ``dhx``, ``dcx``, a
workspace, ``dw`` and a second workspace, each freed where RNN.cpp frees it. The outputs
among them are handed to the fake kernels (per thread), which return them as views instead
of new tensors; the forward's are made by :meth:`RnnKernels.cudnn_impl` and the
backward's by a hook on the ``CudnnRnnBackward0`` node before it runs (knowing which
gradients are undefined). The recorder names these allocations ``new_empty``. The fake
mode's cache is off for the forward's op, whose outputs it would otherwise make anew
without the kernel (a second call of the same shapes). cuDNN's dropout state (one per
device, kept by PyTorch for the process) is allocated at the first training call with
dropout, after the int64 its seed is drawn into.

**Not starting CUDA.** ``torch.backends.cudnn.is_acceptable`` (the real
``flatten_parameters``' test) runs ``torch.backends.cudnn._init()`` once, which asks
``torch.cuda.get_device_capability`` of every device where a GPU is visible: CUDA starts
(an LSTM's dry run on an H200 left ``torch.cuda.is_initialized()`` True; the call found
with torch 2.11's CUDA build told that a GPU is visible). :func:`cudnn_accepts` tests the
same without ``_init()``; ``torch.cudnn_is_acceptable`` and
``torch._use_cudnn_rnn_flatten_weight`` are C++ checks of the build and the flags.

The ``_VF`` functions and ``flatten_parameters`` are replaced and put back; they take the
original path for anything that is not a fake tensor under a fake mode (another thread's
real work). torch is not imported here: the host gives it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from ..torch_build import cuda_ready
from .rnn_ops import RnnOpKernels, flat_buffer, run_steps, storage_key
from .rnn_sizes import (
    ESTIMATES,
    GRU,
    LSTM,
    MODES,
    RNN_RELU,
    RNN_TANH,
    BackwardCall,
    ForwardCall,
    contiguous_strides,
    dropout_state_bytes,
    module_places,
    rnn_num_weights,
    rnn_shape,
    rnn_weight_layout,
    seq_major,
)

_VF_FUNCTIONS = (("lstm", LSTM), ("gru", GRU), ("rnn_tanh", RNN_TANH), ("rnn_relu", RNN_RELU))


class KernelHost(Protocol):
    """What :func:`install` needs of ``fake_kernels.FakeKernels``."""

    t: Any
    device_type: str
    fake_type: type
    mode_type: type
    lock: threading.Lock

    def note(self, key: str, line: str) -> None: ...
    def register(self, undo: contextlib.ExitStack, name: str, fn: Callable[..., Any]) -> None: ...
    def replace(self, undo: contextlib.ExitStack, owner: Any, name: str, value: Any) -> None: ...
    def under_fake(self, x: Any) -> bool: ...


def cudnn_accepts(t: Any, x: Any) -> bool:
    """``torch.backends.cudnn.is_acceptable(x)`` without its ``_init()``, which starts
    CUDA where a GPU is visible (see the module's docstring): cuDNN on, a CUDA tensor of a
    dtype cuDNN takes, a build with cuDNN."""
    return bool(
        t._C._get_cudnn_enabled()
        and x.device.type == "cuda"
        and x.dtype in (t.float16, t.float32, t.float64)
        and t.backends.cudnn.is_available()
    )


def install(host: KernelHost, undo: contextlib.ExitStack, cudnn: bool | None) -> RnnKernels:
    """The RNN kernels and replacements, undone by ``undo``. ``cudnn``: None takes the
    cuDNN path where PyTorch would (a CUDA device, ``torch.cudnn_is_acceptable``); True
    takes it for the host's device type whatever the build (tests on a CPU build); False
    never."""
    kernels = RnnKernels(host, cudnn)
    host.register(undo, "_cudnn_rnn", kernels.cudnn_rnn)
    host.register(undo, "_cudnn_rnn_backward", kernels.cudnn_rnn_backward)
    vf = sys.modules.get("torch._VF") or getattr(host.t, "_VF", None)
    if vf is not None:
        for name, mode in _VF_FUNCTIONS:
            host.replace(undo, vf, name, kernels.vf_function(getattr(vf, name), mode))
    base = host.t.nn.modules.rnn.RNNBase
    host.replace(undo, base, "flatten_parameters", kernels.flatten_replacement(base))
    undo.callback(kernels.dropout_states.clear)
    return kernels


class RnnKernels(RnnOpKernels):
    """The RNN side of one dry run: its cuDNN dropout states and the kernels."""

    def __init__(self, host: KernelHost, cudnn: bool | None) -> None:
        self.host = host
        self.t = host.t
        self.cudnn = cudnn
        self.dropout_states: dict[Any, Any] = {}
        # the outputs made around a call, handed to its fake kernel: per thread (the
        # backward runs in autograd's device thread), "forward" / "backward" -> name -> tensor
        self.handed = threading.local()
        self._cache_lock = threading.Lock()
        self._uncaching: dict[int, tuple[int, bool]] = {}  # id(mode) -> (depth, was on)

    # -- deciding ----------------------------------------------------------------------
    def takes_cudnn(self, x: Any) -> bool:
        """Whether the real run would send this input to cuDNN (``at::cudnn_is_acceptable``
        in the running torch, or the test's ``cudnn=True``) while a fake mode runs."""
        t, host = self.t, self.host
        if self.cudnn is False or not isinstance(x, t.Tensor):
            return False
        if x.device.type != host.device_type or not host.under_fake(x):
            return False
        if self.cudnn is None:
            if host.device_type != "cuda" or t.version.hip:
                return False
            return bool(t.cudnn_is_acceptable(x))
        return bool(
            t.backends.cudnn.enabled
            and x.dtype in (t.float16, t.float32, t.float64)
            and x.numel() > 0
        )

    def weights_acceptable(self, weights: Sequence[Any]) -> bool:
        """``flatten_parameters``' own test: same dtype, on the device, cuDNN takes them
        (:func:`cudnn_accepts`)."""
        t = self.t
        first = weights[0]
        for w in weights:
            if not isinstance(w, t.Tensor) or w.dtype != first.dtype:
                return False
            if w.device.type != self.host.device_type:
                return False
            if self.cudnn is None:
                if not cudnn_accepts(t, w):
                    return False
            elif not self.cudnn or w.dtype not in (t.float16, t.float32, t.float64):
                return False
        return True

    # -- flatten_parameters ------------------------------------------------------------
    def flatten_replacement(self, base: Any) -> Callable[[Any], None]:
        original = base.__dict__["flatten_parameters"]
        fake_type = self.host.fake_type

        def flatten_parameters(module: Any) -> None:
            weights = getattr(module, "_flat_weights", None) or []
            if any(isinstance(w, fake_type) for w in weights):
                self.flatten(module)
                return
            original(module)

        flatten_parameters.__doc__ = original.__doc__
        return flatten_parameters

    def flatten(self, module: Any) -> None:
        """``RNNBase.flatten_parameters`` for fake weights: one zeroed buffer of cuDNN's
        weight space, each weight copied into its view and rebound to it (its own storage
        freed), as ``_cudnn_rnn_flatten_weight`` does; nothing where the real one does
        nothing (weights partly set, of mixed dtypes, not cuDNN's, or aliasing)."""
        t = self.t
        weights = module._flat_weights
        if len(weights) != len(module._flat_weights_names):
            return
        if not all(isinstance(w, t.Tensor) for w in weights):
            return
        if not self.weights_acceptable(weights):
            return
        places = {(storage_key(w), w.storage_offset()) for w in weights}
        if len(places) != len(weights):  # aliasing weights: the real check of data_ptr()
            return
        if self.cudnn is None and not t._use_cudnn_rnn_flatten_weight():
            return
        proj = int(getattr(module, "proj_size", 0) or 0)
        layout, total = rnn_weight_layout(
            MODES[module.mode],
            int(module.input_size),
            int(module.hidden_size),
            proj,
            int(module.num_layers),
            bool(module.bidirectional),
        )
        chosen = module_places(layout, bool(module.bias))
        if len(chosen) != len(weights):
            return
        with t.no_grad():
            buf = weights[0].new_zeros((total,))
            for w, (_, shape, offset) in zip(weights, chosen, strict=True):
                view = buf.as_strided(shape, contiguous_strides(shape), offset)
                view.copy_(w.reshape(shape))
                w.set_(view.view(w.shape))
            del buf

    # -- the _VF functions -------------------------------------------------------------
    def vf_function(self, original: Callable[..., Any], mode: int) -> Callable[..., Any]:
        """``torch._VF.<name>`` taking :meth:`cudnn_impl` where cuDNN would run."""

        def rnn(*args: Any, **kwargs: Any) -> Any:
            if kwargs or len(args) != 9 or not self.takes_cudnn(args[0]):
                return original(*args, **kwargs)
            if isinstance(args[3], (list, tuple)):  # packed: data, batch_sizes, hx, params
                data, batch_sizes, hx, params, has_biases, layers, p, train, bidir = args
                sizes = self._batch_sizes(batch_sizes)
                if sizes is None:
                    return original(*args)
                batch_first = False
            else:
                data, hx, params, has_biases, layers, p, train, bidir, batch_first = args
                sizes = []
            h, c = (hx[0], hx[1]) if mode == LSTM else (hx, None)
            out = self.cudnn_impl(
                mode, data, sizes, h, c, list(params), bool(has_biases), int(layers),
                float(p), bool(train), bool(bidir), bool(batch_first),
            )  # fmt: skip
            return (out[0], out[1], out[2]) if mode == LSTM else (out[0], out[1])

        rnn.__name__ = getattr(original, "__name__", "rnn")
        rnn.__doc__ = getattr(original, "__doc__", None)
        return rnn

    def _batch_sizes(self, batch_sizes: Any) -> list[int] | None:
        """A packed sequence's batch sizes (a CPU tensor the C++ code reads), when known."""
        if isinstance(batch_sizes, self.host.fake_type):
            batch_sizes = getattr(batch_sizes, "constant", None)
        try:
            return [int(n) for n in batch_sizes.tolist()]
        except Exception:
            return None

    def cudnn_impl(
        self,
        mode: int,
        input: Any,
        batch_sizes: list[int],
        hx: Any,
        cx: Any,
        params: list[Any],
        has_biases: bool,
        layers: int,
        dropout: float,
        train: bool,
        bidirectional: bool,
        batch_first: bool,
    ) -> Any:
        """``_cudnn_impl`` of RNN.cpp without cuDNN: the flat buffer found from the
        weights' storage (``try_get_weight_buf``), the dropout state, the call's
        allocations in RNN.cpp's order (:class:`~.fake_rnn_sizes.ForwardCall`), then
        ``aten._cudnn_rnn`` through the dispatcher, its kernel given the outputs made."""
        t = self.t
        hidden = int(hx.shape[2])
        proj = 0
        if cx is not None and int(cx.shape[2]) != hidden:  # LSTM with projections
            hidden, proj = int(cx.shape[2]), int(hx.shape[2])
        weight_stride0 = (4 if has_biases else 2) + (1 if proj else 0)
        total = rnn_num_weights(mode, int(input.shape[-1]), hidden, proj, layers, bidirectional)
        weight_buf = flat_buffer(params, total)
        if weight_buf is None:
            self.host.note(
                "rnn-copies-weights",
                "an RNN's weights are not in one buffer (RNNBase.flatten_parameters did not "
                "flatten them): cuDNN copies them into a new buffer at every call, as the "
                "real run does",
            )
        state = self._dropout_state(input) if train and dropout > 0 else None
        packed = bool(batch_sizes)
        shape = rnn_shape(
            mode, input, batch_sizes, hidden, proj, layers, bidirectional, batch_first,
            dropout if train else 0.0,
        )  # fmt: skip
        self.host.note("rnn-estimates", ESTIMATES)
        call = ForwardCall.of(shape, input, hx, cx, train, batch_first, packed, weight_buf is None)
        seq_shape = (shape.rows, shape.out * shape.dirs) if packed else (
            int(input.shape[1] if batch_first else input.shape[0]),
            shape.batch,
            shape.out * shape.dirs,
        )  # fmt: skip
        uint8 = t.uint8

        def make(name: str, n: int) -> Any:
            if name == "output":
                return input.new_empty(seq_shape)
            if name == "hy":
                return hx.new_empty((layers * shape.dirs, shape.batch, shape.out))
            if name == "cy":
                return cx.new_empty(tuple(cx.shape))
            if name == "weight_buf":
                return input.new_empty((total,))
            return input.new_empty((n,), dtype=uint8)

        made = run_steps(call.steps(), make)
        self.handed.forward = {k: made[k] for k in ForwardCall.KEPT if k in made}
        made.clear()
        try:
            with self._uncached(input):
                out = t.ops.aten._cudnn_rnn.default(
                    input, params, weight_stride0, weight_buf, hx, cx, mode, hidden, proj,
                    layers, batch_first, dropout, train, bidirectional, batch_sizes, state,
                )  # fmt: skip
        finally:
            self.handed.forward = None
        node = getattr(out[0], "grad_fn", None)
        if node is not None and train:
            back = BackwardCall.of(
                shape, input, hx, cx, out[0], out[4], params, batch_first, packed, weight_stride0
            )
            self._hook_backward(node, back, input, hx, cx, out[4], params, batch_first, packed)
        return out

    def _dropout_state(self, input: Any) -> Any:
        """cuDNN's dropout state for the input's device: made at the first training call
        with dropout (after the int64 its seed is drawn into) and kept for the rest of the
        run (PyTorch keeps it for the process); its size by the card's SMs where CUDA
        runs, else the H200's (``fake_rnn_sizes.DROPOUT_STATE_PER_SM``)."""
        key = (input.device.type, input.device.index)
        t = self.t
        with self.host.lock:
            state = self.dropout_states.get(key)
            if state is None:
                seed = input.new_empty((), dtype=t.int64)  # at::empty({}, kLong)
                del seed
                n = dropout_state_bytes(self._sms(input.device))
                state = input.new_empty((n,), dtype=t.uint8)
                self.dropout_states[key] = state
                self.host.note(
                    "rnn-dropout-state",
                    f"cuDNN's dropout state for RNNs ({n:,} B: 48 KiB per multiprocessor, as "
                    "measured on an H200) is allocated at the first training call with "
                    "dropout; PyTorch keeps it for the process (none is made if an earlier "
                    "cell already made one)",
                )
        return state

    def _sms(self, device: Any) -> int | None:
        """The card's multiprocessors, where CUDA already runs (asking starts nothing)."""
        t = self.t
        try:
            if device.type != "cuda" or not cuda_ready(t):
                return None
            index = device.index if device.index is not None else t.cuda.current_device()
            return int(t.cuda.get_device_properties(index).multi_processor_count)
        except Exception:
            return None

    @contextlib.contextmanager
    def _uncached(self, x: Any) -> Iterator[None]:
        """The fake mode's cache off: a cached ``_cudnn_rnn`` would give new outputs
        without running the kernel, which returns those made around the call."""
        fake_mode = self._fake_mode(x)
        if fake_mode is None or not isinstance(getattr(fake_mode, "cache_enabled", None), bool):
            yield
            return
        key = id(fake_mode)
        with self._cache_lock:
            depth, was = self._uncaching.get(key, (0, fake_mode.cache_enabled))
            self._uncaching[key] = (depth + 1, was)
            fake_mode.cache_enabled = False
        try:
            yield
        finally:
            with self._cache_lock:
                depth, was = self._uncaching.pop(key)
                if depth > 1:
                    self._uncaching[key] = (depth - 1, was)
                else:
                    fake_mode.cache_enabled = was

    def _fake_mode(self, x: Any) -> Any:
        if isinstance(x, self.host.fake_type):
            return getattr(x, "fake_mode", None)
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        for m in reversed(_get_current_dispatch_mode_stack()):
            if isinstance(m, self.host.mode_type):
                return m
        return None

    def _hook_backward(
        self,
        node: Any,
        call: BackwardCall,
        input: Any,
        hx: Any,
        cx: Any,
        weight_buf: Any,
        params: Sequence[Any],
        batch_first: bool,
        packed: bool,
    ) -> None:
        """The backward's allocations around ``CudnnRnnBackward0``: made before it runs
        (knowing which gradients are undefined), its outputs handed to the kernel; what the
        kernel did not take is dropped after. Shapes and dtypes only are kept here."""
        t = self.t
        dtype, uint8 = input.dtype, t.uint8
        seq = tuple(int(n) for n in seq_major(input, batch_first, packed).shape)
        hx_shape = tuple(int(n) for n in hx.shape)
        cx_shape = tuple(int(n) for n in cx.shape) if cx is not None else ()
        dw_shape = (int(weight_buf.numel()),)
        weights = [tuple(int(n) for n in p.shape) for p in params]
        shapes: dict[str, tuple[int, ...]] = {
            "dx": seq, "dhx": hx_shape, "dcx": cx_shape, "dw": dw_shape,
            **{f"grad{i}": w for i, w in enumerate(weights)},
        }  # fmt: skip
        kept = call.kept()

        def before(grad_outputs: Any) -> None:
            grads = [*list(grad_outputs)[:3], None, None, None][:3]
            ref = next((g for g in grads if g is not None), None)
            if ref is None:
                return
            g_out, g_hy, g_cy = grads
            copies = (
                g_out is not None and not seq_major(g_out, batch_first, packed).is_contiguous(),
                g_hy is not None and not g_hy.is_contiguous(),
                g_cy is not None and not g_cy.is_contiguous(),
            )

            def make(name: str, n: int) -> Any:
                shape = shapes.get(name)
                if shape is not None:
                    return ref.new_empty(shape, dtype=dtype)
                return ref.new_empty((n,), dtype=uint8)

            steps = call.steps([g is None for g in grads], copies)
            made = run_steps(steps, make)
            self.handed.backward = {k: made[k] for k in kept if k in made}
            made.clear()

        def after(grad_inputs: Any, grad_outputs: Any) -> None:
            self.handed.backward = None

        node.register_prehook(before)
        node.register_hook(after)
