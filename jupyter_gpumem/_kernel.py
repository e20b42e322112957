"""ipykernel glue and its quirks, all in one place.

- Requests arrive as a custom control-channel message type. ipykernel (6.x and 7.x)
  dispatches control messages through ``kernel.control_handlers`` on its control thread,
  also while a cell runs; 7.x handles one at a time, so handlers must be fast. A kernel
  without this extension logs the unknown type and sends no reply, which is how a frontend
  tells "not loaded".
- Each control request makes ipykernel publish busy/idle statuses whose parent is the
  request. JupyterLab >= 4.5 ignores those when the request type is in the server's
  ``untracked_message_types`` (this package installs a jupyter_server config that adds it);
  older JupyterLab may show "Idle" briefly while a cell runs.
- Live samples go through a kernel-opened comm: comm messages travel on IOPub, which a
  daemon thread may publish to while a cell runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .protocol import COMM_TARGET, REPLY, REQUEST, Handler
from .protocol.stream import SampleStream

if TYPE_CHECKING:
    from ._ipython.session import Session


class _CommChannel:
    def __init__(self, data: dict[str, Any], on_close: Any) -> None:
        from comm import create_comm

        self.comm = create_comm(target_name=COMM_TARGET, data=data)
        self.comm.on_close(lambda msg: on_close(self))

    @property
    def comm_id(self) -> str | None:
        return str(self.comm.comm_id)

    def send(self, data: dict[str, Any]) -> None:
        self.comm.send(data)

    def close(self) -> None:
        self.comm.close()


class KernelBridge:
    """Registers the control handler and owns the stream for one session."""

    def __init__(self, session: Session, kernel: Any) -> None:
        self.session = session
        self.kernel = kernel
        self.stream = SampleStream(session.collector, self._open_channel, lambda: session.busy)
        self.handler = Handler(session, self.stream)

    def _open_channel(self, data: dict[str, Any]) -> _CommChannel:
        channel = _CommChannel(data, self._closed_by_frontend)
        data["stream"]["comm_id"] = channel.comm_id
        return channel

    def _closed_by_frontend(self, channel: _CommChannel) -> None:
        if self.stream._channel is channel:
            self.stream.unsubscribe()

    def on_request(self, stream: Any, idents: Any, msg: dict[str, Any]) -> None:
        content = self.handler.handle(msg.get("content"))
        self.kernel.session.send(stream, REPLY, content, parent=msg, ident=idents)

    def attach(self) -> None:
        self.kernel.control_handlers[REQUEST] = self.on_request
        self.session.report_listeners.append(self.stream.push_cell)

    def detach(self) -> None:
        if self.kernel.control_handlers.get(REQUEST) == self.on_request:
            del self.kernel.control_handlers[REQUEST]
        if self.stream.push_cell in self.session.report_listeners:
            self.session.report_listeners.remove(self.stream.push_cell)
        self.stream.unsubscribe()


_BRIDGES: dict[int, KernelBridge] = {}


def attach(session: Session) -> None:
    kernel = getattr(session.shell, "kernel", None)
    if kernel is None or not hasattr(kernel, "control_handlers"):
        return  # plain IPython (terminal, tests): no kernel protocol
    bridge = KernelBridge(session, kernel)
    bridge.attach()
    _BRIDGES[id(session)] = bridge


def detach(session: Session) -> None:
    bridge = _BRIDGES.pop(id(session), None)
    if bridge is not None:
        bridge.detach()


def bridge_for(session: Session) -> KernelBridge | None:
    return _BRIDGES.get(id(session))
