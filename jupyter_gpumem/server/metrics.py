"""GPU memory per device and per kernel on jupyter_server's ``/metrics`` (Prometheus).

Labels stay bounded: the device's NVML index and UUID, and the kernel id; never a path or
a user name. A scrape serves the last reading (never waiting for NVML on the event loop)
and asks the worker thread for a fresh one, so values are at most about one scrape
interval old; ``jupyter_gpumem_reading_age_seconds`` says how old.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from .cache import GpuCache
from .gpus import gpu_table, kernels_of

DEVICE_LABELS = ["device", "uuid"]
SERIES = {
    "jupyter_gpumem_device_memory_total_bytes": "GPU memory of the device (NVML)",
    "jupyter_gpumem_device_memory_used_bytes": "GPU memory used on the device, all processes "
    "(NVML; includes memory the driver reserves)",
    "jupyter_gpumem_device_processes": "Compute processes on the device",
    "jupyter_gpumem_kernel_memory_used_bytes": "GPU memory a kernel of this server uses on the "
    "device, with its child processes",
    "jupyter_gpumem_other_memory_used_bytes": "GPU memory of processes on the device that are "
    "not kernels of this server (or can't be matched)",
    "jupyter_gpumem_unseen_memory_used_bytes": "GPU memory in use on the device that no "
    "process NVML lists holds: processes outside this server's PID namespace (the driver's "
    "own reservation excluded where NVML reports it)",
    "jupyter_gpumem_driver_reserved_bytes": "GPU memory the driver reserves on the device "
    "(NVML memory info v2; absent on older drivers)",
    "jupyter_gpumem_nvml_up": "1 when NVML answered the last reading",
    "jupyter_gpumem_reading_age_seconds": "Age of the reading these values come from",
}


class GpuMetrics:
    """A prometheus_client collector (``collect`` yields metric families)."""

    def __init__(self, cache: GpuCache, kernel_manager: Any) -> None:
        self.cache = cache
        self.kernel_manager = kernel_manager

    def describe(self) -> list[Any]:
        return []  # no samples at registration time: collect() reads nothing then

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        self.cache.refresh()  # for the next scrape; this one serves the last reading
        reading = self.cache.last

        def family(name: str, labels: list[str] | None = None) -> Any:
            return GaugeMetricFamily(name, SERIES[name], labels=labels)

        up = family("jupyter_gpumem_nvml_up")
        up.add_metric([], 0 if reading is None or (reading.error and not reading.gpus) else 1)
        yield up
        if reading is None:
            return
        age = family("jupyter_gpumem_reading_age_seconds")
        age.add_metric([], max(0.0, time.time() - reading.time))
        yield age
        table = gpu_table(reading, kernels_of(self.kernel_manager))
        total = family("jupyter_gpumem_device_memory_total_bytes", DEVICE_LABELS)
        used = family("jupyter_gpumem_device_memory_used_bytes", DEVICE_LABELS)
        procs = family("jupyter_gpumem_device_processes", DEVICE_LABELS)
        kernel = family("jupyter_gpumem_kernel_memory_used_bytes", [*DEVICE_LABELS, "kernel_id"])
        other = family("jupyter_gpumem_other_memory_used_bytes", DEVICE_LABELS)
        unseen = family("jupyter_gpumem_unseen_memory_used_bytes", DEVICE_LABELS)
        reserved = family("jupyter_gpumem_driver_reserved_bytes", DEVICE_LABELS)
        for d in table["devices"]:
            labels = [str(d["index"]), d["uuid"]]
            total.add_metric(labels, d["total"])
            used.add_metric(labels, d["used"])
            procs.add_metric(labels, len(d["processes"]))
            per_kernel: dict[str, int] = {}
            for p in d["processes"]:
                if p["kernel_id"] is not None:
                    per_kernel[p["kernel_id"]] = per_kernel.get(p["kernel_id"], 0) + p["used"]
            for kid, b in sorted(per_kernel.items()):
                kernel.add_metric([*labels, kid], b)
            other.add_metric(
                labels, sum(p["used"] for p in d["processes"] if p["kernel_id"] is None)
            )
            if d["unseen"] is not None:
                unseen.add_metric(labels, d["unseen"])
            if d["driver_reserved"] is not None:
                reserved.add_metric(labels, d["driver_reserved"])
        yield from (total, used, procs, kernel, other, unseen, reserved)


_REGISTERED: list[GpuMetrics] = []


def register(metrics: GpuMetrics) -> None:
    """Put ``metrics`` on the default registry that ``/metrics`` serves (once per process:
    a server started again in the same process replaces the earlier one)."""
    from prometheus_client import REGISTRY

    for old in _REGISTERED:
        try:
            REGISTRY.unregister(old)
        except KeyError:
            pass
    _REGISTERED[:] = [metrics]
    REGISTRY.register(metrics)
