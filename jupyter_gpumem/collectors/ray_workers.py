"""Ray workers report to the kernel through Ray itself.

A notebook that reaches a cluster through Ray (Ray Train, tasks and actors with GPUs) has
workers on any node; each has its own caching allocator. Their figures travel through Ray,
no port, socket or server of ours, and only when the user imported Ray: nothing here runs,
and ``ray`` is never imported, unless ``"ray"`` is in ``sys.modules`` already.

- **The mailbox** (kernel side): a named actor of the kernel's own job, created at the
  first measured cell (or panel sample) after ``ray.init()``: no CPU (``num_cpus=0``), on the
  kernel's node where it can, in the job's namespace under ``jupyter_gpumem:<job id>``, so
  that only this job's workers find it, and owned by the kernel (it ends with the kernel's
  Ray session). It keeps each worker's latest report, at most ``MAX_WORKERS`` of them.
- **A worker** (a Ray task or actor) calls ``jupyter_gpumem.report_worker()``: when its
  job's mailbox exists (its driver is a kernel with the extension loaded), a
  :class:`~jupyter_gpumem.collectors.workers.reporter.WorkerReporter` (the reading forked
  and spawned workers take, the one verified on GPUs) hands its reports to the mailbox
  (``report.remote``: fire and forget, nothing in the worker waits). In a job without a
  notebook there is no mailbox: the call returns False and nothing happens.
- **A measured cell's begin and end** ask the mailbox for what changed since the last
  answer (``since.remote``) and wait at most ``WAIT`` seconds for the reply; an answer that
  comes later is taken at the next cell or panel sample. Every report goes through the
  same check as a datagram
  (:func:`~jupyter_gpumem.collectors.workers.message.parse_message`) into the kernel's
  :class:`~jupyter_gpumem.collectors.workers.kernel_channel.WorkerChannel`, so the cell's
  report, the history, the panel and ``run``'s budgets show Ray workers as they show
  forked ones.

Ray closes a worker's connection before the worker's Python exits (a GPU task's process
ends right after its task, ``max_calls=1``), and any Ray call after that ends the process
on the spot, skipping its exit handlers. So no report is sent at exit: a task sends its
last figures with ``report_worker(final=True)`` as its last line (status *exited*), and a
worker's reporter thread sends only while Ray's task loop runs, and in a task's worker only
while a task runs (:class:`_TaskLoop`).

A worker's device index is the node's GPU (Ray's GPU id) where Ray set the worker's
``CUDA_VISIBLE_DEVICES`` to its GPU ids, else the worker's own torch index.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from ..log import logger
from .workers import process
from .workers.kernel_channel import WorkerChannel
from .workers.message import MAX_DATAGRAM, MAX_WORKERS, parse_message, worker_message
from .workers.reporter import WorkerReporter

PREFIX = "jupyter_gpumem:"
WAIT = 0.005  # the longest a measured cell's begin or end waits for the mailbox (seconds)
RETRY_AFTER = 10.0  # after a failure (no mailbox could be made, it died): seconds until retried
KEY_LIMIT = 300  # characters of a mailbox key: "<host>/<pid>"


def mailbox_name(job_id: str) -> str:
    """The mailbox's actor name: per job, in the job's namespace."""
    return f"{PREFIX}{job_id}"


def _mailbox_class() -> type:
    """The mailbox actor's class. Defined inside a function so that Ray ships it by value:
    the node that runs it needs no jupyter_gpumem."""

    class GpuMemMailbox:
        """Keeps each worker's latest report (a JSON string) and when it came."""

        def __init__(self, max_workers: int, max_bytes: int) -> None:
            self.max_workers = max_workers
            self.max_bytes = max_bytes
            self.version = 0
            self.entries: dict[str, tuple[int, float, str]] = {}  # key -> version, time, data

        def report(self, key: str, data: str) -> None:
            if not (isinstance(key, str) and isinstance(data, str)):
                return
            if len(key) > KEY_LIMIT or len(data) > self.max_bytes:
                return
            if key not in self.entries and len(self.entries) >= self.max_workers:
                del self.entries[min(self.entries, key=lambda k: self.entries[k][1])]
            self.version += 1
            self.entries[key] = (self.version, time.monotonic(), data)

        def since(self, version: int) -> tuple[int, list[tuple[str, float]]]:
            """The reports that came after ``version``, each with its age in seconds (this
            actor's clock: no two hosts' clocks are compared)."""
            now = time.monotonic()
            new = [(d, now - t) for v, t, d in self.entries.values() if v > version]
            return self.version, new

    return GpuMemMailbox


# -- the kernel's side -----------------------------------------------------------------
class RayWatcher:
    """The kernel's end: the mailbox of its job, and the reads of it."""

    def __init__(self, ray: Any, job: str) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.ray = ray
        self.job = job
        self.actor = (
            ray.remote(num_cpus=0)(_mailbox_class())
            .options(
                name=mailbox_name(job),
                get_if_exists=True,
                max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(
                    ray.get_runtime_context().get_node_id(), soft=True
                ),
            )
            .remote(MAX_WORKERS, MAX_DATAGRAM)
        )
        self.version = 0
        self.reported = 0  # reports taken so far
        self._pending: Any = None  # the ObjectRef of a question not answered yet
        self._lock = threading.Lock()

    def poll(self, channel: WorkerChannel, wait: float, ask: bool = True) -> int:
        """Take the mailbox's news into ``channel``, waiting up to ``wait`` seconds for the
        answer to a question asked now (0: take an earlier answer if it came, ask again,
        and return at once; ``ask=False``: only take an answer that came). How many
        reports were taken."""
        deadline = time.monotonic() + wait  # all waits together stay within ``wait``
        if not (self._lock.acquire(timeout=wait) if wait > 0 else self._lock.acquire(False)):
            return 0  # another thread asks right now (the panel's sample, a cell)
        try:
            ray, taken = self.ray, 0
            if self._pending is not None:  # an earlier question: its answer first
                left = max(0.0, deadline - time.monotonic())
                if not ray.wait([self._pending], timeout=left)[0]:
                    return 0  # the mailbox is slow (or still starting): next time
                taken += self._take(channel)
            if not ask:
                return taken
            self._pending = self.actor.since.remote(self.version)
            left = deadline - time.monotonic()
            if left > 0 and ray.wait([self._pending], timeout=left)[0]:
                taken += self._take(channel)
            return taken
        finally:
            self._lock.release()

    def _take(self, channel: WorkerChannel) -> int:
        ref, self._pending = self._pending, None
        answer = self.ray.get(ref, timeout=0)
        version, entries = answer
        if isinstance(version, int) and not isinstance(version, bool):
            self.version = max(self.version, version)
        now = time.time()
        taken = 0
        for item in list(entries)[: 4 * MAX_WORKERS]:
            data, age = item
            msg = parse_message(data) if isinstance(data, str) else None
            if msg is None or msg["via"] != "ray":
                continue  # dropped (parse_message logs why)
            if not isinstance(age, (int, float)) or not 0 <= age < 1e9:
                age = 0.0  # NaN fails the comparison too
            channel.take(msg, now - float(age))
            taken += 1
        self.reported += taken
        return taken


_watcher: RayWatcher | None = None
_retry_at = 0.0  # monotonic: no mailbox is made before this after a failure


def poll(channel: WorkerChannel | None = None, wait: float = 0.0, ask: bool = True) -> int:
    """In the kernel, with Ray initialized: take the Ray workers' latest reports into the
    worker channel (this process's, unless ``channel``), making the mailbox first if need
    be. 0 at once without Ray. ``wait`` and ``ask``: :meth:`RayWatcher.poll`'s."""
    global _watcher, _retry_at
    ray = sys.modules.get("ray")
    if ray is None:
        return 0
    try:
        if not ray.is_initialized():
            _watcher = None  # ray.shutdown(): a later ray.init() is another job
            return 0
        ch = channel if channel is not None else process._channel
        if ch is None:
            return 0
        w = _watcher
        job = ray.get_runtime_context().get_job_id()
        if w is None or w.job != job:
            w = _watcher = None
            if time.monotonic() < _retry_at or _in_worker(ray):
                return 0  # a Ray worker is no notebook's kernel: it makes no mailbox
            w = _watcher = RayWatcher(ray, job)
        return w.poll(ch, wait, ask)
    except Exception:  # the mailbox died, Ray is shutting down: never the cell's problem
        logger.debug("reading the Ray workers' mailbox failed", exc_info=True)
        _watcher = None
        _retry_at = time.monotonic() + RETRY_AFTER
        return 0


def cell(channel: WorkerChannel, begin: bool) -> None:
    """A measured cell's begin or end (``CellTracker``): the Ray workers' news, waiting at
    most ``WAIT`` seconds for the mailbox's answer. A begin makes the mailbox if need be,
    and asks only once Ray workers have reported (their allocated when the cell began)."""
    w = _watcher
    if begin and (w is None or not w.reported):
        poll(channel, 0.0, ask=False)
    else:
        poll(channel, WAIT)


def stop() -> None:
    """Forget the mailbox (Ray ends the actor with the kernel's Ray session). A watcher
    made again for the same job would take each worker's latest report once more."""
    global _watcher
    _watcher = None


# -- a worker's side -------------------------------------------------------------------
def _in_worker(ray: Any) -> bool:
    """A Ray worker process (a task's or an actor's), not a driver."""
    try:
        mode = ray.get_runtime_context().worker.mode
        return bool(ray.is_initialized()) and mode == ray.WORKER_MODE
    except Exception:
        return False


def in_worker() -> bool:
    """This process is a Ray worker (Ray imported and connected as a worker)."""
    ray = sys.modules.get("ray")
    return ray is not None and _in_worker(ray)


def _is_task_loop(frame: Any) -> bool:
    code = frame.f_code
    return code.co_name == "main_loop" and os.path.join("ray", "_private") in code.co_filename


class _TaskLoop:
    """Ray's task loop on the worker's main thread (``Worker.main_loop``, in which Ray's
    ``run_task_loop`` runs every task). Ray ends a worker's connection inside that call,
    and a Ray call from any thread after that ends the process at once, without its exit
    handlers. So reports go only while the call has not returned (the loop frame's line is
    still that of the call), and, in a task's worker, only while a task runs: between tasks
    Ray may end the worker (a GPU task's after its task, an idle one) at any moment."""

    def __init__(self) -> None:
        main = threading.main_thread()
        self.ident = main.ident
        frame = sys._current_frames().get(main.ident) if main.ident is not None else None
        while frame is not None and not _is_task_loop(frame):
            frame = frame.f_back
        self.frame = frame  # the loop's frame lives as long as the process: no leak
        self.line = frame.f_lineno if frame is not None else -1

    def running(self) -> bool:
        f = self.frame
        return f is not None and not sys.is_finalizing() and f.f_lineno == self.line

    def in_task(self) -> bool:
        """The main thread runs a task: its innermost frame is not the loop's."""
        if self.ident is None:
            return False
        return sys._current_frames().get(self.ident) is not self.frame


class RaySender:
    """A Ray worker's reports, handed to its job's mailbox (fire and forget)."""

    def __init__(self, actor: Any, loop: _TaskLoop, in_actor: bool, gpus: list[Any]) -> None:
        self.actor = actor
        self.loop = loop
        self.in_actor = in_actor
        self.key = f"{_hostname()}/{os.getpid()}"
        # The node's GPUs, where Ray made them this worker's CUDA_VISIBLE_DEVICES (torch's
        # cuda:i is then the node's GPU gpus[i]).
        ids = [str(g) for g in gpus]
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        mapped = bool(ids) and visible == ",".join(ids) and all(i.isdigit() for i in ids)
        self.visible = visible if mapped else None
        self.gpus = [int(i) for i in ids] if mapped else []

    def __call__(self, msg: dict[str, Any], final: bool) -> bool:
        if not self.loop.running():
            return False  # Ray's loop has returned: the process is exiting
        on_main = threading.get_ident() == self.loop.ident
        if not (self.in_actor or on_main or self.loop.in_task()):
            return False  # a task's worker between tasks: Ray may be ending it
        if self.gpus and os.environ.get("CUDA_VISIBLE_DEVICES") == self.visible:
            for d in msg["devices"]:
                if d["index"] < len(self.gpus):
                    d["index"] = self.gpus[d["index"]]
        data = json.dumps(msg, separators=(",", ":"))
        if len(data) > MAX_DATAGRAM:
            return False
        try:
            self.actor.report.remote(self.key, data)
        except Exception:  # the mailbox is gone (the kernel's Ray session ended)
            logger.debug("Ray worker report failed", exc_info=True)
            return False
        return True


def _hostname() -> str:
    import socket

    return socket.gethostname()


_reporter: WorkerReporter | None = None


def report_from_ray(final: bool = False) -> bool | None:
    """In a Ray task or actor: report this worker's figures to its job's mailbox (the
    notebook's kernel), sending them now; ``final``: as its last report (status *exited*),
    then stop. None where this is not a Ray worker, or its job's driver made no mailbox (no
    notebook with the extension, or no measured cell since ``ray.init()``)."""
    global _reporter
    ray = sys.modules.get("ray")
    if ray is None or not _in_worker(ray):
        return None
    r = _reporter
    if r is not None and r.pid == os.getpid():
        _send_now(r, final)
        if final:
            _reporter = None
        return True
    ctx = ray.get_runtime_context()
    try:
        actor = ray.get_actor(mailbox_name(ctx.get_job_id()))
    except ValueError:  # no such actor: the job's driver is no notebook of ours
        return None
    loop = _TaskLoop()
    if loop.frame is None:  # not Ray's task loop as we know it: sending could end the worker
        logger.debug("Ray worker: no task loop found on the main thread; not reporting")
        return None
    sender = RaySender(actor, loop, ctx.get_actor_id() is not None, list(ray.get_gpu_ids()))
    reporter = WorkerReporter(sender, "ray")
    _send_now(reporter, final)
    _reporter = None if final else reporter
    return True


def _send_now(reporter: WorkerReporter, final: bool) -> None:
    if final:
        reporter.final()
    elif reporter.collector.backend.cuda_ready():
        msg = worker_message(reporter.collector, reporter.started, False, "ray")
        reporter.send(msg, False)
