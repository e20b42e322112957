"""The collector and the backend it reads: one :class:`~jupyter_gpumem.model.Measurement`
at a time.

:class:`Backend` is what a source of GPU figures provides (the real one is
:class:`~.allocator.TorchBackend`: torch and NVML; tests and demos plug a recorded one in
through ``JUPYTER_GPUMEM_BACKEND``, :mod:`.plugins`). :class:`Collector` turns a
backend's reading into a ``Measurement`` (adding the clocks, the host's memory and the
workers alive, from the :class:`WorkerSource` s it is given: the front end composes them,
``collectors/worker_sources.py``) and keeps the OOMs the allocator reported.
``Collector.measure()`` runs twice a measured cell: it stays a lock, one reading and one record.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from ..log import logger
from ..model import Measurement, OomEvent, Replay, WorkerReport
from .allocator import Reading, TorchBackend
from .host import host_rss
from .plugins import BACKEND_ENV, plugged


class Backend(Protocol):
    """What the collector and the actions need from a source of GPU figures."""

    def read(self, with_process: bool = True, full: bool = True) -> Reading: ...
    def initialized_devices(self) -> list[int]: ...
    def device_count(self) -> int: ...
    def reset_peaks(self, devices: list[int] | None = None) -> None: ...
    def attach_oom_observer(self, callback: Callable[[int, int, int, int], None]) -> bool:
        """Attach ``callback`` if it can be; True once it is for good (the collector then
        stops asking), False to be asked again at the next reading."""
        ...

    def cuda_ready(self) -> bool: ...
    def empty_cache(self) -> None: ...
    def caching_supported(self) -> str | None: ...
    def set_caching(self, enabled: bool) -> bool: ...
    def set_limit(self, device: int, fraction: float) -> None: ...
    def total_for_limit(self, device: int) -> int: ...
    def actionable(self) -> str | None:
        """Why actions (empty_cache, caps, caching) can't run here, or None."""
        ...

    def replay(self) -> Replay | None:
        """Where the figures were recorded when they are replayed from a recording; None
        when they are measured here. Asked once per backend (every measurement carries it)."""
        ...


class WorkerSource(Protocol):
    """Where a full reading learns of other processes: the workers alive now. Called at
    each full reading (the panel's sample, ``%gpumem``), never at a cell's brackets."""

    def __call__(self) -> tuple[WorkerReport, ...]: ...


def make_backend() -> Backend:
    """The real backend (torch and NVML), or the one ``JUPYTER_GPUMEM_BACKEND`` names."""
    backend: Backend | None = plugged(BACKEND_ENV)
    return backend if backend is not None else TorchBackend()


class Collector:
    """Takes measurements; remembers the OOMs the allocator reported."""

    def __init__(
        self,
        backend: Backend | None = None,
        max_ooms: int = 100,
        *,
        workers: Sequence[WorkerSource] = (),
    ) -> None:
        self.backend: Backend = backend if backend is not None else make_backend()
        # asked in this order at each full reading (none: no workers in the readings)
        self.workers: tuple[WorkerSource, ...] = tuple(workers)
        self.ooms: deque[OomEvent] = deque(maxlen=max_ooms)
        self.oom_count = 0  # total seen, also past maxlen
        self._lock = threading.Lock()  # the panel's thread and the cell hooks both measure
        self._observed: Backend | None = None  # the backend our OOM observer is attached to
        self._replay: Replay | None = None
        self._replay_of: Backend | None = None  # the backend _replay was asked of
        # Called after each OOM event is kept (a worker's reporter writes its snapshot
        # there): inside the allocator's failure path, so it must be short; its errors
        # are swallowed.
        self.on_oom: Callable[[OomEvent], None] | None = None

    @property
    def replay(self) -> Replay | None:
        """Where the backend's figures were recorded, when it replays a recording."""
        backend = self.backend
        if self._replay_of is not backend:
            self._ask_replay(backend)
        return self._replay

    def _ask_replay(self, backend: Backend) -> None:
        # A backend plugged in by import path may predate the method: it measures.
        ask = getattr(backend, "replay", None)
        self._replay = ask() if callable(ask) else None
        self._replay_of = backend

    def _on_oom(self, device: int, requested: int, allowed: int, free: int) -> None:
        # Called by the allocator just before it raises OutOfMemoryError: keep it tiny.
        event = OomEvent(int(device), int(requested), int(allowed), int(free))
        self.ooms.append(event)
        self.oom_count += 1
        hook = self.on_oom
        if hook is not None:
            try:
                hook(event)
            except Exception:  # never in the way of the allocator's own error
                logger.debug("OOM hook failed", exc_info=True)

    def _live_workers(self) -> tuple[WorkerReport, ...]:
        """What the worker sources say now, in their order."""
        found: tuple[WorkerReport, ...] = ()
        for source in self.workers:
            found += source()
        return found

    def measure(self, with_process: bool = True, full: bool = True) -> Measurement:
        """``full=False`` is the cheap reading that brackets a cell (see TorchBackend.read)."""
        backend = self.backend
        with self._lock:
            if self._observed is not backend and backend.attach_oom_observer(self._on_oom):
                self._observed = backend
            if self._replay_of is not backend:  # asked once per backend (tests swap them)
                self._ask_replay(backend)
            t, clock = time.time(), time.perf_counter()
            r = backend.read(with_process, full)
            # positional, in the record's field order: this runs twice a measured cell
            return Measurement(
                t,  # time
                clock,
                r.state,
                r.message,
                r.torch_version,
                host_rss(),
                r.caching,
                r.devices,
                self._live_workers() if full else (),
                self._replay,
            )
