"""ipykernel glue and its quirks, all in one place.

- Requests arrive as a custom control-channel message type. ipykernel (6.x and 7.x)
  dispatches control messages through ``kernel.control_handlers`` on its control thread,
  also while a cell runs; 7.x handles one at a time, so handlers must be fast. A kernel
  without this extension logs the unknown type and sends no reply, which is how a frontend
  tells "not loaded".
- Each control request makes ipykernel publish busy/idle statuses whose parent is the
  request. JupyterLab >= 4.5 ignores those when the request type is in the server's
  ``untracked_message_types`` (this package's jupyter_server extension, ``_server.py``,
  adds it);
  older JupyterLab may show "Idle" briefly while a cell runs.
- Live samples are ``comm_msg`` messages on IOPub (a daemon thread may publish there while
  a cell runs) under one comm id that is stable for the kernel's life, and no
  ``comm_open`` is ever sent: every JupyterLab connection to the kernel that has not
  registered the target answers a ``comm_open`` with ``comm_close``, which would stop the
  stream for the panel that asked. The panel attaches to the id from the subscribe reply.
- Requests that read the user's namespace (``who``, ``release_traceback``) must not run
  beside a cell. The control thread hands them to the shell thread's event loop
  (``kernel.io_loop``, a tornado IOLoop in ipykernel 6 and 7; ``add_callback`` is
  thread-safe) and waits: they run there only between cells (a cell holds that thread; an
  ``await``-ing cell still counts as running: ``session.busy``). If the shell thread does
  not pick the task up quickly (a cell started first), the reply is ``busy`` and the task,
  when it finally runs, does nothing.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import ProtocolError
from .protocol import BUSY, COMM_TARGET, REPLY, REQUEST
from .protocol.handler import Handler
from .protocol.stream import SampleStream

if TYPE_CHECKING:
    from ._ipython.session import Session


class _IopubChannel:
    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self._comm_id = f"{COMM_TARGET}-{uuid.uuid4().hex}"

    @property
    def comm_id(self) -> str | None:
        return self._comm_id

    def send(self, data: dict[str, Any]) -> None:
        k = self.kernel
        content = {"comm_id": self._comm_id, "data": data}
        # The same call ipykernel's own Comm.publish_msg makes; IOPub sends are thread-safe.
        k.session.send(
            k.iopub_socket,
            "comm_msg",
            content,
            parent=k.get_parent(),
            ident=f"comm-{self._comm_id}".encode(),
        )


class KernelBridge:
    """Registers the control handler and owns the stream for one session."""

    def __init__(self, session: Session, kernel: Any) -> None:
        self.session = session
        self.kernel = kernel
        self.stream = SampleStream(session.collector, _IopubChannel(kernel), lambda: session.busy)
        self.handler = Handler(session, self.stream, self.run_on_shell)

    # How long the control thread waits for the shell thread to start a task, and to end it.
    START_S = 0.5
    FINISH_S = 10.0

    def run_on_shell(self, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        session = self.session
        if session.busy:
            raise ProtocolError("busy", BUSY)
        loop = getattr(self.kernel, "io_loop", None)
        if loop is None or not hasattr(loop, "add_callback"):
            raise ProtocolError("failed", "this kernel offers no way to reach its shell thread")
        started, done = threading.Event(), threading.Event()
        lock = threading.Lock()
        state: dict[str, Any] = {"abandoned": False}

        def task() -> None:
            with lock:
                if state["abandoned"]:
                    return
                started.set()
            try:
                if session.busy:
                    state["error"] = ProtocolError("busy", BUSY)
                else:
                    state["value"] = fn()
            except BaseException as e:
                state["error"] = e
            finally:
                done.set()

        loop.add_callback(task)
        if not started.wait(self.START_S):
            with lock:
                if not started.is_set():
                    state["abandoned"] = True
                    raise ProtocolError("busy", BUSY)
        if not done.wait(self.FINISH_S):
            raise ProtocolError("failed", "the shell thread did not finish in time")
        if "error" in state:
            raise state["error"]
        return dict(state["value"])

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
        self.stream.stop()


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
