"""The worker's side: a reporter thread that sends the worker's figures to the kernel.

A :class:`WorkerReporter` runs in a worker process (forked by a measured cell, spawned and
calling ``jupyter_gpumem.report_worker()``, a rank of a ``torch.distributed`` job, a Ray
task): a daemon thread that, once CUDA is up in the worker, sends the worker's figures
(:func:`~.message.worker_message`) when they change (at most every ``INTERVAL`` seconds,
and every ``KEEPALIVE`` seconds regardless), and a last report at exit. What carries a
report is the ``send`` callable it is given: :class:`DatagramSender` for the kernel's
channel on this host (then the reporter also writes its OOM snapshot files, :mod:`.oom`,
and answers the kernel's requests for its segments, :mod:`.segment_requests`, in the
channel's directory), a store's key or a Ray actor for the others. A reporter never
disturbs the worker: its failures are logged at debug level and swallowed.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ...log import logger
from ...model import OomEvent
from .message import INTERVAL, KEEPALIVE, MAX_SNAPSHOTS, worker_message
from .oom import MAX_FILES, write_snapshot
from .segment_requests import RequestWatch


class WorkerReporter:
    """Runs in a worker: sends its figures to the kernel (``send``: a datagram to the
    kernel's channel, or a ``torch.distributed`` store's key)."""

    def __init__(
        self, send: Callable[[dict[str, Any], bool], bool], via: str, started: float | None = None
    ) -> None:
        from ..collector import Collector, make_backend

        self.send = send
        self.via = via
        self.pid = os.getpid()  # a process forked by the worker inherits this: it is not it
        self.started = time.time() if started is None else started
        self.collector = Collector(make_backend())
        # Where OOM snapshot files go: the kernel's channel directory (datagrams only).
        self.directory: str | None = getattr(send, "directory", None)
        self._snapshots: list[str] = []  # written, not yet named in a sent report
        self._files = 0
        if self.directory is not None:
            self.collector.on_oom = self._at_oom  # the collector attaches the observer
        # The kernel's requests for this worker's segments (files in the same directory)
        self._requests = (
            RequestWatch(self.directory, self.pid, self.collector.backend)
            if self.directory is not None
            else None
        )
        self._done = False
        self._last: tuple[Any, ...] | None = None
        self._sent = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpumem-worker", daemon=True)
        self._thread.start()
        atexit.register(self.final)

    def _loop(self) -> None:
        while not self._stop.wait(INTERVAL):
            if self._requests is not None:
                try:  # one access() call when nobody asks
                    self._requests.poll()
                except Exception:  # never disturb the worker
                    logger.debug("segments request failed", exc_info=True)
            try:
                self.tick()
            except Exception:  # never disturb the worker
                logger.debug("worker report failed", exc_info=True)

    def _at_oom(self, event: OomEvent) -> None:
        """In the allocator's failure path (its lock released): the snapshot file. Short,
        and it never raises (the collector swallows what escapes)."""
        if self.directory is None or os.getpid() != self.pid or self._files >= MAX_FILES:
            return
        self._files += 1
        name = write_snapshot(
            self.collector.backend,
            self.directory,
            event.device,
            event.requested,
            event.allowed,
            event.free,
            self._files,
        )
        if name is not None:
            self._snapshots.append(name)

    def _message(self, final: bool) -> tuple[dict[str, Any], list[str]]:
        names = self._snapshots[:MAX_SNAPSHOTS]
        return worker_message(self.collector, self.started, final, self.via, snapshots=names), names

    def _sent_snapshots(self, names: list[str]) -> None:
        if names:
            del self._snapshots[: len(names)]

    def tick(self) -> None:
        """Send the figures if they changed (or a keepalive is due); only once CUDA is up."""
        if self._done or os.getpid() != self.pid or not self.collector.backend.cuda_ready():
            return
        msg, names = self._message(False)
        key = (msg["rank"], *(tuple(d.values()) for d in msg["devices"]), len(msg["ooms"]))
        now = time.monotonic()
        if key == self._last and now - self._sent < KEEPALIVE and not names:
            return
        if self.send(msg, False):
            self._last, self._sent = key, now
            self._sent_snapshots(names)

    def final(self) -> None:
        """The last report, at the worker's exit. Idempotent."""
        if self._done or os.getpid() != self.pid:
            return
        self._done = True
        self._stop.set()
        try:
            if self.collector.backend.cuda_ready():
                msg, names = self._message(True)
                if self.send(msg, True):
                    self._sent_snapshots(names)
        except Exception:
            logger.debug("last worker report failed", exc_info=True)


class DatagramSender:
    """A worker's reports to the kernel's channel on this host."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.directory = os.path.dirname(address)  # the channel's: OOM snapshot files
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)

    def __call__(self, msg: Mapping[str, Any], final: bool) -> bool:
        data = json.dumps(msg, separators=(",", ":")).encode()
        # The kernel's queue may be full (Linux queues net.unix.max_dgram_qlen datagrams,
        # often 10): a periodic report waits for the next tick; the last one retries for
        # up to 0.5 s while the kernel's thread takes what is queued.
        for _ in range(50 if final else 1):
            try:
                self.sock.sendto(data, self.address)
                return True
            except BlockingIOError:
                if final:
                    time.sleep(0.01)
            except OSError:  # the kernel is gone, or its channel closed
                return False
        return False
