"""NVML: device-level figures that exist without a CUDA context.

NVML numbers GPUs in PCI order and ignores ``CUDA_VISIBLE_DEVICES``; torch numbers them
after it. :func:`parse_visible_devices` and :meth:`Nvml.nvml_index` map a torch index to an
NVML index the way torch's own ``_get_nvml_device_index`` does (integers and ``GPU-`` UUID
prefixes; MIG instances have no NVML memory figures of their own), without importing torch.
NVML never creates a CUDA context, so reading it changes nothing in the user's program.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import threading
from dataclasses import dataclass
from typing import Any

from .plugins import NVML_ENV, plugged


def _strtoul(s: str) -> int:
    """Leading unsigned integer of ``s`` as C's strtoul reads it, or -1."""
    digits = ""
    for i, c in enumerate(s):
        if c.isdigit() or (i == 0 and c in "+-"):
            digits += c
        else:
            break
    try:
        return int(digits)
    except ValueError:
        return -1


def parse_visible_devices(value: str | None) -> list[int] | list[str]:
    """Parse ``CUDA_VISIBLE_DEVICES`` like the CUDA runtime (and torch) does.

    ``None`` (unset) means every device. An invalid entry ends the list; a repeated entry
    makes it empty. Returns integers, or ``GPU-``/``MIG-`` prefixed UUID strings.
    """
    if value is None:
        return list(range(64))
    if value.startswith(("GPU-", "MIG-")):
        prefix = value[:4]
        uuids: list[str] = []
        for elem in value.split(","):
            if elem in uuids:
                return []
            if not elem.startswith(prefix):
                break
            uuids.append(elem)
        return uuids
    ordinals: list[int] = []
    for elem in value.split(","):
        x = _strtoul(elem.strip())
        if x in ordinals:
            return []
        if x < 0:
            break
        ordinals.append(x)
    return ordinals


def uuids_to_ordinals(candidates: list[str], uuids: list[str]) -> list[int]:
    """Resolve (possibly abbreviated) UUIDs to NVML indices; ambiguity ends the list."""
    out: list[int] = []
    for cand in candidates:
        matches = [i for i, u in enumerate(uuids) if u.startswith(cand)]
        if len(matches) != 1:
            break
        if matches[0] in out:
            return []
        out.append(matches[0])
    return out


@dataclass(frozen=True, slots=True)
class NvmlDevice:
    name: str
    total: int
    used: int  # all processes, as nvidia-smi shows it (includes driver-reserved memory)
    process_used: int | None  # this process; None when NVML does not list it
    children: tuple[tuple[int, int], ...] = ()  # (pid, bytes) of this process's descendants


class _ComputeProcesses:
    """``nvmlDeviceGetComputeRunningProcesses`` in one driver call, as (pid, bytes) pairs.

    pynvml's call asks the driver twice (once for the count, once for the list) and turns
    each entry into a Python object field by field: 30-65 us on an H100 for this process
    alone, twice a full ``%%gpumem`` cell. Here a kept array is filled in one call (a
    second one only when more processes than it holds are listed), read as plain pairs.
    Built only from pynvml's own function pointer and structure; where those are missing
    (another NVML implementation, an older binding) :meth:`Nvml.compute_processes` uses
    the public call instead.
    """

    def __init__(self, nvml: Any) -> None:
        self._fn = nvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
        self._struct = nvml.c_nvmlProcessInfo_v3_t
        self._error = nvml.NVMLError
        self._ok, self._short = nvml.NVML_SUCCESS, nvml.NVML_ERROR_INSUFFICIENT_SIZE
        self._na = nvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
        self._count = ctypes.c_uint(0)
        self._size = 16
        self._array = (self._struct * self._size)()
        self._lock = threading.Lock()  # the array is shared: the panel's thread reads too

    def __call__(self, handle: Any) -> list[tuple[int, int | None]]:
        with self._lock:
            for _ in range(4):  # processes may start between two calls: retry a few times
                self._count.value = self._size
                ret = self._fn(handle, ctypes.byref(self._count), self._array)
                if ret == self._ok:
                    na, arr = self._na, self._array
                    return [
                        (p.pid, None if p.usedGpuMemory == na else p.usedGpuMemory)
                        for p in arr[: self._count.value]
                    ]
                if ret != self._short:
                    raise self._error(ret)
                self._size = self._count.value * 2 + 16
                self._array = (self._struct * self._size)()
            raise self._error(ret)


class Nvml:
    """Lazy NVML session. Every failure becomes ``self.error`` (a reason), never a raise."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}
        self._names: dict[int, str] = {}
        self.error: str | None = None
        self._started = False
        self._visible: tuple[str | None, list[int | None]] | None = None
        self._identities: dict[int, tuple[str, str]] = {}
        self._process_names: dict[int, tuple[float, str | None]] = {}
        self._descendants: dict[int, tuple[float, bool]] = {}
        self._no_v2: set[int] = set()  # devices whose driver has no memory info v2
        self._processes: Any = None  # _ComputeProcesses, or pynvml's public call

    def _start(self) -> bool:
        if self._started:
            return self._nvml is not None
        self._started = True
        try:
            nvml: Any = plugged(NVML_ENV)  # another implementation of the same calls
            if nvml is None:
                nvml = importlib.import_module("pynvml")  # from nvidia-ml-py
            nvml.nvmlInit()
        except ImportError:
            self.error = "NVML unavailable: the nvidia-ml-py package is not installed"
            return False
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.error = f"NVML unavailable: {e}"
            return False
        self._nvml = nvml
        try:
            self._processes = _ComputeProcesses(nvml)
        except Exception:  # no such internals here: the public call, entries as pairs
            self._processes = lambda h: [
                (p.pid, p.usedGpuMemory) for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)
            ]
        return True

    def compute_processes(self, nvml_index: int) -> list[tuple[int, int | None]]:
        """(pid, bytes or None when the driver can't tell) of each compute process NVML
        lists on one device, in NVML's order. Raises NVML's error."""
        out: list[tuple[int, int | None]] = self._processes(self._handle(nvml_index))
        return out

    @property
    def available(self) -> bool:
        return self._start()

    def count(self) -> int:
        if not self._start():
            return 0
        try:
            return int(self._nvml.nvmlDeviceGetCount())
        except Exception as e:
            self.error = f"NVML: {e}"
            return 0

    def visible(self) -> list[int | None]:
        """NVML index of each device the CUDA runtime shows this process, in torch order.

        ``None`` for a device NVML can't give figures for (a MIG instance).
        """
        if not self._start():
            return []
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        if self._visible is not None and self._visible[0] == env:
            return self._visible[1]
        vis = self._map_visible()
        self._visible = (env, vis)
        return vis

    def _map_visible(self) -> list[int | None]:
        n = self.count()
        parsed = parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
        if parsed and isinstance(parsed[0], str):
            strs = [str(p) for p in parsed]
            if strs[0].startswith("MIG-"):
                return [None] * len(strs)
            uuids = [self._uuid(i) for i in range(n)]
            return list(uuids_to_ordinals(strs, uuids))
        out: list[int | None] = []
        for p in parsed:
            if not isinstance(p, int) or p >= n:
                break
            out.append(p)
        return out

    def nvml_index(self, torch_index: int) -> int | None:
        vis = self.visible()
        return vis[torch_index] if 0 <= torch_index < len(vis) else None

    def _handle(self, nvml_index: int) -> Any:
        h = self._handles.get(nvml_index)
        if h is None:
            h = self._nvml.nvmlDeviceGetHandleByIndex(nvml_index)
            self._handles[nvml_index] = h
        return h

    def _uuid(self, nvml_index: int) -> str:
        u = self._nvml.nvmlDeviceGetUUID(self._handle(nvml_index))
        return u.decode() if isinstance(u, bytes) else str(u)

    def process_used(self, nvml_index: int) -> int | None:
        """This process's memory on one device (17-60 us), or None when NVML doesn't list it
        (no context there, or a container whose PIDs NVML can't see). Other processes are
        not looked at (telling descendants reads /proc for each)."""
        if not self._start():
            return None
        try:
            pid = self.pid
            for p, used in self.compute_processes(nvml_index):
                if p == pid and used is not None:
                    return int(used)
        except Exception as e:
            self.error = f"NVML: {e}"
        return None

    def _mine(self, nvml_index: int) -> tuple[int | None, tuple[tuple[int, int], ...]]:
        """This process's memory on a device, and its descendants' (multi-process training
        started from a notebook: torch.multiprocessing, a launcher's ranks)."""
        if not self._start():
            return None, ()
        own: int | None = None
        children: list[tuple[int, int]] = []
        try:
            for pid, used in self.compute_processes(nvml_index):
                if used is None:
                    continue
                if pid == self.pid:
                    own = int(used)
                elif self._descends(int(pid)):
                    children.append((int(pid), int(used)))
        except Exception as e:
            self.error = f"NVML: {e}"
        return own, tuple(children)

    def _descends(self, pid: int) -> bool:
        """Whether ``pid`` is a descendant of this process (remembered per PID and start
        time; a PID NVML reports from another PID namespace is no descendant of ours)."""
        try:
            import psutil

            proc = psutil.Process(pid)
            started = proc.create_time()
        except Exception:
            return False
        known = self._descendants.get(pid)
        if known is not None and known[0] == started:
            return known[1]
        try:
            mine = any(a.pid == self.pid for a in proc.parents())
        except Exception:
            mine = False
        if len(self._descendants) > 4096:
            self._descendants.clear()
        self._descendants[pid] = (started, mine)
        return mine

    def identity(self, nvml_index: int) -> tuple[str, str] | None:
        """(name, UUID) of a device (asked once: they don't change), or None."""
        if not self._start():
            return None
        known = self._identities.get(nvml_index)
        if known is not None:
            return known
        try:
            h = self._handle(nvml_index)
            raw = self._nvml.nvmlDeviceGetName(h)
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
            known = self._identities[nvml_index] = (name, self._uuid(nvml_index))
            return known
        except Exception as e:
            self.error = f"NVML: {e}"
            return None

    def process_name(self, pid: int, started: float | None = None) -> str | None:
        """The name NVML (the driver) knows a process by, or None. With ``started`` (the
        process's start time, which tells a reused PID) the answer is remembered until
        ``forget_processes`` drops the PIDs that left the GPUs."""
        if not self._start():
            return None
        known = self._process_names.get(pid)
        if started is not None and known is not None and known[0] == started:
            return known[1]
        try:
            raw = self._nvml.nvmlSystemGetProcessName(pid)
            name = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        except Exception:
            name = ""
        if started is not None:
            self._process_names[pid] = (started, name or None)
        return name or None

    def forget_processes(self, keep: set[int]) -> None:
        for pid in [p for p in self._process_names if p not in keep]:
            del self._process_names[pid]

    def driver(self) -> str | None:
        if not self._start():
            return None
        try:
            raw = self._nvml.nvmlSystemGetDriverVersion()
        except Exception:
            return None
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def processes(self, nvml_index: int) -> list[tuple[int, int]]:
        """(pid, bytes) of every compute process NVML lists on one device; empty when NVML
        can't tell. PIDs are those of NVML's PID namespace (the host's, in containers
        that hide it)."""
        return self.listed_processes(nvml_index) or []

    def listed_processes(self, nvml_index: int) -> list[tuple[int, int]] | None:
        """As :meth:`processes`, but None when NVML could not list them."""
        if not self._start():
            return None
        out: dict[int, int] = {}
        try:
            for pid, used in self.compute_processes(nvml_index):
                if used is not None:
                    out[int(pid)] = out.get(int(pid), 0) + int(used)
        except Exception as e:
            self.error = f"NVML: {e}"
            return None
        return sorted(out.items())

    def reserved(self, nvml_index: int) -> int | None:
        """What the driver itself reserves on the device (NVML's memory info v2: firmware,
        ECC, page tables), part of ``used``; None where the driver or binding can't tell."""
        if not self._start() or nvml_index in self._no_v2:
            return None
        v2 = getattr(self._nvml, "nvmlMemory_v2", None)
        if v2 is None:
            self._no_v2.add(nvml_index)
            return None
        try:
            mem = self._nvml.nvmlDeviceGetMemoryInfo(self._handle(nvml_index), version=v2)
            return int(mem.reserved)
        except Exception:  # older drivers: NVML_ERROR_FUNCTION_NOT_FOUND; not an error
            self._no_v2.add(nvml_index)
            return None

    def read(self, nvml_index: int, with_process: bool = True) -> NvmlDevice | None:
        if not self._start():
            return None
        try:
            h = self._handle(nvml_index)
            name = self._names.get(nvml_index)
            if name is None:
                raw = self._nvml.nvmlDeviceGetName(h)
                name = raw.decode() if isinstance(raw, bytes) else str(raw)
                self._names[nvml_index] = name
            mem = self._nvml.nvmlDeviceGetMemoryInfo(h)
            process_used, children = self._mine(nvml_index) if with_process else (None, ())
            return NvmlDevice(name, int(mem.total), int(mem.used), process_used, children)
        except Exception as e:
            self.error = f"NVML: {e}"
            return None
