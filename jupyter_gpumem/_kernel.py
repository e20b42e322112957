"""ipykernel glue and its quirks, all in one place.

- Requests arrive as a custom control-channel message type. ipykernel (6.x and 7.x)
  dispatches control messages through ``kernel.control_handlers`` on its control thread,
  also while a cell runs; 7.x handles one at a time, so handlers must be fast. A kernel
  without this extension logs the unknown type and sends no reply, which is how a frontend
  tells "not loaded".
- Each control request makes ipykernel publish busy/idle statuses whose parent is the
  request. JupyterLab >= 4.5 ignores those when the request type is in the server's
  ``untracked_message_types`` (this package's jupyter_server extension, ``server/``,
  adds it); older JupyterLab may show "Idle" briefly while a cell runs.
- Live samples are ``comm_msg`` messages on IOPub (a daemon thread may publish there while
  a cell runs) under one comm id that is stable for the kernel's life, and no
  ``comm_open`` is ever sent: every JupyterLab connection to the kernel that has not
  registered the target answers a ``comm_open`` with ``comm_close``, which would stop the
  stream for the panel that asked. The panel attaches to the id from the subscribe reply.
- Requests that read the user's namespace (``who``, ``release_traceback``) must not run
  beside a cell. The control thread hands them to the shell thread's event loop
  (``kernel.io_loop``, a tornado IOLoop in ipykernel 6 and 7; ``add_callback`` is
  thread-safe) and returns at once: ipykernel 7 handles one control message at a time, so
  waiting there would hold every other request (a ``sample``) behind a namespace walk.
  The shell thread runs the task only between cells (a cell holds that thread; an
  ``await``-ing cell still counts as running: ``session.busy``) and hands the reply back
  to the control thread's loop, which alone sends on the control socket. If the shell
  thread does not pick the task up quickly (a cell started first), the reply is ``busy``
  and the task, when it finally runs, does nothing.
- Requests that wait for a worker process (``segments`` with ``rank`` or ``pid``: up to
  2 s for its answer) must not hold the control thread either: a ``sample``, or an
  interrupt (Ctrl-C), would wait behind them. Each runs on a daemon thread of its own, at
  most :data:`WORKER_PENDING` at a time (requests to the same worker share its answer);
  the reply goes back through the control thread's loop. More waiting than that: ``busy``
  at once.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import ProtocolError
from .log import logger
from .protocol import BUSY, COMM_TARGET, REPLY, REQUEST, check_request, error_reply
from .protocol.handler import READS_NAMESPACE, WAITS_FOR_A_WORKER, Handler
from .protocol.stream import SampleStream

if TYPE_CHECKING:
    from .protocol.handler import Services


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


WORKER_PENDING = 4  # requests waiting for a worker, at most (more: busy at once)
WORKER_BUSY = "busy: earlier requests for a worker's segments are still waiting for it"


class _WorkerWaits:
    """Runs each request that waits for a worker process on a daemon thread of its own,
    at most :data:`WORKER_PENDING` at a time (requests to the same worker share one ask:
    ``WorkerChannel.segments_of``)."""

    def __init__(self) -> None:
        self.slots = threading.BoundedSemaphore(WORKER_PENDING)

    def submit(self, task: Callable[[], None]) -> bool:
        """Start ``task``; False when too many wait already."""
        if not self.slots.acquire(blocking=False):
            return False

        def run() -> None:
            try:
                task()
            except Exception:  # the reply is the handler's; nothing else to do here
                logger.debug("a request that waits for a worker failed", exc_info=True)
            finally:
                self.slots.release()

        threading.Thread(target=run, name="jupyter-gpumem-worker-request", daemon=True).start()
        return True


class KernelBridge:
    """Registers the control handler and owns the stream for one session."""

    def __init__(self, session: Services, kernel: Any) -> None:
        self.session = session
        self.kernel = kernel
        self.stream = SampleStream(session.collector, _IopubChannel(kernel), lambda: session.busy)
        # On the control thread; namespace actions through run_on_shell (kernels whose
        # control stream has no loop of its own to reply from later)
        self.handler = Handler(session, self.stream, self.run_on_shell)
        # On the shell thread, between cells (namespace actions, replied to later)
        self.shell_handler = Handler(session, self.stream)
        # Off the control thread: requests that wait for a worker process
        self.worker_waits = _WorkerWaits()

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
        content = msg.get("content")
        control_loop = getattr(stream, "io_loop", None)
        shell_loop = getattr(self.kernel, "io_loop", None)
        where = _runs_where(content)
        if (
            where == "shell"
            and hasattr(control_loop, "call_later")
            and hasattr(shell_loop, "add_callback")
        ):
            self._later(stream, idents, msg, control_loop, shell_loop)
            return
        if where == "worker" and hasattr(control_loop, "add_callback"):
            self._off_thread(stream, idents, msg, control_loop)
            return
        self._send(stream, idents, msg, self.handler.handle(content))

    def _send(self, stream: Any, idents: Any, msg: dict[str, Any], reply: dict[str, Any]) -> None:
        self.kernel.session.send(stream, REPLY, reply, parent=msg, ident=idents)

    def _off_thread(self, stream: Any, idents: Any, msg: dict[str, Any], control_loop: Any) -> None:
        """Answer a request that waits for a worker on the worker-waits thread and reply
        from the control thread's loop when it ends; ``busy`` at once when too many wait."""
        content = msg.get("content")

        def task() -> None:
            control_loop.add_callback(self._send, stream, idents, msg, self.handler.handle(content))

        if not self.worker_waits.submit(task):
            action = content.get("action") if isinstance(content, dict) else None
            self._send(stream, idents, msg, error_reply(action, "busy", WORKER_BUSY))

    def _later(
        self, stream: Any, idents: Any, msg: dict[str, Any], control_loop: Any, shell_loop: Any
    ) -> None:
        """Run a namespace action on the shell thread and reply from the control thread's
        loop when it ends; the control thread is free meanwhile. Exactly one reply: the
        result, ``busy`` (not started within START_S) or ``failed`` (not done in FINISH_S)."""
        content = msg.get("content")
        action = content.get("action") if isinstance(content, dict) else None
        if self.session.busy:
            self._send(stream, idents, msg, error_reply(action, "busy", BUSY))
            return
        lock = threading.Lock()
        state = {"started": False, "replied": False}

        def reply(answer: dict[str, Any], unless_started: bool = False) -> None:
            with lock:
                if state["replied"] or (unless_started and state["started"]):
                    return
                state["replied"] = True
            control_loop.add_callback(self._send, stream, idents, msg, answer)

        def task() -> None:  # on the shell thread
            with lock:
                if state["replied"]:
                    return  # answered busy already: a cell started first
                state["started"] = True
            reply(self.shell_handler.handle(content))

        shell_loop.add_callback(task)
        control_loop.call_later(
            self.START_S, lambda: reply(error_reply(action, "busy", BUSY), unless_started=True)
        )
        control_loop.call_later(
            self.FINISH_S,
            lambda: reply(error_reply(action, "failed", "the shell thread did not finish in time")),
        )

    def attach(self) -> None:
        self.kernel.control_handlers[REQUEST] = self.on_request
        self.session.report_listeners.append(self.stream.push_cell)

    def detach(self) -> None:
        if self.kernel.control_handlers.get(REQUEST) == self.on_request:
            del self.kernel.control_handlers[REQUEST]
        if self.stream.push_cell in self.session.report_listeners:
            self.session.report_listeners.remove(self.stream.push_cell)
        self.stream.stop()


def _runs_where(content: Any) -> str | None:
    """``shell``: the request reads the namespace; ``worker``: it waits for a worker
    process; None: the control thread answers it at once."""
    try:
        action, args = check_request(content)
    except ProtocolError:
        return None  # the handler answers the bad request at once
    if action in READS_NAMESPACE:
        return "shell"
    asks_a_worker = args.get("rank") is not None or args.get("pid") is not None
    if action in WAITS_FOR_A_WORKER and asks_a_worker:
        return "worker"
    return None


_BRIDGES: dict[int, KernelBridge] = {}


def attach(session: Services, kernel: Any) -> None:
    """Answer the panel's requests for ``session`` on ``kernel`` (the shell's ipykernel;
    None, or a kernel without control handlers: nothing to do)."""
    if kernel is None or not hasattr(kernel, "control_handlers"):
        return  # plain IPython (terminal, tests): no kernel protocol
    bridge = KernelBridge(session, kernel)
    bridge.attach()
    _BRIDGES[id(session)] = bridge


def detach(session: Services) -> None:
    bridge = _BRIDGES.pop(id(session), None)
    if bridge is not None:
        bridge.detach()
