"""The kernel's side: the channel that keeps each worker's latest report.

A Unix datagram socket in a private directory (mode 0700: only this user's processes can
send), opened at the first measured cell, and one daemon thread blocked in ``recv`` that
keeps each worker's latest report, checked by :func:`~.message.parse_message`. A cell's
:meth:`WorkerChannel.begin` and :meth:`WorkerChannel.end` cost one flag and, once workers
have reported, one dict read: nothing waits for a worker, so a worker that dies or hangs
never blocks the kernel or the cell. Reports that came another way (a
``torch.distributed`` store, Ray) are handed in with :meth:`WorkerChannel.take`. The OOM
snapshot files that reports name (:mod:`.oom`) are read here, and a worker's segments are
asked for on request (:meth:`WorkerChannel.segments_of`, :mod:`.segment_requests`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ...errors import ActionRefused
from ...log import logger
from ...model import OomEvent, WorkerDevice, WorkerOomSnapshot, WorkerReport, WorkerSegments
from .message import (
    MAX_DATAGRAM,
    MAX_SNAPSHOTS,
    MAX_WORKERS,
    SILENT_AFTER,
    WORKERS_ENV,
    parse_message,
)
from .oom import SNAPSHOT_LIMIT, read_snapshot
from .segment_requests import ANSWER_WAIT, Answer, ask_segments

READ_WAIT = 2.0  # a cell's end waits at most this for a snapshot file being read


@dataclass(slots=True)
class _Asking:
    """A request for a worker's segments in flight: a second caller waits for its answer
    (one request file per worker: a second request would replace the first)."""

    done: threading.Event = field(default_factory=threading.Event)
    answer: Answer | None = None
    error: OSError | None = None


@dataclass(slots=True)
class _Seen:
    msg: dict[str, Any]
    received: float  # time.time() when it arrived
    before: dict[int, int] = field(default_factory=dict)  # device -> allocated at cell begin
    oom: WorkerOomSnapshot | None = None  # its last OOM snapshot, until a cell reports it
    pending: list[str] = field(default_factory=list)  # snapshot files named, not yet read


class WorkerChannel:
    """The kernel's end: keeps each worker's latest report; :meth:`begin` and :meth:`end`
    bracket a measured cell and turn the reports into :class:`WorkerReport` records."""

    def __init__(self) -> None:
        self.address: str | None = None
        self.measuring = False
        self.error: str | None = None
        self._dir: str | None = None
        self._sock: socket.socket | None = None
        self._seen: dict[tuple[str, int], _Seen] = {}
        self._lock = threading.Lock()
        self._reads = 0  # snapshot files being read outside the lock
        self._read_done = threading.Condition(self._lock)
        self._began = 0.0
        self.forks = 0  # processes this one forked (the fork hook counts them)
        self._forks_at_begin = 0
        self._owner = os.getpid()
        self._at_exit = False
        self._asking: dict[int, _Asking] = {}  # pid -> its segments request in flight

    # -- opening and closing -------------------------------------------------------
    def open(self) -> str | None:
        """Open once; None (and ``error``) where Unix sockets are not available."""
        if self.address is not None or self.error is not None:
            return self.address
        try:
            self._dir = tempfile.mkdtemp(prefix="gpumem-workers-")  # mode 0700
            path = os.path.join(self._dir, "s")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(path)
        except (OSError, AttributeError) as e:
            self.error = f"no channel for worker processes: {e}"
            self._remove_dir()
            return None
        self._sock = sock
        self.address = path
        os.environ[WORKERS_ENV] = path  # spawned workers find it here
        threading.Thread(
            target=self._receive, args=(sock,), name="gpumem-workers", daemon=True
        ).start()
        if not self._at_exit:
            atexit.register(self.close)
            self._at_exit = True
        return path

    def close(self) -> None:
        if os.getpid() != self._owner:
            return
        with self._lock:
            sock, self._sock = self._sock, None
            self._seen.clear()  # closed: its workers are forgotten
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the channel's thread, which leaves
            sock.close()
        if self.address is not None and os.environ.get(WORKERS_ENV) == self.address:
            os.environ.pop(WORKERS_ENV, None)
        self.address = None
        self._remove_dir()

    def _remove_dir(self) -> None:
        d, self._dir = self._dir, None
        if d:
            shutil.rmtree(d, ignore_errors=True)

    def forget_in_child(self) -> str | None:
        """In a forked child: drop the kernel's socket (the child is not the kernel)."""
        address = self.address
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                os.close(sock.detach())  # the path stays the kernel's
        self.address = None
        self.measuring = False
        self._seen = {}
        return address

    # -- receiving -----------------------------------------------------------------
    def _receive(self, sock: socket.socket) -> None:
        """The channel's thread: waits for reports (no CPU while none come), and takes
        them from the socket only under the lock, so that :meth:`end`, which drains what
        is queued under the same lock, never misses one that was in flight."""
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        while True:
            try:
                poller.poll()
            except OSError:
                return
            with self._lock:
                if self._sock is not sock:
                    return  # closed
                try:
                    self._drain(sock)
                except Exception:  # whatever comes, the channel's thread goes on
                    logger.debug("worker channel: draining failed", exc_info=True)
            self._read_pending()

    def _read_pending(self) -> None:
        """Read the OOM snapshot files that reports named (each once, then deleted),
        outside the lock: a file of a few MiB takes a fraction of a second to check."""
        with self._lock:
            if self._dir is None or not any(s.pending for s in self._seen.values()):
                return
            jobs = [(s, s.pending) for s in self._seen.values() if s.pending]
            for s, _ in jobs:
                s.pending = []
            directory = self._dir
            self._reads += 1
        try:
            for s, names in jobs:
                for name in names:
                    snap = read_snapshot(directory, name, s.msg["pid"])
                    if snap is not None:
                        s.oom = snap
        except Exception:
            logger.debug("worker OOM snapshot: reading failed", exc_info=True)
        finally:
            with self._lock:
                self._reads -= 1
                self._read_done.notify_all()

    def _drain(self, sock: socket.socket) -> None:
        """Take every queued report (called with the lock held)."""
        now = time.time()
        for _ in range(4 * MAX_WORKERS):  # bounded: the thread takes the rest
            try:
                data = sock.recv(MAX_DATAGRAM, socket.MSG_DONTWAIT)
            except OSError:  # nothing queued (BlockingIOError), or closed
                return
            try:  # one datagram's failure is its own: the others are taken
                msg = parse_message(data) if data else None  # b"": an empty datagram
                if msg is not None:
                    self._take(msg, now)
            except Exception:
                logger.debug("worker report dropped", exc_info=True)

    def take(self, msg: dict[str, Any], received: float | None = None) -> None:
        """Keep a worker's report that came another way (a ``torch.distributed`` store)."""
        with self._lock:
            self._take(msg, time.time() if received is None else received)

    def _take(self, msg: dict[str, Any], now: float) -> None:
        key = (msg["host"], msg["pid"])
        seen = self._seen.get(key)
        if seen is None:
            if len(self._seen) >= MAX_WORKERS:
                self._prune()
            seen = self._seen[key] = _Seen(msg, now)
        else:
            seen.msg, seen.received = msg, now
        names = msg.get("snapshots")
        if names and msg["via"] in ("fork", "spawn"):  # read by _read_pending
            seen.pending = [*seen.pending, *names][-MAX_SNAPSHOTS:]

    def _prune(self) -> None:
        while len(self._seen) >= MAX_WORKERS:  # drop the stalest
            del self._seen[min(self._seen, key=lambda k: self._seen[k].received)]

    # -- a measured cell -----------------------------------------------------------
    def begin(self) -> None:
        if self.address is None and self.error is None:
            self.open()
        self._began = time.time()
        self._forks_at_begin = self.forks
        self.measuring = True
        if self._seen:
            with self._lock:
                for s in self._seen.values():
                    s.before = {d["index"]: d["allocated"] for d in s.msg["devices"]}

    def end(self) -> tuple[WorkerReport, ...]:
        self.measuring = False
        sock = self._sock
        if sock is None or (self.forks == self._forks_at_begin and not self._seen):
            return ()  # no worker, none forked: the common cell costs two comparisons
        with self._lock:
            if self._sock is sock:
                self._drain(sock)  # what a worker sent just before the cell ended
        self._read_pending()  # snapshot files named just before it ended
        with self._lock:
            # the channel's thread may be reading one: a local file, bounded in size
            self._read_done.wait_for(lambda: self._reads == 0, timeout=READ_WAIT)
            if not self._seen:
                return ()
            now = time.time()
            out = []
            for key, s in list(self._seen.items()):
                report = _report(s, self._began, now)
                out.append(report)
                s.oom = None  # its post-mortem shows in this cell's report
                if report.status != "running":
                    del self._seen[key]  # reported for good
        return _ordered(out)

    def live(self) -> tuple[WorkerReport, ...]:
        """The workers no measured cell has reported as ended yet, with their latest
        figures: what the panel shows. Nothing is consumed."""
        if not self._seen:
            return ()
        now = time.time()
        with self._lock:
            out = [_report(s, self._began, now) for s in self._seen.values()]
        return _ordered(out)

    # -- a worker's segments, on request ------------------------------------------
    def segments_of(
        self,
        rank: int | None = None,
        pid: int | None = None,
        wait: float = ANSWER_WAIT,
    ) -> WorkerSegments:
        """Ask a worker (by rank, or pid) for its allocator's segments and wait at most
        ``wait`` seconds. Raises :class:`ActionRefused` with one sentence when it can't:
        no such worker, one that exited, one of a store or of Ray (no shared directory),
        no answer in time."""
        now = time.time()
        with self._lock:
            directory = self._dir if self._sock is not None else None
            found = [(_report(s, self._began, now), s.msg["started"]) for s in self._seen.values()]
        worker, note = choose_worker(found, rank, pid)
        if directory is None:
            raise ActionRefused(f"{worker.label} can't be asked: the channel is closed")
        answer = self._ask(directory, worker, wait)
        if answer is None:
            raise ActionRefused(f"{worker.label} did not answer within {wait:g} s")
        if answer.refused is not None:  # only answers that failed the checks came
            raise ActionRefused(f"{worker.label}'s answer was refused: {answer.refused}")
        if answer.error == "no_cuda":
            raise ActionRefused(
                f"{worker.label} has not initialised CUDA: its allocator holds no segment"
            )
        if answer.error is not None or answer.snapshot is None:
            raise ActionRefused(
                f"{worker.label}'s snapshot is too large to hand over (over "
                f"{SNAPSHOT_LIMIT >> 20} MiB even with its live blocks merged)"
            )
        return WorkerSegments(worker, answer.snapshot, answer.trimmed, note)

    def _ask(self, directory: str, worker: WorkerReport, wait: float) -> Answer | None:
        with self._lock:
            asking = self._asking.get(worker.pid)
            mine = asking is None
            if asking is None:
                asking = self._asking[worker.pid] = _Asking()
        if not mine:  # another caller's request: its answer, within the same deadline
            asking.done.wait(wait)
        else:
            try:
                asking.answer = ask_segments(directory, worker.pid, wait)
            except OSError as e:
                asking.error = e
            finally:
                asking.done.set()
                with self._lock:
                    self._asking.pop(worker.pid, None)
        if asking.error is not None:
            raise ActionRefused(
                f"can't ask {worker.label}: {asking.error.strerror or asking.error}"
            )
        return asking.answer


def choose_worker(
    found: list[tuple[WorkerReport, float]], rank: int | None, pid: int | None
) -> tuple[WorkerReport, str]:
    """The worker to ask for its segments among those that reported (each with the time
    it started), and a note when several live ones share the rank (two jobs): the most
    recently started is taken. Raises :class:`ActionRefused` with the reason one can't
    be asked."""
    if not found:
        raise none_reported()
    picked = [
        (w, t)
        for w, t in found
        if (rank is None or w.rank == rank) and (pid is None or w.pid == pid)
    ]
    if not picked:
        if pid is not None:
            other = [w for w, _ in found if w.pid == pid]
            if other:
                raise ActionRefused(f"pid {pid} reports rank {other[0].rank}, not rank {rank}")
            raise ActionRefused(f"no worker process with pid {pid} has reported")
        ranks = sorted({w.rank for w, _ in found if w.rank is not None})
        known = ", ".join(map(str, ranks)) if ranks else "none"
        raise ActionRefused(
            f"no worker process with rank {rank} has reported (ranks reporting: {known})"
        )
    askable = [(w, t) for w, t in picked if _askable(w)]
    if not askable:
        w = max(picked, key=lambda wt: wt[1])[0]
        raise ActionRefused(_why_not(w))
    askable.sort(key=lambda wt: wt[1])
    w = askable[-1][0]
    note = ""
    if len(askable) > 1:
        pids = ", ".join(str(x.pid) for x, _ in askable)
        note = (
            f"{len(askable)} live worker processes report rank {rank} (pids {pids}): this is "
            f"pid {w.pid}, the most recently started (--pid picks another)"
        )
    return w, note


def none_reported() -> ActionRefused:
    return ActionRefused(
        "no worker process has reported: processes forked by a measured cell report by "
        "themselves, spawned ones after jupyter_gpumem.report_worker()"
    )


def _askable(w: WorkerReport) -> bool:
    return (
        w.via in ("fork", "spawn")
        and w.status != "exited"
        and w.host == socket.gethostname()
        and _alive(w.pid, w.host)
    )


def _why_not(w: WorkerReport) -> str:
    if w.via == "store":
        return (
            f"{w.label} on {w.host} reports through the torch.distributed store, which shares "
            "no directory with this kernel: its segments can't be asked for from here"
        )
    if w.via == "ray":
        return (
            f"{w.label} is a Ray worker, which shares no directory with this kernel: its "
            "segments can't be asked for from here"
        )
    if w.status == "exited":
        return f"{w.label} has exited: its allocator is gone"
    if w.host != socket.gethostname():
        return f"{w.label} runs on {w.host}, which shares no directory with this kernel"
    return f"{w.label} is gone: its process ended without a last report"


def _ordered(reports: list[WorkerReport]) -> tuple[WorkerReport, ...]:
    reports.sort(key=lambda w: (w.rank is None, w.rank or 0, w.host, w.pid))
    return tuple(reports)


def _report(s: _Seen, began: float, now: float) -> WorkerReport:
    m = s.msg
    final = bool(m["final"])
    age = now - s.received
    # A live worker is listed in every measured cell (it holds GPU memory for the
    # notebook); one that exited or went silent, once: in the first measured cell that
    # ends after its last report (the cell it ran in, or the next one).
    alive = final or (age < SILENT_AFTER and _alive(m["pid"], m["host"]))
    started_in_cell = m["started"] >= began
    return WorkerReport(
        pid=m["pid"],
        rank=m["rank"],
        world_size=m["world_size"],
        host=m["host"],
        status="exited" if final else "running" if alive else "silent",
        started_in_cell=started_in_cell,
        age=max(0.0, age),
        devices=tuple(
            WorkerDevice(
                index=d["index"],
                name=d["name"],
                allocated_before=0 if started_in_cell else s.before.get(d["index"], 0),
                allocated=d["allocated"],
                reserved=d["reserved"],
                peak_allocated=d["peak_allocated"],
                peak_reserved=d["peak_reserved"],
                ooms=d["ooms"],
                device_allocs=d["device_allocs"],
                peak_exact=started_in_cell,
            )
            for d in m["devices"]
        ),
        ooms=tuple(OomEvent(*e) for e in m["ooms"]),
        via=m["via"],
        oom_snapshot=s.oom,
    )


def _alive(pid: int, host: str) -> bool:
    if host != socket.gethostname():
        return True  # another host's process: only its reports can tell
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError, ValueError):
        return False  # gone, or a pid no process can have
    except OSError:
        return True
    return True
