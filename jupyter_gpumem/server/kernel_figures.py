"""What each kernel of this server says it holds, asked over the panel's own channel.

Where NVML's PIDs are foreign (a container without the host's PID namespace, some
runtimes), the server cannot tell which GPU process is which notebook, and a guess could
blame the wrong one. A kernel that loaded the extension knows its own PyTorch figures: the
server asks it with the panel's ``sample`` request on the control channel (a
``gpumem_request``: answered on ipykernel's control thread, also while a cell runs, and not
counted as activity). The notebooks are then named with what they report; NVML's processes
stay ``other``. A kernel without the extension never answers (ipykernel logs the unknown
message): it is asked again only after ``quiet_s``, so a notebook that loads the extension
later is named within about that long. Asked only while NVML's PIDs are foreign, off the
request path when an answer is already known (the reply then carries its age).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..protocol import PROTOCOL_VERSION, REPLY, REQUEST


@dataclass(frozen=True, slots=True)
class ReportedDevice:
    index: int  # the kernel's CUDA index (its CUDA_VISIBLE_DEVICES is the server's)
    name: str
    reserved: int
    allocated: int


@dataclass(frozen=True, slots=True)
class Reported:
    """A kernel's own figures: PyTorch's allocator on each device it initialised."""

    time: float  # unix seconds when the kernel answered
    devices: tuple[ReportedDevice, ...]


def reported_from_sample(sample: Mapping[str, Any], now: float) -> Reported:
    devices = []
    for d in sample.get("devices", ()):
        if d.get("initialized") and isinstance(d.get("reserved"), int):
            devices.append(
                ReportedDevice(
                    int(d["index"]), str(d.get("name", "")), d["reserved"], int(d["allocated"])
                )
            )
    return Reported(now, tuple(devices))


class KernelFigures:
    """Asks this server's kernels for their own figures, a few at a time, and keeps the
    answers (one client per kernel, its control channel only)."""

    def __init__(self, kernel_manager: Any, timeout: float = 1.5, quiet_s: float = 10.0) -> None:
        self.kernel_manager = kernel_manager
        self.timeout = timeout
        self.quiet_s = quiet_s
        self._clients: dict[str, Any] = {}
        self._last: dict[str, Reported] = {}
        self._quiet: dict[str, float] = {}  # kernel id -> when it last did not answer
        self._running: asyncio.Task[None] | None = None

    @property
    def known(self) -> dict[str, Reported]:
        return dict(self._last)

    async def figures(self, kernel_ids: Iterable[str]) -> dict[str, Reported]:
        """The kernels' figures: fresh when none is known yet (waits up to ``timeout``),
        otherwise the last ones while new ones are asked for in the background."""
        ids = list(kernel_ids)
        self._forget(ids)
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._ask_all(ids))
        if not any(k in self._last for k in ids):
            try:
                await asyncio.wait_for(asyncio.shield(self._running), self.timeout + 0.5)
            except asyncio.TimeoutError:
                pass
        return {k: r for k, r in self._last.items() if k in ids}

    async def _ask_all(self, ids: list[str]) -> None:
        now = time.monotonic()
        due = [k for k in ids if now - self._quiet.get(k, -1e9) >= self.quiet_s]
        await asyncio.gather(*(self._ask(k) for k in due), return_exceptions=True)

    async def _ask(self, kernel_id: str) -> None:
        try:
            kc = self._clients.get(kernel_id)
            if kc is None:
                kc = self.kernel_manager.get_kernel(kernel_id).client()
                kc.start_channels(shell=False, iopub=False, stdin=False, hb=False, control=True)
                self._clients[kernel_id] = kc
            content = {"protocol": PROTOCOL_VERSION, "action": "sample", "args": {}}
            msg = kc.session.msg(REQUEST, content)
            kc.control_channel.send(msg)
            deadline = time.monotonic() + self.timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                reply = await kc.control_channel.get_msg(timeout=left)
                if (
                    reply.get("msg_type") == REPLY
                    and reply.get("parent_header", {}).get("msg_id") == msg["header"]["msg_id"]
                ):
                    break
            body = reply.get("content", {})
            if body.get("status") != "ok":
                raise ValueError(body.get("error"))
            self._last[kernel_id] = reported_from_sample(body["result"]["sample"], time.time())
            self._quiet.pop(kernel_id, None)
        except Exception:  # no extension (no answer), a kernel that went away, a bad reply
            self._quiet[kernel_id] = time.monotonic()
            self._last.pop(kernel_id, None)

    def _forget(self, ids: list[str]) -> None:
        """Drop clients and answers of kernels that are gone."""
        for k in [k for k in self._clients if k not in ids]:
            self._close(k)
        for k in [k for k in self._last if k not in ids]:
            del self._last[k]

    def _close(self, kernel_id: str) -> None:
        kc = self._clients.pop(kernel_id, None)
        if kc is not None:
            try:
                kc.stop_channels()
            except Exception:
                pass

    def close(self) -> None:
        for k in list(self._clients):
            self._close(k)
