"""Test-only stand-in for ``pynvml`` (nvidia-ml-py), at the NVML call boundary.

Plugged in like any NVML, by import path: ``JUPYTER_GPUMEM_NVML=
jupyter_gpumem.testing.fake_nvml:from_env`` with ``JUPYTER_GPUMEM_FAKE_NVML=<file.json>``
(:data:`ENV` sets both): server tests on machines
without a GPU describe GPUs and the processes on them (real PIDs of kernels they started),
and benchmarks add latency to every call. The file is read again at each
``nvmlDeviceGetCount`` / ``GetComputeRunningProcesses``, so a test can change it.

    {"driver": "fake", "latency_ms": 0,
     "devices": [{"name": "NVIDIA H200", "uuid": "GPU-...", "total": 150e9, "used": 2e9,
                  "reserved": 5e8,
                  "processes": [{"pid": 1234, "used": 2147483648, "name": "python"}]}]}

``used`` is what NVML's memory info v1 says (total minus free, the driver's reservation
included); ``reserved`` (optional) answers v2, as newer drivers do.

``"fail": "nvmlDeviceGetComputeRunningProcesses"`` makes that call raise NVMLError.
"""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace
from typing import Any

FAKE_ENV = "JUPYTER_GPUMEM_FAKE_NVML"


def env(path: str) -> dict[str, str]:
    """The environment that makes a process use the fake NVML described in ``path``."""
    return {"JUPYTER_GPUMEM_NVML": "jupyter_gpumem.testing.fake_nvml:from_env", FAKE_ENV: path}


def from_env() -> FakeNvml:
    path = os.environ.get(FAKE_ENV)
    if not path:
        raise RuntimeError(f"{FAKE_ENV} must name a file describing the fake GPUs")
    return FakeNvml(path)


class NVMLError(Exception):
    pass


class FakeNvml:
    NVMLError = NVMLError

    def __init__(self, path: str) -> None:
        self.path = path
        self._data: dict[str, Any] = {}
        self._stamp = -1
        self._load()

    def _load(self) -> dict[str, Any]:
        stamp = os.stat(self.path).st_mtime_ns  # read again only when the test changed it
        if stamp != self._stamp:
            with open(self.path) as f:
                self._data = json.load(f)
            self._stamp = stamp
        return self._data

    def _call(self, name: str) -> dict[str, Any]:
        data = self._data
        delay = float(data.get("latency_ms", 0)) / 1000
        if delay:
            time.sleep(delay)
        if data.get("fail") == name:
            raise NVMLError(f"{name} failed (fake)")
        return data

    # The names are pynvml's.
    def nvmlInit(self) -> None:
        self._call("nvmlInit")

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self._call("nvmlSystemGetDriverVersion").get("driver", "fake"))

    def nvmlDeviceGetCount(self) -> int:
        self._load()
        return len(self._call("nvmlDeviceGetCount")["devices"])

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        self._call("nvmlDeviceGetHandleByIndex")
        return i

    def _device(self, h: int, name: str) -> dict[str, Any]:
        return dict(self._call(name)["devices"][h])

    def nvmlDeviceGetName(self, h: int) -> str:
        return str(self._device(h, "nvmlDeviceGetName")["name"])

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return str(self._device(h, "nvmlDeviceGetUUID")["uuid"])

    nvmlMemory_v2 = 0x02000028  # pynvml's value: sizeof(c_nvmlMemory_v2_t) | 2 << 24

    def nvmlDeviceGetMemoryInfo(self, h: int, version: int | None = None) -> Any:
        """v1: used includes what the driver reserves; v2 (a device with "reserved"): used
        without it, reserved apart. A device without "reserved" acts as an older driver."""
        d = self._device(h, "nvmlDeviceGetMemoryInfo")
        total, used = int(d["total"]), int(d["used"])
        if version is None:
            return SimpleNamespace(total=total, used=used, free=total - used)
        if "reserved" not in d:
            raise NVMLError("Function Not Found (fake: no memory info v2)")
        reserved = int(d["reserved"])
        return SimpleNamespace(
            total=total, reserved=reserved, free=total - used, used=used - reserved
        )

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        self._load()
        d = self._device(h, "nvmlDeviceGetComputeRunningProcesses")
        return [
            SimpleNamespace(pid=int(p["pid"]), usedGpuMemory=p.get("used"))
            for p in d.get("processes", [])
        ]

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        for d in self._call("nvmlSystemGetProcessName")["devices"]:
            for p in d.get("processes", []):
                if int(p["pid"]) == pid:
                    return str(p.get("name", ""))
        raise NVMLError("Not Found")
