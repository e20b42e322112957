"""Fake kernels for ops whose own fake kernels fail or refuse what the real CUDA op runs,
with the allocations the real op makes. :func:`fake_kernels` installs them for one dry run
(``collectors/fake_run._run_recorded`` enters it beside the fake mode) and undoes every
change on exit:

- cuDNN's RNNs (``nn.LSTM``, ``nn.GRU``, ``nn.RNN`` on CUDA): ``collectors/dry_run/rnn.py``,
  its sizes in ``collectors/dry_run/rnn_sizes.py``;
- ``aten._grouped_mm`` with float32 or float16 inputs, here.

**``aten._grouped_mm``**: the meta kernel takes bfloat16 only; the real op
(``_grouped_mm_cuda``, aten/src/ATen/native/cuda/GroupedBlas.cpp) takes all three,
bfloat16 through CUTLASS on compute capability 9.x/10.x and the rest through
``_grouped_mm_fallback`` (one ``mm_out`` per group into the output: cuBLAS, whose workspace
``collectors/dry_run/workspaces.py`` counts). The fake kernel checks what
``_grouped_mm_validate_inputs`` checks and returns ``create_grouped_gemm_output_tensor``'s
output (GroupedMMUtils.h): its last dimension's stride padded to 16 bytes (not on ROCm),
whatever the device.

**The mechanism** (:class:`FakeKernels`). The fake kernels go into
``torch._library.simple_registry``'s fake-impl holder of each op (``holder.kernels``), which
``FakeTensorMode._dispatch_impl`` consults (in torch 2.11 and 2.13) after its fast paths and
decompositions (neither applies to these ops) and before the meta kernel.
``torch.library.register_fake`` refuses an op with a meta kernel, and would also register a
Meta kernel in the dispatcher; a decomposition is not used for ops that have a meta in
``torch._decomp.meta_table`` (these have); a ``py_impl`` on the fake mode's class is read
only under the Python dispatcher, which a dry run does not enable; a dispatch mode of its
own would add a Python call to every op of the run. The holder's list is put back on exit,
and the fake mode's class-wide cache loses its entries for these ops on entry and exit
(entries made with the meta kernel, or with these kernels, would otherwise answer without
them). Python functions replaced (``torch._VF``'s, ``RNNBase.flatten_parameters``) are put
back as they were.

torch is not imported at module level: :func:`fake_kernels` is given it.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .rnn import RnnKernels
from .rnn import install as install_rnn


@contextlib.contextmanager
def fake_kernels(
    t: Any,
    device_type: str,
    note: Callable[[str, str], None] | None = None,
    *,
    cudnn: bool | None = None,
) -> Iterator[FakeKernels]:
    """The fake kernels and replacements of the module's docstring, for one dry run of
    ``device_type`` storages; everything is put back on exit, also when the run raises.
    ``note(key, line)``: told what the run should say (estimates used, an RNN whose
    weights are copied at every call); ``State.note`` fits. ``cudnn``: None takes the
    cuDNN path where PyTorch would (a CUDA device, ``torch.cudnn_is_acceptable``); True
    takes it for ``device_type`` whatever the build (tests on a CPU build); False never."""
    kernels = FakeKernels(t, device_type, note)
    with contextlib.ExitStack() as undo:
        undo.callback(kernels.purge_cache)  # last: after the holders are put back
        kernels.register(undo, "_grouped_mm", grouped_mm_kernel(t))  # torch 2.8 and later
        kernels.rnn = install_rnn(kernels, undo, cudnn)
        kernels.purge_cache()
        yield kernels


class FakeKernels:
    """What one :func:`fake_kernels` installed: the ops given fake kernels, the notes, and
    the means to install (:meth:`register`, :meth:`replace`) that ``rnn`` uses."""

    def __init__(self, t: Any, device_type: str, note: Callable[[str, str], None] | None):
        from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

        self.t = t
        self.device_type = device_type
        self.note_fn = note
        self.notes: list[str] = []
        self.lock = threading.Lock()
        self.fake_type: type = FakeTensor
        self.mode_type: type = FakeTensorMode
        self.funcs: set[Any] = set()  # the OpOverloads given a fake kernel
        self.rnn: RnnKernels | None = None

    def note(self, key: str, line: str) -> None:
        if line not in self.notes:
            self.notes.append(line)
        if self.note_fn is not None:
            self.note_fn(key, line)

    def register(self, undo: contextlib.ExitStack, name: str, fn: Callable[..., Any]) -> None:
        """``fn`` as the fake kernel of ``aten::<name>`` (nothing where this torch has no
        such op, or no holder to put it in), taken back by ``undo``."""
        packet = getattr(self.t.ops.aten, name, None)
        if packet is None:
            return
        try:
            from torch._library import simple_registry
            from torch._library.utils import Kernel
        except ImportError:  # a torch without it: the op keeps torch's own fake kernel
            return
        self.funcs.add(packet.default)
        holder: Any = simple_registry.singleton.find(f"aten::{name}").fake_impl
        kernel = Kernel(fn, f"{__name__} (jupyter-gpumem's dry run)")
        kernels = getattr(holder, "kernels", None)
        if isinstance(kernels, list):  # torch 2.11, 2.13: the newest registration wins
            kernels.append(kernel)

            def remove() -> None:
                with contextlib.suppress(ValueError):
                    kernels.remove(kernel)

            undo.callback(remove)
        else:  # older torch: one kernel attribute
            previous = holder.kernel
            holder.kernel = kernel
            undo.callback(setattr, holder, "kernel", previous)

    def replace(self, undo: contextlib.ExitStack, owner: Any, name: str, value: Any) -> None:
        """``owner.name = value``, put back by ``undo`` as it was (deleted again where
        ``owner`` only forwarded the name, as ``torch._VF`` does)."""
        own = vars(owner)
        had, previous = name in own, own.get(name)
        setattr(owner, name, value)
        if had:
            undo.callback(setattr, owner, name, previous)
        else:
            undo.callback(delattr, owner, name)

    def purge_cache(self) -> None:
        """Drops the fake mode's cached outputs of these ops (a class-wide cache)."""
        cache = getattr(self.mode_type, "cache", None)
        if not isinstance(cache, dict):
            return
        for key in list(cache):
            k = getattr(key, "key", None)
            if isinstance(k, tuple) and k and k[0] in self.funcs:
                cache.pop(key, None)

    def under_fake(self, x: Any) -> bool:
        """Whether ``x`` is a fake tensor, or a fake mode is on."""
        if isinstance(x, self.fake_type):
            return True
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        return any(isinstance(m, self.mode_type) for m in _get_current_dispatch_mode_stack())


# -- aten._grouped_mm ----------------------------------------------------------------------


def grouped_mm_out(
    a_shape: Sequence[int], b_shape: Sequence[int], groups: int | None, itemsize: int, rocm: bool
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``create_grouped_gemm_output_tensor``'s size and strides (GroupedMMUtils.h): 2d x 2d
    gives ``(groups, m, n)``, 2d x 3d ``(m, n)``, 3d x 2d ``(m, n)`` and 3d x 3d a batched
    ``(b, m, n)``; the last dimension's stride is padded to 16 bytes except on ROCm."""
    a2, b2 = len(a_shape) == 2, len(b_shape) == 2
    if a2 and b2:
        assert groups is not None
        size: tuple[int, ...] = (groups, a_shape[0], b_shape[1])
    elif a2:
        size = (a_shape[0], b_shape[-1])
    elif b2:
        size = (a_shape[1], b_shape[1])
    else:
        size = (a_shape[0], a_shape[1], b_shape[-1])
    if rocm:
        stride = tuple(math.prod(size[i + 1 :]) for i in range(len(size)))
        return size, stride
    align = max(1, 16 // itemsize)
    padded = (size[-1] + align - 1) // align * align
    if len(size) == 2:
        return size, (padded, 1)
    return size, (size[1] * padded, padded, 1)


def grouped_mm_kernel(t: Any) -> Callable[..., Any]:
    """The fake kernel of ``aten._grouped_mm``: ``_grouped_mm_cuda``'s checks and output
    (GroupedBlas.cpp, GroupedMMUtils.h): bfloat16, float32 or float16 inputs, the output in
    ``mat_a``'s dtype with its last stride padded to 16 bytes."""
    allowed = (t.bfloat16, t.float32, t.float16)
    rocm = bool(t.version.hip)

    def grouped_mm(
        mat_a: Any, mat_b: Any, offs: Any = None, bias: Any = None, out_dtype: Any = None
    ) -> Any:
        for name, mat in (("mat_a", mat_a), ("mat_b", mat_b)):
            if mat.dtype not in allowed:
                raise RuntimeError(
                    f"Expected {name} to be Float32, BFloat16 or Float16 matrix, got {mat.dtype}"
                )
        if mat_a.dim() not in (2, 3):
            raise RuntimeError("mat_a has to be 2 or 3d")
        if mat_b.dim() not in (2, 3):
            raise RuntimeError("mat_b has to be 2 or 3d")
        a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
        if (not a2 or not b2) and mat_a.shape[-1] != mat_b.shape[-2]:
            raise RuntimeError("contraction dimension of mat_a and mat_b must match")
        _check_strides(mat_a)
        _check_strides(mat_b)
        if (offs is not None) != (a2 or b2):
            raise RuntimeError(
                "Have to provide offsets if there is a 2d matrix, or no offset if both "
                "matrices are 3d"
            )
        groups = None
        if offs is not None:
            if offs.dim() != 1:
                raise RuntimeError("offs has to be 1D")
            if offs.dtype != t.int32:
                raise RuntimeError("Offsets have to be int32")
            groups = int(offs.shape[0])
            if (a2 and not b2 and groups != mat_b.shape[0]) or (
                b2 and not a2 and groups != mat_a.shape[0]
            ):
                raise RuntimeError("matrix batch sizes have to match")
        if bias is not None:
            raise RuntimeError("Bias not supported yet")
        dtype = mat_a.dtype if out_dtype is None else out_dtype
        if dtype != mat_a.dtype:
            raise RuntimeError("Grouped gemm output dtype must match `mat_a` dtype")
        if not a2 and not b2 and mat_a.shape[0] != mat_b.shape[0]:
            raise RuntimeError("batched dimension has to match")
        itemsize = int(getattr(dtype, "itemsize", 0) or mat_a.element_size())
        size, stride = grouped_mm_out(
            tuple(int(n) for n in mat_a.shape),
            tuple(int(n) for n in mat_b.shape),
            groups,
            itemsize,
            rocm,
        )
        return mat_a.new_empty_strided(size, stride, dtype=dtype)

    return grouped_mm


def _check_strides(mat: Any) -> None:
    """``check_valid_strides_and_return_transposed`` (without the data pointer's
    alignment, which a fake tensor has not): one of the last two strides 1, the other a
    multiple of 16 bytes."""
    strides, sizes = mat.stride(), mat.shape
    end = mat.dim() - 1
    align = max(1, 16 // mat.element_size())
    if strides[end - 1] == 1 and strides[end] >= max(1, sizes[end - 1]):
        if strides[end] % align:
            raise RuntimeError("strides should be multiple of 16 bytes")
    elif strides[end] == 1 and strides[end - 1] >= max(1, sizes[end]):
        if strides[end - 1] % align:
            raise RuntimeError("strides should be multiple of 16 bytes")
    else:
        raise RuntimeError(
            f"Invalid strides/sizes, got {tuple(strides)} for strides and {tuple(sizes)} for sizes"
        )
