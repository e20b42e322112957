"""One reading of NVML and the process table shared by the REST endpoint and the metrics,
taken on a worker thread and kept for a short time: reading NVML can take milliseconds
(more on a busy driver) and must never block the server's event loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from ..collectors.nvml import Nvml
from .gpus import GpuReading, read_gpus


class GpuCache:
    def __init__(self, ttl: float = 1.0, reader: Callable[[], GpuReading] | None = None) -> None:
        self.ttl = ttl
        self._nvml = Nvml(pid=0)
        self._reader = reader or (lambda: read_gpus(self._nvml))
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpumem-nvml")
        self._lock = threading.Lock()
        self._last: GpuReading | None = None
        self._pending: Future[GpuReading] | None = None

    @property
    def last(self) -> GpuReading | None:
        return self._last

    def _read(self) -> GpuReading:
        try:
            reading = self._reader()
        except Exception as e:  # NVML errors are values: the reply says what went wrong
            reading = GpuReading(time=time.time(), error=f"NVML: {e}")
        with self._lock:
            self._last = reading
            self._pending = None
        return reading

    def refresh(self) -> Future[GpuReading]:
        """A reading no older than ``ttl``: the cached one, or one being taken (one at a
        time, on the worker thread)."""
        with self._lock:
            last = self._last
            if last is not None and time.time() - last.time < self.ttl:
                done: Future[GpuReading] = Future()
                done.set_result(last)
                return done
            if self._pending is None:
                self._pending = self._pool.submit(self._read)
            return self._pending

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
