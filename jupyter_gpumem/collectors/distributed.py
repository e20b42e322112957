"""Ranks on other hosts report through their job's own ``torch.distributed`` store.

When the kernel is a member of a process group (rank 0 of a Gloo/NCCL job whose other
ranks run elsewhere), the other ranks' figures travel through the group's key-value store,
the one ``init_process_group`` already set up: no other connection, no port of our own.

- A rank calls :func:`report_to_store` (``jupyter_gpumem.report_to_store()``) once after
  ``init_process_group``: a daemon thread then writes its figures to the key
  ``jupyter_gpumem/rank/<rank>`` when they change (at most every ``INTERVAL`` seconds,
  and every ``KEEPALIVE`` seconds regardless), and a last time at exit. The same message
  as a forked worker's, ``via: "store"``.
- The kernel calls :func:`watch_store` (``%gpumem workers watch``) once: a daemon thread
  reads the other ranks' keys every ``INTERVAL`` seconds (``check``, which never waits,
  then ``multi_get``) and hands each new value to the kernel's worker channel. A cell's
  begin and end never touch the store, so a slow or dead store never blocks a cell; the
  figures a cell's report shows are at most ``INTERVAL`` seconds old.

A rank's peak is its process-wide peak since it started (the kernel cannot reset another
host's counter at a cell's start), shown as an upper bound for ranks that started before
the cell.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..log import logger
from ..units import shown
from .workers.kernel_channel import WorkerChannel
from .workers.message import INTERVAL, parse_message
from .workers.process import channel
from .workers.reporter import WorkerReporter

PREFIX = "jupyter_gpumem/rank/"


def key(rank: int) -> str:
    return f"{PREFIX}{rank}"


def _group(store: Any, rank: int | None) -> tuple[Any, int, int]:
    """The store, this rank and the world size: given, or the default group's."""
    dist = sys.modules.get("torch.distributed")
    initialized = dist is not None and dist.is_available() and dist.is_initialized()
    if store is None:
        if not initialized:
            raise RuntimeError(
                "no process group: call torch.distributed.init_process_group first, or pass "
                "the job's store (store=...)"
            )
        store = dist.distributed_c10d._get_default_store()  # type: ignore[union-attr]
    if rank is None:
        if not initialized:
            raise RuntimeError("no process group to take the rank from: pass rank=...")
        rank = int(dist.get_rank())  # type: ignore[union-attr]
    world = int(dist.get_world_size()) if initialized else 0  # type: ignore[union-attr]
    return store, int(rank), world


class StoreSender:
    """A rank's reports, written to its key of the store."""

    def __init__(self, store: Any, rank: int) -> None:
        self.store = store
        self.rank = rank

    def __call__(self, msg: dict[str, Any], final: bool) -> bool:
        msg = {**msg, "rank": self.rank}
        try:
            self.store.set(key(self.rank), json.dumps(msg, separators=(",", ":")))
        except Exception:  # the job's store is gone: the job is ending
            logger.debug("store report failed", exc_info=True)
            return False
        return True


_reporter: WorkerReporter | None = None


def report_to_store(store: Any = None, rank: int | None = None) -> WorkerReporter:
    """In a rank of a ``torch.distributed`` job: report this process's figures through
    the job's store (the default group's unless ``store`` is given). Idempotent."""
    global _reporter
    if _reporter is not None:
        return _reporter
    store, rank, _ = _group(store, rank)
    reporter = WorkerReporter(StoreSender(store, rank), "store")
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:  # a multiprocessing child exits through os._exit: no atexit
        mp_util.Finalize(None, reporter.final, exitpriority=100)
    _reporter = reporter
    return reporter


class StoreWatcher:
    """The kernel's reader of the other ranks' keys."""

    def __init__(self, channel: WorkerChannel, store: Any, ranks: Sequence[int]) -> None:
        self.channel = channel
        self.store = store
        self.ranks = list(ranks)
        self.error: str | None = None
        self._seen: dict[str, bytes] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpumem-store", daemon=True)

    def start(self) -> StoreWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
                self.error = None
            except Exception as e:  # the store went away (the job ended): keep trying
                self.error = f"{type(e).__name__}: {e}"
                logger.debug("reading the store failed", exc_info=True)
            self._stop.wait(INTERVAL)

    def poll(self) -> int:
        """Read the ranks' keys once; hand new values to the channel. How many were new."""
        present = [k for k in map(key, self.ranks) if self.store.check([k])]
        if not present:
            return 0
        values = self.store.multi_get(present)
        now = time.time()
        new = 0
        for k, raw in zip(present, values, strict=True):
            data = bytes(raw)
            if self._seen.get(k) == data:
                continue  # unchanged: not a new report (a stopped rank turns silent)
            self._seen[k] = data
            msg = parse_message(data)
            if msg is not None and msg["via"] == "store":
                self.channel.take(msg, now)
                new += 1
        return new


_watcher: StoreWatcher | None = None


def watch_store(
    store: Any = None, ranks: Sequence[int] | None = None, rank: int | None = None
) -> StoreWatcher:
    """In the kernel, a member of the job: show the other ranks' figures in measured cells
    and the panel. ``ranks``: whose keys to read (default: every rank but this one)."""
    global _watcher
    store, me, world = _group(store, rank)
    if ranks is None:
        if world <= 1:
            raise RuntimeError("the process group has one rank: pass ranks=[...] to watch")
        ranks = [r for r in range(world) if r != me]
    if not ranks or any(not isinstance(r, int) or r < 0 for r in ranks):
        raise ValueError(f"ranks must be non-negative integers, got {shown(list(ranks))}")
    if _watcher is not None:
        _watcher.stop()
    ch = channel()
    ch.open()
    _watcher = StoreWatcher(ch, store, ranks).start()
    return _watcher


def stop_watching() -> None:
    global _watcher
    if _watcher is not None:
        _watcher.stop()
        _watcher = None
