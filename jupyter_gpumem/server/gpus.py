"""Which notebook holds each GPU: NVML's processes, matched with this server's kernels.

Plain records and pure functions: :func:`read_gpus` talks to NVML and the process table
(never on the server's event loop: it can take milliseconds), :func:`kernels_of` reads
the kernel manager, and :func:`gpu_table` joins them into the JSON that
``GET /api/gpumem/devices`` returns and the metrics are made from.

PIDs: NVML reports PIDs of the PID namespace the driver sees (the host's). In a container
without the host's PID namespace they are not this server's PIDs: a PID that does not exist
here, or whose process has another name than NVML says, means the namespaces differ. Then
nothing is mapped to kernels (a wrong match would blame the wrong notebook) and the reply
says why.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..collectors.nvml import Nvml
from .kernel_figures import Reported


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used: int  # bytes on this device
    nvml_name: str | None  # as the driver knows it


@dataclass(frozen=True, slots=True)
class Gpu:
    nvml_index: int
    cuda_index: int | None  # under this server's CUDA_VISIBLE_DEVICES (kernels inherit it)
    uuid: str
    name: str
    total: int
    used: int  # NVML v1: total minus free, the driver's reservation included
    processes: tuple[GpuProcess, ...]
    reserved: int | None = None  # what the driver reserves (NVML v2); None: not told
    listed: bool = True  # NVML listed the processes (False: the call failed)

    @property
    def unseen(self) -> int | None:
        """Memory in use that no listed process holds: processes this server cannot see
        (outside its PID namespace), not counting the driver's reservation when NVML
        says what it is (otherwise it is included). None when NVML listed no processes."""
        if not self.listed:
            return None
        held = sum(p.used for p in self.processes)
        return max(0, self.used - (self.reserved or 0) - held)


@dataclass(frozen=True, slots=True)
class LocalProcess:
    """What the process table shows about a PID (as `ps` shows it to this user)."""

    pid: int
    name: str
    user: str | None  # None: not readable
    parents: tuple[int, ...]  # parent, grandparent, ... (for children of kernels)
    started: float  # create time: tells a reused PID


@dataclass(frozen=True, slots=True)
class KernelInfo:
    id: str
    name: str
    pid: int | None  # None: not a local process (remote provisioner, gateway)
    path: str | None  # the notebook or console, from the session manager
    execution_state: str
    last_activity: str | None  # ISO time
    connections: int


@dataclass
class GpuReading:
    """Everything read from NVML and the process table at one instant."""

    time: float
    gpus: list[Gpu] = field(default_factory=list)
    local: dict[int, LocalProcess] = field(default_factory=dict)
    driver: str | None = None
    error: str | None = None  # NVML unavailable or failing: a reason

    @property
    def namespace(self) -> str:
        """ "shared": NVML's PIDs are this server's; "foreign": they are not (a PID here runs
        another program, or none of them exists here); "unknown": no process to tell by.
        A PID that ended between NVML's answer and ours is neither."""
        nvml = [p for g in self.gpus for p in g.processes]
        if not nvml:
            return "unknown"
        present = [p for p in nvml if p.pid in self.local]
        if not present:
            return "foreign"
        if any(not _same_program(p.nvml_name, self.local[p.pid].name) for p in present):
            return "foreign"
        return "shared"


def _same_program(nvml_name: str | None, local_name: str) -> bool:
    if not nvml_name:
        return True  # NVML gave no name: nothing contradicts the PID
    base = os.path.basename(nvml_name.split()[0]) if nvml_name.split() else nvml_name
    return base[:15] == local_name[:15] or local_name in base or base in local_name


def read_gpus(nvml: Nvml) -> GpuReading:
    """NVML devices and their processes, and the process table entries of those PIDs."""
    reading = GpuReading(time=time.time())
    if not nvml.available:
        reading.error = nvml.error or "NVML unavailable"
        return reading
    reading.driver = nvml.driver()
    visible = {n: i for i, n in enumerate(nvml.visible()) if n is not None}
    found: list[tuple[int, tuple[str, str], Any, list[tuple[int, int]] | None]] = []
    for index in range(nvml.count()):
        identity = nvml.identity(index)
        memory = nvml.read(index, with_process=False)
        if identity is None or memory is None:
            reading.error = nvml.error
            continue
        found.append((index, identity, memory, nvml.listed_processes(index)))
    pids = {pid for *_, procs in found for pid, _ in procs or ()}
    nvml.forget_processes(pids)
    ppids: dict[int, int | None] = {}  # shared by the lookups: siblings share ancestors
    reading.local = {pid: lp for pid in pids if (lp := local_process(pid, ppids)) is not None}
    for index, (name, uuid), memory, procs in found:
        processes = tuple(
            GpuProcess(pid, used, nvml.process_name(pid, _started(reading.local.get(pid))))
            for pid, used in procs or ()
        )
        reading.gpus.append(
            Gpu(
                index,
                visible.get(index),
                uuid,
                name,
                memory.total,
                memory.used,
                processes,
                nvml.reserved(index),
                procs is not None,
            )
        )
    if nvml.error and reading.error is None:
        reading.error = nvml.error  # a call failed part way: say so beside what was read
    return reading


def _started(local: LocalProcess | None) -> float | None:
    return local.started if local is not None else None


def local_process(pid: int, ppids: dict[int, int | None] | None = None) -> LocalProcess | None:
    """The process table's entry for a PID, or None (it ended, or is not visible here).
    ``ppids`` remembers parent PIDs across lookups of one reading."""
    import psutil

    try:
        p = psutil.Process(pid)
        with p.oneshot():
            name = p.name()
            try:
                user: str | None = p.username()
            except (psutil.AccessDenied, KeyError):
                user = None
            ppid = p.ppid()
            started = p.create_time()
    except Exception:  # NoSuchProcess, AccessDenied, ZombieProcess: it may have just ended
        return None
    memo = ppids if ppids is not None else {}
    memo[pid] = ppid
    parents: list[int] = []
    while ppid and ppid not in parents and len(parents) < 64:
        parents.append(ppid)
        if ppid not in memo:
            try:
                memo[ppid] = psutil.Process(ppid).ppid()
            except Exception:
                memo[ppid] = None
        ppid = memo[ppid]
    return LocalProcess(pid, name, user, tuple(parents), started)


def kernels_of(kernel_manager: Any, paths: Mapping[str, str] | None = None) -> list[KernelInfo]:
    """The server's running kernels with their PIDs (local provisioners) and paths."""
    out = []
    for kid in list(kernel_manager.list_kernel_ids()):
        try:
            model = kernel_manager.kernel_model(kid)
            km = kernel_manager.get_kernel(kid)
        except Exception:  # it just shut down
            continue
        provisioner = getattr(km, "provisioner", None)
        pid = getattr(provisioner, "pid", None)
        if pid is None:
            process = getattr(provisioner, "process", None)
            pid = getattr(process, "pid", None)
        out.append(
            KernelInfo(
                id=kid,
                name=str(model.get("name", "")),
                pid=int(pid) if pid else None,
                path=(paths or {}).get(kid),
                execution_state=str(model.get("execution_state", "unknown")),
                last_activity=model.get("last_activity"),
                connections=int(model.get("connections", 0) or 0),
            )
        )
    return out


def gpu_table(
    reading: GpuReading,
    kernels: Sequence[KernelInfo],
    reported: Mapping[str, Reported] | None = None,
) -> dict[str, Any]:
    """The reply of ``GET /api/gpumem/devices`` (docs/server.md). ``reported``: what
    kernels said they hold (asked when NVML's PIDs are foreign), by kernel id."""
    namespace = reading.namespace
    reported = reported or {}
    mapped = namespace != "foreign"
    by_pid = {k.pid: k for k in kernels if k.pid is not None}
    kernel_use: dict[str, dict[str, Any]] = {}
    devices = [_device_row(g, reading, mapped, by_pid, kernel_use, reported) for g in reading.gpus]
    kernel_rows = [_kernel_row(k, kernel_use.get(k.id), reported.get(k.id)) for k in kernels]
    return {
        "version": 1,
        "time": reading.time,
        "nvml": {
            "available": reading.error is None or bool(reading.gpus),
            "driver": reading.driver,
            "error": reading.error,
        },
        "pid_namespace": namespace,
        "note": _foreign_note(reported) if namespace == "foreign" else None,
        "devices": devices,
        "kernels": kernel_rows,
    }


def _device_row(
    g: Gpu,
    reading: GpuReading,
    mapped: bool,
    by_pid: Mapping[int, KernelInfo],
    kernel_use: dict[str, dict[str, Any]],
    reported: Mapping[str, Reported],
) -> dict[str, Any]:
    """One device of the reply: its processes, largest first, each matched with the kernel
    it is or descends from (``mapped``: NVML's PIDs are this server's), and what the
    notebooks reported for it. Adds each kernel's use to ``kernel_use``."""
    processes = []
    for p in g.processes:
        local = reading.local.get(p.pid) if mapped else None
        kernel, parent = _owner(p.pid, local, by_pid) if local is not None else (None, None)
        role = "kernel" if kernel and parent is None else "child" if kernel else "other"
        if mapped and local is None:
            role = "ended"  # gone between NVML's answer and the process table's
        entry: dict[str, Any] = {
            "pid": p.pid,
            "name": local.name if local else p.nvml_name,
            "user": local.user if local else None,
            "used": p.used,
            "kernel_id": kernel.id if kernel else None,
            "role": role,
        }
        if kernel is not None:
            use = kernel_use.setdefault(kernel.id, {"used": 0, "devices": {}, "children": {}})
            use["used"] += p.used
            use["devices"][g.nvml_index] = use["devices"].get(g.nvml_index, 0) + p.used
            if parent is not None:
                use["children"][p.pid] = use["children"].get(p.pid, 0) + p.used
        processes.append(entry)
    processes.sort(key=lambda e: -e["used"])
    notebooks = [
        {
            "kernel_id": kid,
            "reserved": d.reserved,
            "allocated": d.allocated,
            "time": r.time,
        }
        for kid, r in sorted(reported.items())
        for d in r.devices
        if g.cuda_index is not None and d.index == g.cuda_index and d.name == g.name
    ]
    return {
        "index": g.nvml_index,
        "cuda_index": g.cuda_index,
        "uuid": g.uuid,
        "name": g.name,
        "total": g.total,
        "used": g.used,
        "driver_reserved": g.reserved,
        "unseen": g.unseen,
        "processes": processes,
        "reported": notebooks,
    }


def _kernel_row(
    k: KernelInfo, use: dict[str, Any] | None, reported: Reported | None
) -> dict[str, Any]:
    """One kernel of the reply, with what its processes use on each device (``use``:
    from :func:`_device_row`; None: nothing) and what it reported."""
    if use is None:
        use = {"used": 0, "devices": {}, "children": {}}
    return {
        "id": k.id,
        "name": k.name,
        "pid": k.pid,
        "path": k.path,
        "execution_state": k.execution_state,
        "last_activity": k.last_activity,
        "connections": k.connections,
        "gpu_used": use["used"],
        "devices": [{"index": i, "used": b} for i, b in sorted(use["devices"].items())],
        "children": [{"pid": pid, "used": b} for pid, b in sorted(use["children"].items())],
        "reported": _reported(reported),
    }


def _foreign_note(reported: Mapping[str, Reported]) -> str:
    """Why processes are not matched with notebooks when NVML's PIDs are foreign."""
    note = (
        "NVML reports processes by PIDs this server can't match (a container without the "
        "host's PID namespace?): they are listed by the PID and name NVML gives and are "
        "not matched with notebooks"
    )
    if reported:
        note += (
            f"; {len(reported)} notebook(s) with jupyter_gpumem loaded said what PyTorch "
            "holds for them (reported)"
        )
    return note


def _reported(r: Reported | None) -> dict[str, Any] | None:
    if r is None:
        return None
    return {
        "time": r.time,
        "devices": [
            {
                "cuda_index": d.index,
                "name": d.name,
                "reserved": d.reserved,
                "allocated": d.allocated,
            }
            for d in r.devices
        ],
    }


def _owner(
    pid: int, local: LocalProcess, by_pid: Mapping[int, KernelInfo]
) -> tuple[KernelInfo | None, int | None]:
    """(kernel, None) for a kernel process; (kernel, its pid) for a kernel's descendant."""
    if pid in by_pid:
        return by_pid[pid], None
    for parent in local.parents:
        if parent in by_pid:
            return by_pid[parent], parent
    return None, None


def session_paths(sessions: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """kernel id -> notebook/console path, from the session manager's list."""
    out = {}
    for s in sessions:
        kernel = s.get("kernel") or {}
        if kernel.get("id") and s.get("path") is not None:
            out[kernel["id"]] = str(s["path"])
    return out
