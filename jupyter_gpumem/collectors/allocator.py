"""PyTorch's allocator, read without changing what the user's program does.

Rules this module keeps (see ../shared/REFERENCE.md, checked on an H200 with torch 2.11):
- torch is never imported here: it is taken from ``sys.modules`` if the user imported it.
- No CUDA context is ever created by a reading: allocator figures are read only when
  ``torch.cuda.is_initialized()``, and per device only where a primary context exists
  (``torch._C._cuda_hasPrimaryContext``, which asks the driver without creating one).
  ``mem_get_info`` and ``set_per_process_memory_fraction`` would create one elsewhere.
- ``torch._C._cuda_memoryStats`` (nested, 7.5 us) is read instead of ``memory_stats``
  (flattened in Python, 45 us); both hold the same numbers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..model import BackendName, DeviceSample, Limit, Replay
from .nvml import Nvml, NvmlDevice
from .readings import Reading, make_device_sample, stats_from_flat, stats_from_nested
from .torch_build import cuda_ready, gpu_backend, gpu_build, imported_torch, why_no_gpu

_NO_CACHING_ENV = "PYTORCH_NO_CUDA_MEMORY_CACHING"


class TorchBackend:
    """The real backend: torch (if the user imported it) plus NVML."""

    def __init__(self, nvml: Nvml | None = None) -> None:
        self.nvml = nvml or Nvml()
        self._names: dict[int, str] = {}
        self._oom_attached = False
        self._caching_set: bool | None = None  # last switch we made (torch < 2.12 can't tell)
        self._bound: _Bound | None = None  # torch's bindings, looked up once CUDA is up

    # -- reading -------------------------------------------------------------------
    @staticmethod
    def torch() -> Any:
        return imported_torch()

    def cuda_ready(self) -> bool:
        return cuda_ready(self.torch())

    def initialized_devices(self) -> list[int]:
        """Devices where this process has a CUDA context."""
        t = self.torch()
        if not cuda_ready(t):
            return []
        has_ctx = getattr(t._C, "_cuda_hasPrimaryContext", None)
        n = t.cuda.device_count()
        if has_ctx is None:
            return [t.cuda.current_device()]
        return [i for i in range(n) if has_ctx(i)]

    def device_count(self) -> int:
        t = self.torch()
        if cuda_ready(t):
            return int(t.cuda.device_count())
        return len(self.nvml.visible())

    def read(self, with_process: bool = True, full: bool = True) -> Reading:
        """``full``: NVML figures for every device (``%gpumem``, the panel). Otherwise only
        what a cell's before/after needs, from the allocator and ``cudaMemGetInfo``
        (~10 us a device), plus NVML's per-process figure when ``with_process``."""
        t = imported_torch()
        b = self._bound
        if b is not None and b.torch is t and b.is_initialized():
            if not (full or with_process):
                return self._bracket(b)
            return self._read_cuda(t, b, with_process, full)
        if t is None:
            seen = self._nvml_devices(with_process) if full else ()
            return Reading("no_torch", self._no_torch_message(seen), None, None, seen)
        version = str(getattr(t, "__version__", "?"))
        if not gpu_build(t):
            other = _other_accelerator(t)
            if other is not None:
                return other
            seen = self._nvml_devices(with_process) if full else ()
            return Reading(
                "cpu_only",
                str(why_no_gpu(None, state="cpu_only", version=version))
                + (": GPU figures come from NVML only" if seen else ""),
                version,
                None,
                seen,
            )
        if not cuda_ready(t):
            nvml_devices = self._nvml_devices(with_process) if full else ()
            found = bool(nvml_devices) or not full or not self.nvml.available
            return Reading(
                "not_initialized" if found else "no_gpu",
                f"{why_no_gpu(None, state='not_initialized', needs='memory')}: NVML figures only"
                if found
                else "no GPU found",
                version,
                _caching_enabled(t, self._caching_set),
                nvml_devices,
            )
        b = self._bound = _Bound(t)
        return self._read_cuda(t, b, with_process, full)

    def _bracket(self, b: _Bound) -> Reading:
        """The reading before and after a ``-q`` or auto-mode cell: each device's allocator
        and ``cudaMemGetInfo``, nothing from NVML (what :meth:`_read_cuda` reads with
        neither ``full`` nor ``with_process``, by the shortest path: it runs twice a cell).
        """
        devices: list[DeviceSample] = []
        backend, contexts, names = b.backend, b.contexts, self._names
        for i in range(b.count):
            if i not in contexts and not b.has_context(i):
                devices.append(self._no_context(i, b, None, False))
                continue
            try:
                stats = stats_from_nested(b.memory_stats(i))
                free, total = b.mem_get_info(i)
                limit = None
                if b.get_fraction is not None:
                    fraction = float(b.get_fraction(i))
                    if fraction < 1.0:
                        limit = Limit(fraction=fraction, bytes=int(fraction * total))
                name = names.get(i) or self._device_name(b.torch, i)
                devices.append(
                    DeviceSample(i, name, backend, True, stats, total, total - free, None, limit)
                )
            except Exception as e:  # a reading must never break the user's cell
                devices.append(DeviceSample(i, names.get(i, ""), backend, True, error=repr(e)))
        caching = bool(b.caching_fn()) if b.caching_fn is not None else self._caching(b)
        return Reading("ok", "", b.version, caching, tuple(devices))

    def _device_name(self, t: Any, i: int) -> str:
        name = self._names[i] = str(t.cuda.get_device_name(i))
        return name

    def _caching(self, b: _Bound) -> bool | None:
        if b.caching_fn is not None:
            return bool(b.caching_fn())
        return self._caching_set if self._caching_set is not None else b.caching_env

    def _no_context(
        self, i: int, b: _Bound, nvml_index: int | None, full: bool, with_process: bool = False
    ) -> DeviceSample:
        """A device where this process has no CUDA context: only NVML can say anything,
        and only full readings ask."""
        nv = self.nvml.read(nvml_index, with_process) if nvml_index is not None else None
        return make_device_sample(
            index=i,
            name=nv.name if nv else self._names.get(i, ""),
            backend=b.backend,
            initialized=False,
            stats=None,
            nvml=nv,
            mem_get_info=None,
            fraction=None,
            error=None if nv or not full else "no CUDA context on this device yet",
        )

    def _read_cuda(self, t: Any, b: _Bound, with_process: bool, full: bool) -> Reading:
        """CUDA is up in this process: the allocator of each device with a context."""
        backend = b.backend
        nvml = self.nvml
        per_device_nvml = full and backend == "cuda"
        devices: list[DeviceSample] = []
        for i in range(b.count):
            nvml_index = nvml.nvml_index(i) if per_device_nvml else None
            if i not in b.contexts and not b.has_context(i):
                devices.append(self._no_context(i, b, nvml_index, full, with_process))
                continue
            try:
                stats = stats_from_nested(b.memory_stats(i))
                mgi = b.mem_get_info(i)
                fraction = float(b.get_fraction(i)) if b.get_fraction is not None else None
                nv = None
                if nvml_index is not None:
                    nv = nvml.read(nvml_index, with_process)
                elif with_process and backend == "cuda":
                    idx = nvml.nvml_index(i)
                    used = nvml.process_used(idx) if idx is not None else None
                    nv = NvmlDevice("", 0, 0, used) if used is not None else None
                name = (
                    self._names.get(i) or (nv.name if nv and nv.name else "")
                ) or self._device_name(t, i)
                devices.append(
                    make_device_sample(
                        index=i,
                        name=name,
                        backend=backend,
                        initialized=True,
                        stats=stats,
                        nvml=nv,
                        mem_get_info=mgi,
                        fraction=fraction,
                        error=nvml.error if full and nv is None and backend == "cuda" else None,
                    )
                )
            except Exception as e:  # a reading must never break the user's cell
                devices.append(
                    DeviceSample(i, self._names.get(i, ""), backend, True, error=repr(e))
                )
        return Reading("ok", "", b.version, self._caching(b), tuple(devices))

    def _no_torch_message(self, devices: tuple[DeviceSample, ...]) -> str:
        msg = str(why_no_gpu(None, state="no_torch"))
        if devices:
            return msg + ": GPU figures come from NVML only"
        if self.nvml.error:
            return f"{msg}; {self.nvml.error}"
        return msg + "; NVML finds no GPU"

    def _nvml_devices(self, with_process: bool) -> tuple[DeviceSample, ...]:
        out = []
        for i, nvml_index in enumerate(self.nvml.visible()):
            nv = self.nvml.read(nvml_index, with_process) if nvml_index is not None else None
            out.append(
                make_device_sample(
                    index=i,
                    name=nv.name if nv else "",
                    backend="nvml",
                    initialized=False,
                    stats=None,
                    nvml=nv,
                    mem_get_info=None,
                    fraction=None,
                    error=None if nv else "MIG instance: no NVML memory figures",
                )
            )
        return tuple(out)

    def replay(self) -> Replay | None:
        return None  # measured here

    # -- peaks and OOMs ------------------------------------------------------------
    def reset_peaks(self, devices: list[int] | None = None) -> None:
        t = self.torch()
        for i in self.initialized_devices() if devices is None else devices:
            t._C._cuda_resetPeakMemoryStats(i)

    def attach_oom_observer(self, callback: Callable[[int, int, int, int], None]) -> bool:
        """Attach once CUDA is up: before, the allocator has no devices to attach to."""
        if self._oom_attached or not self.cuda_ready():
            return self._oom_attached
        attach = getattr(self.torch()._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is not None:
            attach(callback)
        self._oom_attached = True
        return True

    def raw_snapshot(self) -> dict[str, Any] | None:
        """``torch.cuda.memory._snapshot()`` (frames only where history recording is on),
        or None before CUDA is up. Safe inside the OOM observer: PyTorch calls observers
        after it released the allocator's lock."""
        if not self.cuda_ready():
            return None
        return dict(self.torch().cuda.memory._snapshot())

    # -- actions (explicitly asked for by the user) --------------------------------
    def empty_cache(self) -> None:
        t = self.torch()
        if self.cuda_ready():
            t.cuda.empty_cache()

    def actionable(self) -> str | None:
        """Why actions can't run here (no torch, no GPU allocator), or None."""
        why = why_no_gpu(None, self.torch())
        return None if why is None else f"{why}: nothing to act on"

    def caching_supported(self) -> str | None:
        """None when caching can be switched at run time, else why not."""
        t = self.torch()
        why = why_no_gpu(None, t)
        if why is not None:
            return why
        if not hasattr(t._C, "_cuda_cudaCachingAllocator_enable"):
            return (
                f"torch {t.__version__} cannot switch caching at run time (needs torch >= 2.6):"
                f" restart the kernel with {_NO_CACHING_ENV}=1 in its environment instead"
            )
        if os.environ.get(_NO_CACHING_ENV) == "1" and cuda_ready(t):
            return (
                f"{_NO_CACHING_ENV}=1 was set when CUDA started: caching stays off until the"
                " kernel restarts without it"
            )
        return None

    def set_caching(self, enabled: bool) -> bool:
        t = self.torch()
        if not cuda_ready(t):
            t.cuda.init()  # before CUDA init the switch does nothing
        t._C._cuda_cudaCachingAllocator_enable(enabled)
        self._caching_set = enabled
        return bool(_caching_enabled(t, self._caching_set))

    def set_limit(self, device: int, fraction: float) -> None:
        self.torch().cuda.set_per_process_memory_fraction(float(fraction), device)

    def total_for_limit(self, device: int) -> int:
        """The total a fraction is taken of (cudaMemGetInfo's); creates the context."""
        t = self.torch()
        return int(t.cuda.mem_get_info(device)[1])


class _Bound:
    """torch's functions a cell's reading calls, looked up once (after CUDA started: the
    device count is fixed from then on, and ``cudart()`` would start CUDA before)."""

    def __init__(self, t: Any) -> None:
        self.torch = t
        self.version = str(getattr(t, "__version__", "?"))
        self.backend: BackendName = gpu_backend(t)
        # torch >= 2.12 can tell the caching switch; before, the variable torch read once,
        # when CUDA started (the switch we set is remembered by TorchBackend).
        self.caching_fn = getattr(t._C, "_cuda_cudaCachingAllocator_is_enabled", None)
        self.caching_env = os.environ.get(_NO_CACHING_ENV) != "1"
        self.has_ctx = getattr(t._C, "_cuda_hasPrimaryContext", None)
        # Devices seen with a primary context: PyTorch keeps it until the process ends,
        # so the driver is asked only until it has one.
        self.contexts: set[int] = set()
        self.is_initialized = t.cuda.is_initialized
        self.get_fraction = getattr(t._C, "_cuda_getMemoryFraction", None)
        self.memory_stats = t._C._cuda_memoryStats
        self.count = int(t.cuda.device_count())
        cudart = getattr(t.cuda, "cudart", None)
        raw = getattr(cudart(), "cudaMemGetInfo", None) if cudart is not None else None
        # The binding switches to the device itself (torch.cuda.mem_get_info's own path).
        self.mem_get_info = raw if raw is not None else t.cuda.mem_get_info

    def has_context(self, i: int) -> bool:
        """Whether this process has a context on device ``i`` (asked without creating one;
        remembered once it has). Without the binding (old torch), every device counts."""
        if self.has_ctx is None or self.has_ctx(i):
            self.contexts.add(i)
            return True
        return False


def _caching_enabled(t: Any, set_by_us: bool | None = None) -> bool | None:
    """The caching switch. torch >= 2.12 can be asked; before, only what we set is known
    (a call of ``caching_allocator_enable`` by the user's own code is then not seen)."""
    f = getattr(t._C, "_cuda_cudaCachingAllocator_is_enabled", None)
    if f is not None and cuda_ready(t):
        return bool(f())
    if set_by_us is not None:
        return set_by_us
    return os.environ.get(_NO_CACHING_ENV) != "1"


def _other_accelerator(t: Any) -> Reading | None:
    """XPU and other non-CUDA accelerators through ``torch.accelerator`` (torch >= 2.9).

    Read only where that backend reports itself initialised, so no device is started.
    """
    acc_mod = getattr(t, "accelerator", None)
    if acc_mod is None or not hasattr(acc_mod, "memory_stats"):
        return None
    try:
        acc = acc_mod.current_accelerator(check_available=False)
    except Exception:
        return None
    if acc is None or acc.type not in ("xpu", "mps"):
        return None
    backend_mod = getattr(t, acc.type, None)
    is_init = getattr(backend_mod, "is_initialized", None)
    version = str(t.__version__)
    if acc.type == "mps":
        started = backend_mod is not None and bool(backend_mod.current_allocated_memory() or 0)
    else:
        started = bool(is_init()) if callable(is_init) else False
    if not started:
        return Reading(
            "not_initialized",
            f"{acc.type} is not initialised in this kernel yet",
            version,
            None,
            (),
        )
    devices = []
    for i in range(int(acc_mod.device_count())):
        stats = stats_from_flat(acc_mod.memory_stats(i))
        mgi = None
        if hasattr(acc_mod, "get_memory_info"):
            try:
                mgi = tuple(acc_mod.get_memory_info(i))
            except Exception:
                mgi = None
        devices.append(
            make_device_sample(
                index=i,
                name=acc.type,
                backend=acc.type,
                initialized=True,
                stats=stats,
                nvml=None,
                mem_get_info=mgi,
                fraction=None,
            )
        )
    return Reading("ok", "", version, None, tuple(devices))


def cuda_counters(t: Any) -> tuple[Callable[[], list[int]], Callable[[int], int]]:
    """(devices with a CUDA context, allocations + frees so far on a device): the counters
    the hooks of ``--breakdown`` and ``--scan`` stamp their records with."""
    stats = t._C._cuda_memoryStats
    has_ctx = getattr(t._C, "_cuda_hasPrimaryContext", None)

    def devices() -> list[int]:
        if not cuda_ready(t):
            return []
        n = t.cuda.device_count()
        return [i for i in range(n) if has_ctx is None or has_ctx(i)]

    def count(device: int) -> int:
        a = stats(device)["allocation"]["all"]
        return int(a["allocated"]) + int(a["freed"])

    return devices, count
