"""Live samples: a daemon thread that pushes a sample when anything changed, a heartbeat
when nothing did, and a marker when a measured cell ends.

Subscriptions are per client and leased: a client's subscription lasts ``LEASE_S`` unless
renewed by another ``subscribe``, and the thread runs only while some client holds one,
at the smallest interval any of them asked for. A closed browser tab therefore stops
costing anything within a minute, and one tab's ``unsubscribe`` leaves the others alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..collectors import Collector
from ..model import CellReport
from . import PROTOCOL_VERSION
from .convert import to_protocol

LEASE_S = 60


class Channel(Protocol):
    """Where messages go: IOPub in a kernel, a list in tests, a widget."""

    @property
    def comm_id(self) -> str | None: ...
    def send(self, data: dict[str, Any]) -> None: ...


class SampleStream:
    def __init__(
        self,
        collector: Collector,
        channel: Channel,
        is_busy: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
        lease_s: float = LEASE_S,
    ) -> None:
        self.collector = collector
        self.channel = channel
        self._is_busy = is_busy
        self._clock = clock
        self.lease_s = lease_s
        self._lock = threading.Lock()
        self._clients: dict[str, tuple[float, int, int]] = {}  # id -> (expiry, interval, hb)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._seq = 0

    # -- subscriptions -------------------------------------------------------------
    def _expire(self) -> None:
        now = self._clock()
        for cid in [c for c, (exp, _, _) in self._clients.items() if exp <= now]:
            del self._clients[cid]

    @property
    def interval_ms(self) -> int:
        return min((i for _, i, _ in self._clients.values()), default=500)

    @property
    def heartbeat_ms(self) -> int:
        return min((h for _, _, h in self._clients.values()), default=2000)

    def state(self) -> dict[str, Any]:
        with self._lock:
            self._expire()
            return {
                "active": self._thread is not None and self._thread.is_alive(),
                "interval_ms": self.interval_ms,
                "heartbeat_ms": self.heartbeat_ms,
                "comm_id": self.channel.comm_id,
                "lease_s": int(self.lease_s),
                "clients": len(self._clients),
            }

    def subscribe(self, interval_ms: int, heartbeat_ms: int = 2000, client: str = "") -> dict:
        with self._lock:
            self._clients[client] = (self._clock() + self.lease_s, interval_ms, heartbeat_ms)
            if self._thread is None or not self._thread.is_alive():
                self._stop = threading.Event()
                self._thread = threading.Thread(
                    target=self._run, args=(self._stop,), name="gpumem-stream", daemon=True
                )
                self._thread.start()
        return self.state()

    def unsubscribe(self, client: str = "") -> dict[str, Any]:
        with self._lock:
            self._clients.pop(client, None)
            if not self._clients:
                self._stop_thread()
        return self.state()

    def stop(self) -> None:
        """Stop for everyone (extension unloaded)."""
        with self._lock:
            self._clients.clear()
            self._stop_thread()

    def _stop_thread(self) -> None:
        thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            self._lock.release()
            try:
                thread.join(timeout=2)
            finally:
                self._lock.acquire()

    # -- sending -------------------------------------------------------------------
    def _send(self, kind: str, **payload: Any) -> None:
        with self._lock:
            self._seq += 1
            seq = self._seq
        self.channel.send({"protocol": PROTOCOL_VERSION, "type": kind, "seq": seq, **payload})

    def push_cell(self, report: CellReport) -> None:
        if self._thread is not None:
            self._send("cell", cell=to_protocol(report))

    def _run(self, stop: threading.Event) -> None:
        self._send("open", stream=self.state())
        last_key: Any = None
        last_sent = 0.0
        while not stop.is_set():
            with self._lock:
                self._expire()
                if not self._clients:
                    if self._thread is threading.current_thread():
                        self._thread = None
                    return
                interval, heartbeat = self.interval_ms, self.heartbeat_ms
            try:
                sample = to_protocol(self.collector.measure())
                key = {k: v for k, v in sample.items() if k not in ("time", "host_rss")}
                if "workers" in key:  # a worker's age alone is no change worth a sample
                    key["workers"] = [{**w, "age": None} for w in key["workers"]]
                now = time.monotonic()
                if key != last_key:
                    self._send("sample", sample=sample)
                    last_key, last_sent = key, now
                elif (now - last_sent) * 1000 >= heartbeat:
                    self._send("heartbeat", time=time.time(), busy=self._is_busy())
                    last_sent = now
            except Exception:
                pass  # a failed reading must not kill the stream; the next one may work
            stop.wait(interval / 1000)
