"""Live samples: a daemon thread that pushes a sample when anything changed, a heartbeat
when nothing did, and a marker when a measured cell ends. It runs only while subscribed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..collectors import Collector
from ..model import CellReport
from . import PROTOCOL_VERSION


class Channel(Protocol):
    """Where messages go: a comm in a kernel, a list in tests, a widget."""

    @property
    def comm_id(self) -> str | None: ...
    def send(self, data: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class SampleStream:
    def __init__(
        self,
        collector: Collector,
        open_channel: Callable[[dict[str, Any]], Channel],
        is_busy: Callable[[], bool] = lambda: False,
    ) -> None:
        self.collector = collector
        self._open_channel = open_channel
        self._is_busy = is_busy
        self._lock = threading.Lock()
        self._channel: Channel | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.interval_ms = 500
        self.heartbeat_ms = 2000
        self._seq = 0

    def state(self) -> dict[str, Any]:
        return {
            "active": self._thread is not None and self._thread.is_alive(),
            "interval_ms": self.interval_ms,
            "heartbeat_ms": self.heartbeat_ms,
            "comm_id": self._channel.comm_id if self._channel is not None else None,
        }

    def subscribe(self, interval_ms: int, heartbeat_ms: int = 2000) -> dict[str, Any]:
        """(Re)start streaming on a fresh channel, so every frontend sees its opening."""
        self.unsubscribe()
        with self._lock:
            self.interval_ms, self.heartbeat_ms = interval_ms, heartbeat_ms
            self._stop = threading.Event()
            state = {"active": True, "interval_ms": interval_ms, "heartbeat_ms": heartbeat_ms,
                     "comm_id": None}  # fmt: skip
            self._channel = self._open_channel({"protocol": PROTOCOL_VERSION, "type": "open",
                                                "stream": state})  # fmt: skip
            self._thread = threading.Thread(
                target=self._run, args=(self._stop, self._channel), name="gpumem-stream",
                daemon=True,
            )  # fmt: skip
            self._thread.start()
        return self.state()

    def unsubscribe(self) -> dict[str, Any]:
        with self._lock:
            thread, channel = self._thread, self._channel
            self._stop.set()
            self._thread = self._channel = None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)
        if channel is not None:
            try:
                channel.close()
            except Exception:
                pass
        return self.state()

    def _send(self, channel: Channel, kind: str, **payload: Any) -> None:
        with self._lock:
            self._seq += 1
            seq = self._seq
        channel.send({"protocol": PROTOCOL_VERSION, "type": kind, "seq": seq, **payload})

    def push_cell(self, report: CellReport) -> None:
        channel = self._channel
        if channel is not None:
            self._send(channel, "cell", cell=report.marker())

    def _run(self, stop: threading.Event, channel: Channel) -> None:
        last_key: Any = None
        last_sent = 0.0
        while True:
            try:
                sample = self.collector.measure().to_dict()
                key = {k: v for k, v in sample.items() if k not in ("time", "host_rss")}
                now = time.monotonic()
                if key != last_key:
                    self._send(channel, "sample", sample=sample)
                    last_key, last_sent = key, now
                elif (now - last_sent) * 1000 >= self.heartbeat_ms:
                    self._send(channel, "heartbeat", time=time.time(), busy=self._is_busy())
                    last_sent = now
            except Exception:
                pass  # a failed reading must not kill the stream; the next one may work
            if stop.wait(self.interval_ms / 1000):
                return
