"""What a dry run changes in torch while it runs, and puts back afterwards: each change
makes the fake run take the path the real run takes, or keeps it from starting CUDA.

- **foreach optimizers.** ``torch.optim``'s default picks the foreach implementation only
  for parameters whose type is ``torch.Tensor`` or ``Parameter`` (DTensor adds itself the
  same way); a fake parameter's type is ``FakeTensor``, so a dry run took the one-tensor-
  at-a-time loop, whose temporaries are one parameter's, where the real step's foreach
  kernels hold a copy of every state at once (``_foreach_sqrt`` of AdamW's second
  moments: 32 GB for an 8B model in fp32). Listing ``FakeTensor`` makes the choice the
  real one.
- **moving a module.** ``Module.to``, ``.cuda()``, ``.half()`` on a module of fake
  tensors swap each parameter in place (``torch.utils.swap_tensors``), which refuses
  tensors that have weak references; the fake mode keeps weak references to the fake
  tensors it made. For fake tensors only, the check is skipped: what holds them weakly is
  the fake mode's own memo, which the swap leaves consistent.
- **a tensor from data on the GPU** (``torch.tensor(data, device="cuda")``,
  ``as_tensor``, ``asarray``, ``new_tensor``): torch builds it with a device guard, which
  makes the driver create a CUDA context (hundreds of MiB) even under the fake mode. It is
  built on the CPU and moved, which the fake mode does without the device.
- **the fake mode itself** (:func:`fake_mode`) is torch's ``FakeTensorMode`` as torch makes
  it where no GPU is visible (``avoid_device_init``): where one is, torch's mode computes
  a small constant tensor's copy to the GPU (a BatchNorm's ``num_batches_tracked``,
  ``torch.tensor([]).to("cuda")``) by running the copy for real on the device.
- **warnings about fake tensors** (torch's, for a data pointer asked of a fake tensor when
  a module is deep-copied) are not shown: they are about the dry run, not the user's code.
- **a linear layer's bias on a strided input** is added in place, as ``at::linear`` does
  for real where the bias is no tensor subclass (a fake bias took an out-of-place add: one
  more output-sized temporary).
- **bfloat16 autocast** asks ``torch.cuda.is_bf16_supported()``, which starts CUDA. While
  CUDA has not started, the answer comes from the card's compute capability read through
  NVML (8.0 and later: yes; earlier cards emulate it, as torch's own check then finds).
- **a card's compute capability** (``torch.cuda.get_device_capability``, which libraries
  ask before choosing a kernel: transformers' grouped matmuls for mixtures of experts)
  starts CUDA too; while it has not started, the answer is NVML's for that card.

Each is undone on exit, also when the run raises.
"""

from __future__ import annotations

import contextlib
import types
import warnings
import weakref
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from ..torch_build import cuda_ready

_FROM_DATA = ("tensor", "as_tensor", "asarray")


def _foreach_lists(t: Any) -> list[list[Any]]:
    out = []
    for path in ("torch.optim.optimizer", "torch.utils._foreach_utils"):
        module = _module(path)
        found = getattr(module, "_foreach_supported_types", None) if module else None
        if isinstance(found, list):
            out.append(found)
    return out


def _module(path: str) -> Any:
    import sys

    return sys.modules.get(path)


@contextlib.contextmanager
def patched(t: Any, device_type: str, capability: Callable[[int], Any]) -> Iterator[None]:
    """The changes above, for one dry run of ``device_type`` storages."""
    from torch._subclasses.fake_tensor import FakeTensor

    undo: list[Callable[[], None]] = []
    quiet = warnings.catch_warnings()
    quiet.__enter__()
    undo.append(lambda: quiet.__exit__(None, None, None))
    # copy.deepcopy of a fake module (nn.TransformerEncoder clones its layer) asks for a
    # data pointer, which torch warns about for fake tensors: the user's code is fine
    warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
    try:
        # foreach optimizers
        import importlib

        importlib.import_module("torch.optim.optimizer")  # the optimizers' own module
        for types_list in _foreach_lists(t):
            if FakeTensor not in types_list:
                types_list.append(FakeTensor)
                undo.append(partial(types_list.remove, FakeTensor))

        # moving a module of fake tensors; swapping a real one would change the user's
        utils = t.utils
        real_swap = utils.swap_tensors

        def swap_tensors(t1: Any, t2: Any) -> Any:
            for x in (t1, t2):
                if isinstance(x, t.Tensor) and not isinstance(x, FakeTensor):
                    from .guard import Refused

                    raise Refused(
                        "a dry run changes no real tensor: the cell converts a real module "
                        "or tensor in place (.to(), .half(), .cuda() swap each parameter); "
                        "build the model in the dry run, or convert it in a cell that runs",
                        None,
                    )
            return real_swap(t1, t2)

        utils.swap_tensors = swap_tensors
        undo.append(lambda: setattr(utils, "swap_tensors", real_swap))
        undo.extend(_native_writers_refused())
        undo.append(_linear_adds_in_place(t))
        real_weakref = getattr(utils, "weakref", None)
        if real_weakref is weakref:

            def getweakrefs(x: Any) -> list[Any]:
                return [] if isinstance(x, FakeTensor) else weakref.getweakrefs(x)

            utils.weakref = types.SimpleNamespace(getweakrefs=getweakrefs)
            undo.append(lambda: setattr(utils, "weakref", real_weakref))

        if device_type == "cuda":
            cuda = t.cuda
            original_bf16 = cuda.is_bf16_supported

            def is_bf16_supported(including_emulation: bool = True) -> bool:
                if cuda_ready(t):
                    return bool(original_bf16(including_emulation))
                cap = capability(0)
                if cap is None or cap[0] >= 8:
                    return True
                return including_emulation

            cuda.is_bf16_supported = is_bf16_supported
            undo.append(lambda: setattr(cuda, "is_bf16_supported", original_bf16))
            undo.append(_capability_from_nvml(t, capability))
        yield
    finally:
        for step in reversed(undo):
            step()


def _capability_from_nvml(t: Any, capability: Callable[[int], Any]) -> Callable[[], None]:
    cuda = t.cuda
    original = cuda.get_device_capability

    def get_device_capability(device: Any = None) -> tuple[int, int]:
        if not cuda_ready(t):
            index = _index_of(t, device)
            cap = None if index is None else capability(index)
            if cap is not None:
                return int(cap[0]), int(cap[1])
        return original(device)

    cuda.get_device_capability = get_device_capability
    return lambda: setattr(cuda, "get_device_capability", original)


def _index_of(t: Any, device: Any) -> int | None:
    """The CUDA device index ``device`` names (None, an int, ``"cuda:1"``, a
    ``torch.device``), or None for another kind; no index is device 0, where torch's current
    device is while CUDA has not started."""
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    try:
        d = t.device(device)
    except (TypeError, RuntimeError):
        return None
    if d.type != "cuda":
        return None
    return 0 if d.index is None else int(d.index)


# Writers that open their file in native code, where Python's audit hooks don't see it
# (``collectors/dry_run/guard.py`` refuses the rest): module -> function names
_NATIVE_WRITERS = {
    "torch": ("save",),
    "torch.serialization": ("save",),
    "torch.jit": ("save",),
    "torch.export": ("save",),
    "safetensors.torch": ("save_file", "save_model"),
    "transformers.modeling_utils": ("safe_save_file",),
}


def _native_writers_refused() -> list[Callable[[], None]]:
    """Replace each native writer already imported by one that refuses (what it would
    write, where); the list undoes it."""
    import sys

    undo: list[Callable[[], None]] = []
    for path, names in _NATIVE_WRITERS.items():
        module = sys.modules.get(path)
        for name in names:
            real = getattr(module, name, None) if module is not None else None
            if real is None or getattr(real, "_gpumem_refuses", False):
                continue
            setattr(module, name, _refusing(f"{path}.{name}"))
            undo.append(partial(setattr, module, name, real))
    return undo


def _refusing(name: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        from .guard import Refused, shown

        target = next((a for a in (*args[1:2], kwargs.get("f"), kwargs.get("filename")) if a), None)
        where = (
            f" to '{shown(target)}'"
            if isinstance(target, (str, bytes)) or hasattr(target, "__fspath__")
            else ""
        )
        raise Refused(
            f"a dry run writes no file: {name}{where} was refused; the file is as it was", None
        )

    refuse._gpumem_refuses = True  # type: ignore[attr-defined]
    return refuse


def _linear_adds_in_place(t: Any) -> Callable[[], None]:
    """``F.linear`` as the real op runs it where it adds its bias in place. For an input
    that is neither 2-D (``addmm``) nor contiguous (flattened), ``at::linear`` computes
    ``matmul`` and then ``output.add_(bias)``, but only when the bias is no tensor subclass:
    a fake bias takes the out-of-place ``add``, one more output-sized temporary (163.8 MB a
    step in an LSTM language model's head on an H200, a 196 MiB segment of its reserved).
    Here the same input takes ``linear`` without the bias and ``add_``: the real run's
    allocations and autograd graph. Undone by the returned function."""
    functional = t.nn.functional
    real = functional.linear

    def linear(input: Any, weight: Any, bias: Any = None) -> Any:
        if bias is None or input.dim() == 2 or input.is_contiguous() or input.layout != t.strided:
            return real(input, weight, bias)
        return real(input, weight).add_(bias)

    functional.linear = linear
    return lambda: setattr(functional, "linear", real)


def _default_device(t: Any) -> Any:
    """The device a factory without ``device=`` builds on: the innermost ``with
    torch.device(...)``, else ``torch.set_default_device``'s, else the CPU. Read as
    ``torch.get_default_device()`` does, without its ``torch.tensor([])`` for a device
    without an index (on ``cuda`` that would make a real tensor, and a context)."""
    try:
        from torch.overrides import _get_current_function_mode_stack
        from torch.utils._device import DeviceContext

        for mode in reversed(_get_current_function_mode_stack()):
            if isinstance(mode, DeviceContext):
                return mode.device
        context = getattr(t._GLOBAL_DEVICE_CONTEXT, "device_context", None)
        return context.device if context is not None else t.device("cpu")
    except (ImportError, AttributeError):  # another torch: its own answer
        return t.get_default_device()


@contextlib.contextmanager
def data_on_cpu(t: Any, device_type: str) -> Iterator[None]:
    """``torch.tensor``, ``as_tensor``, ``asarray`` and ``Tensor.new_tensor`` build a tensor
    for ``device_type`` from data on the CPU and move it (see the module's docstring);
    nothing changes for the CPU itself. The functions are replaced, not intercepted by a
    torch function mode: any active mode makes ``has_torch_function`` true, which turns
    off fast paths the real run takes (``nn.MultiheadAttention``'s fused inference path:
    a ViT-B/16's reserved peak predicted 16 % high on an H200)."""
    if device_type == "cpu":
        yield
        return

    def on_cpu(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], device: Any) -> Any:
        grad = bool(kwargs.pop("requires_grad", False))
        kwargs.pop("pin_memory", None)
        kwargs["device"] = "cpu"
        with t.device("cpu"):
            out = func(*args, **kwargs)
        out = out.to(device)
        return out.requires_grad_(True) if grad else out

    def factory(func: Any) -> Any:
        def from_data(*args: Any, **kwargs: Any) -> Any:
            asked = kwargs.get("device")
            device = t.device(_default_device(t) if asked is None else asked)
            if device.type != device_type:
                return func(*args, **kwargs)
            return on_cpu(func, args, dict(kwargs), device)

        return from_data

    def new_tensor(self: Any, *args: Any, **kwargs: Any) -> Any:
        asked = kwargs.get("device")
        device = t.device(self.device if asked is None else asked)
        if device.type != device_type:
            return original_new(self, *args, **kwargs)
        kwargs.setdefault("dtype", self.dtype)
        return on_cpu(partial(original_new, self), args, dict(kwargs), device)

    originals = {name: getattr(t, name) for name in _FROM_DATA if hasattr(t, name)}
    original_new = t.Tensor.new_tensor
    try:
        for name, func in originals.items():
            setattr(t, name, factory(func))
        t.Tensor.new_tensor = new_tensor
        yield
    finally:
        for name, func in originals.items():
            setattr(t, name, func)
        t.Tensor.new_tensor = original_new


_MODE: Any = None


def fake_mode() -> Any:
    """A new ``FakeTensorMode`` that never runs an op on a device: ``avoid_device_init`` on,
    as torch sets it where no GPU is visible. Nothing else changes: the fake kernels are
    the same, and so are the sizes they give; only its cache's key is built faster."""
    global _MODE
    if _MODE is None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        class NoDeviceFakeTensorMode(FakeTensorMode):
            @property
            def avoid_device_init(self) -> bool:
                return True

        _MODE = NoDeviceFakeTensorMode
    from .cache_key import install

    mode = _MODE(allow_non_fake_inputs=True)
    install(mode)  # its cache keyed faster (cache_key.py)
    return mode
