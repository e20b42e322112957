"""Worker processes report their own allocator figures to the kernel.

A notebook that trains on several GPUs starts workers (accelerate's ``notebook_launcher``,
``torch.multiprocessing.start_processes(..., start_method="fork")``). The kernel cannot
read another process's caching allocator; NVML only sees each worker's device total. So
the workers report, and only the workers of measured cells:

- **The channel** (kernel side): a Unix datagram socket in a private directory (mode
  0700: only this user's processes can send), opened at the first measured cell, and one
  daemon thread blocked in ``recv`` that keeps each worker's latest report. A cell's begin
  and end cost one flag and, once workers have reported, one dict read: nothing waits for
  a worker, so a worker that dies or hangs never blocks the kernel or the cell.
- **fork**: ``os.register_at_fork`` hooks. A process forked while a measured cell runs
  starts a :class:`WorkerReporter`: a daemon thread that, once CUDA is up in the worker,
  sends the worker's figures when they change (at most every ``INTERVAL`` seconds, and
  every ``KEEPALIVE`` seconds regardless), and a last report at exit (multiprocessing's
  finalizers, which run also when the worker raises; ``atexit`` for other exits). The
  parent never touches CUDA: forking after CUDA started is PyTorch's own error.
  A process forked by the worker itself (a DataLoader worker) does not report.
- **spawn**: a spawned worker is a fresh interpreter that inherits nothing but the
  environment. ``JUPYTER_GPUMEM_WORKERS`` holds the channel's address; a worker that calls
  :func:`report_from_worker` (``jupyter_gpumem.report_worker()``) reports like a forked
  one. Without that call a spawned worker shows only as an NVML child process.
- **Reports** are small JSON datagrams (under 8 KiB: a datagram arrives whole or not at
  all). Sending never blocks: a full queue drops a periodic report; the last report is
  retried for up to 0.5 s
  (Linux queues only ``net.unix.max_dgram_qlen``, often 10, datagrams per socket).
- **Read, never trusted**: any process of this user can send to the channel. The kernel
  checks each field of a report where it arrives (:func:`parse_message`: types, ranges,
  string lengths, nesting) and keeps a clean copy; what fails is dropped with a debug log
  line, and no datagram can stop the channel's thread.

``distributed.py`` carries the same reports through a ``torch.distributed`` store for
ranks on other hosts. ``worker_requests.py`` asks a forked or spawned worker for its
segment map (:meth:`WorkerChannel.segments_of`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import select
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ActionRefused
from ..log import logger
from ..model import OomEvent, WorkerDevice, WorkerOomSnapshot, WorkerReport, WorkerSegments
from . import worker_oom, worker_requests

WORKERS_ENV = "JUPYTER_GPUMEM_WORKERS"
INTERVAL = 0.25  # a worker sends at most this often while its figures change (seconds)
KEEPALIVE = 2.0  # and this often regardless, so that the kernel can tell it is alive
SILENT_AFTER = 3 * KEEPALIVE  # no report for this long and no last report: "silent"
MAX_WORKERS = 256  # reports kept by the kernel (the oldest exited ones go first)
MAX_DATAGRAM = 8192
MAX_DEVICES = 16
MAX_OOMS = 8
MAX_SNAPSHOTS = 4  # snapshot files one report names (collectors/worker_oom.py)
READ_WAIT = 2.0  # a cell's end waits at most this for a snapshot file being read
VERSION = 1

# What a report may hold. Each field is checked where the report arrives, so that what the
# kernel keeps can be shown, sent and formatted without a second look.
MAX_BRACKETS = 48  # in a datagram: a report has 3 + MAX_DEVICES + MAX_OOMS at most
PID_LIMIT = 1 << 22  # Linux's PID_MAX_LIMIT: pid_max is at most this, and pids below it
BYTES_LIMIT = 1 << 64  # a byte figure (a size_t)
COUNT_LIMIT = 1 << 63  # a count: OOMs, cudaMalloc calls
INDEX_LIMIT = 1 << 16  # a device index
RANK_LIMIT = 1 << 31  # a rank, a world size
TIME_LIMIT = float(1 << 40)  # seconds since 1970: year ~36800
TEXT_LIMIT = 256  # characters of a host or device name (HOST_NAME_MAX 64, CUDA's 256)


# -- what a worker sends ---------------------------------------------------------------
def worker_message(
    collector: Any,
    started: float,
    final: bool,
    via: str,
    rank: int | None = None,
    snapshots: list[str] | None = None,
) -> dict[str, Any]:
    """The worker's figures now, as the datagram (or store value) carries them."""
    m = collector.measure(with_process=False, full=False)
    devices = [
        {
            "index": d.index,
            "name": d.name[:TEXT_LIMIT],  # the kernel drops a longer one
            "allocated": d.allocator.allocated,
            "reserved": d.allocator.reserved,
            "peak_allocated": d.allocator.peak_allocated,
            "peak_reserved": d.allocator.peak_reserved,
            "ooms": d.allocator.ooms,
            "device_allocs": d.allocator.device_allocs,
        }
        for d in m.devices
        if d.allocator is not None
    ][:MAX_DEVICES]
    rank_, world = _rank() if rank is None else (rank, _env_int("WORLD_SIZE"))
    msg = {
        "v": VERSION,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "rank": rank_,
        "world_size": world,
        "started": started,
        "time": m.time,
        "final": final,
        "via": via,
        "devices": devices,
        "ooms": [
            [e.device, e.requested, e.allowed, e.free] for e in list(collector.ooms)[-MAX_OOMS:]
        ],
    }
    if snapshots:  # OOM snapshot files in the channel's directory (worker_oom.py)
        msg["snapshots"] = snapshots[:MAX_SNAPSHOTS]
    return msg


def _env_int(name: str) -> int | None:
    v = os.environ.get(name, "")
    return int(v) if v.isdigit() else None


def _rank() -> tuple[int | None, int | None]:
    """torch.distributed's rank where the worker joined a group, else the launcher's
    environment (accelerate and torchrun set ``RANK``; ``LOCAL_RANK`` as a fallback)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:
        pass
    rank = _env_int("RANK")
    if rank is None:
        rank = _env_int("LOCAL_RANK")
    if rank is None:
        rank = _spawn_index()
    return rank, _env_int("WORLD_SIZE")


_SPAWN_INDEX: list[int] = []  # found once: a process's index does not change
_SPAWN_FILE = os.path.join("torch", "multiprocessing", "spawn.py")


def _spawn_index() -> int | None:
    """The index ``torch.multiprocessing.spawn`` (and ``start_processes``) gave this
    process: the first argument it passes the worker's function, ``i`` in the frame of its
    ``_wrap`` on the main thread's stack, which stays there while the function runs."""
    if _SPAWN_INDEX:
        return _SPAWN_INDEX[0]
    main = threading.main_thread().ident
    frame = sys._current_frames().get(main) if main is not None else None
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_wrap" and code.co_filename.endswith(_SPAWN_FILE):
            i = frame.f_locals.get("i")
            if type(i) is int and 0 <= i < RANK_LIMIT:
                _SPAWN_INDEX.append(i)
                return i
            return None
        frame = frame.f_back
    return None


class WorkerReporter:
    """Runs in a worker: sends its figures to the kernel (``send``: a datagram to the
    kernel's channel, or a ``torch.distributed`` store's key)."""

    def __init__(
        self, send: Callable[[dict[str, Any], bool], bool], via: str, started: float | None = None
    ) -> None:
        from . import Collector, make_backend

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
            worker_requests.RequestWatch(self.directory, self.pid, self.collector.backend)
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
        if self.directory is None or os.getpid() != self.pid or self._files >= worker_oom.MAX_FILES:
            return
        self._files += 1
        name = worker_oom.write_snapshot(
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
    _spawn_index()  # while the worker's function runs: its index, for its last report too
    _reporter = WorkerReporter(DatagramSender(address), "spawn")
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:  # a multiprocessing child exits through os._exit: no atexit
        mp_util.Finalize(None, _reporter.final, exitpriority=100)
    return True


# -- the kernel's side -----------------------------------------------------------------
@dataclass(slots=True)
class _Asking:
    """A request for a worker's segments in flight: a second caller waits for its answer
    (one request file per worker: a second request would replace the first)."""

    done: threading.Event = field(default_factory=threading.Event)
    answer: worker_requests.Answer | None = None
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
                    snap = worker_oom.read_snapshot(directory, name, s.msg["pid"])
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
        wait: float = worker_requests.ANSWER_WAIT,
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
        if answer.error == "no_cuda":
            raise ActionRefused(
                f"{worker.label} has not initialised CUDA: its allocator holds no segment"
            )
        if answer.error is not None or answer.snapshot is None:
            raise ActionRefused(
                f"{worker.label}'s snapshot is too large to hand over (over "
                f"{worker_oom.SNAPSHOT_LIMIT >> 20} MiB even with its live blocks merged)"
            )
        return WorkerSegments(worker, answer.snapshot, answer.trimmed, note)

    def _ask(
        self, directory: str, worker: WorkerReport, wait: float
    ) -> worker_requests.Answer | None:
        with self._lock:
            asking = self._asking.get(worker.pid)
            mine = asking is None
            if asking is None:
                asking = self._asking[worker.pid] = _Asking()
        if not mine:  # another caller's request: its answer, within the same deadline
            asking.done.wait(wait)
        else:
            try:
                asking.answer = worker_requests.ask_segments(directory, worker.pid, wait)
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
        raise _none_reported()
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


def _none_reported() -> ActionRefused:
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


def segments_of(
    rank: int | None = None, pid: int | None = None, wait: float = worker_requests.ANSWER_WAIT
) -> WorkerSegments:
    """This process's channel's :meth:`WorkerChannel.segments_of`; no channel is opened
    for it (none open: no worker has reported)."""
    ch = _channel
    if ch is None:
        raise _none_reported()
    return ch.segments_of(rank, pid, wait)


def _ordered(reports: list[WorkerReport]) -> tuple[WorkerReport, ...]:
    reports.sort(key=lambda w: (w.rank is None, w.rank or 0, w.host, w.pid))
    return tuple(reports)


def live() -> tuple[WorkerReport, ...]:
    """This process's workers alive now; () at once when none ever reported."""
    ch = _channel
    return ch.live() if ch is not None and ch._seen else ()


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


_INT_FIELDS = ("allocated", "reserved", "peak_allocated", "peak_reserved", "ooms", "device_allocs")
# Lone surrogates (JSON's "\ud800": no reply carrying one could be encoded) and control
# characters (they would break a report's lines).
_UNSHOWABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


class _Invalid(Exception):
    """Why a report was dropped."""


def parse_message(data: bytes | str) -> dict[str, Any] | None:
    """A worker's report, checked field by field and rebuilt from its known fields; None
    (and a debug log line) for anything else: a process of this user could send anything
    to the socket, so it is read, never trusted."""
    try:
        return _checked(data)
    except _Invalid as e:
        logger.debug("worker report dropped: %s", e)
    except Exception:  # a check that raised: the report is as bad
        logger.debug("worker report dropped", exc_info=True)
    return None


def _checked(data: bytes | str) -> dict[str, Any]:
    if len(data) > MAX_DATAGRAM:
        raise _Invalid(f"{len(data)} bytes long")
    # json's parser recurses once per bracket: a deeply nested datagram would end in a
    # RecursionError (or worse in a thread with a small stack). Counting brackets bounds
    # the depth before any parsing (brackets inside strings count too: names have few).
    if isinstance(data, str):
        brackets = data.count("[") + data.count("{")
    else:
        brackets = data.count(b"[") + data.count(b"{")
    if brackets > MAX_BRACKETS:
        raise _Invalid(f"{brackets} brackets")
    try:
        m = json.loads(data)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise _Invalid(f"not JSON: {e}") from None
    if not isinstance(m, dict) or not _is_int(m.get("v")) or m["v"] != VERSION:
        raise _Invalid("not a report of this version")
    via = _get(m, "via")
    if via not in ("fork", "spawn", "store", "ray"):  # "ray": collectors/ray_workers.py
        raise _Invalid("bad via")
    final = _get(m, "final")
    if not isinstance(final, bool):
        raise _Invalid("bad final")
    devices, ooms = _get(m, "devices"), _get(m, "ooms")
    if not isinstance(devices, list) or len(devices) > MAX_DEVICES:
        raise _Invalid("bad devices")
    if not isinstance(ooms, list) or len(ooms) > MAX_OOMS:
        raise _Invalid("bad ooms")
    out = {
        "v": VERSION,
        "pid": _int(m, "pid", 1, PID_LIMIT),
        "host": _text(m, "host"),
        "rank": _int(m, "rank", 0, RANK_LIMIT, optional=True),
        "world_size": _int(m, "world_size", 0, RANK_LIMIT, optional=True),
        "started": _time(m, "started"),
        "time": _time(m, "time"),
        "final": final,
        "via": via,
        "devices": [_device(d) for d in devices],
        "ooms": [_oom(e) for e in ooms],
    }
    names = m.get("snapshots")
    if names is not None:  # plain file names in the channel's directory, of this pid
        if not isinstance(names, list) or len(names) > MAX_SNAPSHOTS:
            raise _Invalid("bad snapshots")
        if not all(worker_oom.valid_name(n, out["pid"]) for n in names):
            raise _Invalid("bad snapshot name")
        out["snapshots"] = list(names)
    return out


def _get(m: dict[str, Any], key: str) -> Any:
    try:
        return m[key]
    except KeyError:
        raise _Invalid(f"no {key}") from None


def _int(m: dict[str, Any], key: str, low: int, high: int, optional: bool = False) -> Any:
    v = _get(m, key)
    if v is None and optional:
        return None
    if not _is_int(v) or not low <= v < high:
        raise _Invalid(f"bad {key}")
    return v


def _time(m: dict[str, Any], key: str) -> float:
    v = _get(m, key)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < TIME_LIMIT:
        raise _Invalid(f"bad {key}")  # NaN fails the comparison too
    return float(v)


def _text(m: dict[str, Any], key: str) -> str:
    v = _get(m, key)
    if not isinstance(v, str) or len(v) > TEXT_LIMIT:
        raise _Invalid(f"bad {key}")
    return v if v.isascii() and v.isprintable() else _UNSHOWABLE.sub("\ufffd", v)


def _device(d: Any) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise _Invalid("bad device")
    out = {"index": _int(d, "index", 0, INDEX_LIMIT), "name": _text(d, "name")}
    for key in _INT_FIELDS:
        out[key] = _int(d, key, 0, COUNT_LIMIT if key in ("ooms", "device_allocs") else BYTES_LIMIT)
    return out


def _oom(e: Any) -> list[int]:
    """[device, requested, allowed, free]"""
    if not isinstance(e, list) or len(e) != 4 or not all(map(_is_int, e)):
        raise _Invalid("bad OOM event")
    if not (0 <= e[0] < INDEX_LIMIT and all(0 <= x < BYTES_LIMIT for x in e[1:])):
        raise _Invalid("bad OOM event")
    return e


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# -- the process's fork hooks ----------------------------------------------------------
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
