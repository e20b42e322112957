"""This process's channel or reporter, and the fork hooks that start a worker's reporter.

One per process: the kernel's :class:`~.kernel_channel.WorkerChannel` (:func:`channel`,
made at the first measured cell), or, in a worker, its
:class:`~.reporter.WorkerReporter`. ``os.register_at_fork`` hooks, registered with the
channel: a process forked while a measured cell runs starts a reporter that sends to the
kernel's channel, and a last report at exit (multiprocessing's finalizers, which run also
when the worker raises; ``atexit`` for other exits). The parent never touches CUDA:
forking after CUDA started is PyTorch's own error. A process forked by the worker itself
(a DataLoader worker) does not report. A spawned worker inherits nothing but the
environment: ``JUPYTER_GPUMEM_WORKERS`` holds the channel's address, and a worker that
calls :func:`report_from_worker` (``jupyter_gpumem.report_worker()``) reports like a
forked one.
"""

from __future__ import annotations

import os
import sys

from ...log import logger
from ...model import WorkerReport, WorkerSegments
from .kernel_channel import WorkerChannel, none_reported
from .message import WORKERS_ENV, spawn_index
from .reporter import DatagramSender, WorkerReporter
from .segment_requests import ANSWER_WAIT

_channel: WorkerChannel | None = None  # the kernel's, in the kernel process
_reporter: WorkerReporter | None = None  # this process's, in a worker
_hooked = False


def channel() -> WorkerChannel:
    """This process's channel (one per process: fork hooks are process-wide)."""
    global _channel, _hooked
    if _channel is None:
        _channel = WorkerChannel()
    if not _hooked:
        os.register_at_fork(
            after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
        )
        _hooked = True
    return _channel


def _after_fork_in_parent() -> None:
    ch = _channel
    if ch is not None:
        ch.forks += 1


def _after_fork_in_child() -> None:
    """Runs in every forked child: a worker of a measured cell starts reporting."""
    global _channel, _reporter
    ch = _channel
    if ch is None:
        return
    _channel = None  # the child is not the kernel
    if not ch.measuring or ch.address is None or _reporter is not None:
        ch.forget_in_child()
        return
    try:
        address = ch.forget_in_child()
        if address is None:
            return
        _reporter = WorkerReporter(DatagramSender(address), "fork")
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None:
            # multiprocessing clears its finalizers in the child after this hook runs,
            # then calls its after-fork callbacks: register the last report from there.
            mp_util.register_after_fork(_reporter, _finalize_at_exit)
    except Exception:
        logger.debug("worker reporting did not start", exc_info=True)


def _finalize_at_exit(reporter: WorkerReporter) -> None:
    mp_util = sys.modules["multiprocessing.util"]
    mp_util.Finalize(None, reporter.final, exitpriority=100)


def segments_of(
    rank: int | None = None, pid: int | None = None, wait: float = ANSWER_WAIT
) -> WorkerSegments:
    """This process's channel's :meth:`WorkerChannel.segments_of`; no channel is opened
    for it (none open: no worker has reported)."""
    ch = _channel
    if ch is None:
        raise none_reported()
    return ch.segments_of(rank, pid, wait)


def live() -> tuple[WorkerReport, ...]:
    """This process's workers alive now; () at once when none ever reported."""
    ch = _channel
    return ch.live() if ch is not None and ch._seen else ()


def report_from_worker() -> bool:
    """In a spawned worker (or any process the kernel started): report this process's
    figures to the kernel, as forked workers do by themselves. True when the kernel's
    channel was found (``JUPYTER_GPUMEM_WORKERS`` in the environment)."""
    global _reporter
    if _reporter is not None:
        return True
    address = os.environ.get(WORKERS_ENV, "")
    if not address or not os.path.exists(address):
        return False
    spawn_index()  # while the worker's function runs: its index, for its last report too
    _reporter = WorkerReporter(DatagramSender(address), "spawn")
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:  # a multiprocessing child exits through os._exit: no atexit
        mp_util.Finalize(None, _reporter.final, exitpriority=100)
    return True
