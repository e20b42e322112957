"""Worker processes report their own allocator figures to the kernel.

A notebook that trains on several GPUs starts workers (accelerate's ``notebook_launcher``,
``torch.multiprocessing.start_processes(..., start_method="fork")``). The kernel cannot
read another process's caching allocator; NVML only sees each worker's device total. So
the workers report, and only the workers of measured cells. Each part has its module:

- :mod:`.message`: the report itself: what a worker sends (:func:`worker_message`), how
  often, and the kernel's check of each field where it arrives (:func:`parse_message`:
  any process of this user can send to the channel, so a report is read, never trusted).
- :mod:`.reporter`: the worker's side: :class:`WorkerReporter`, a daemon thread in the
  worker that sends its figures when they change, and a last report at exit;
  :class:`DatagramSender` carries them to the kernel's channel on this host.
- :mod:`.kernel_channel`: the kernel's side: :class:`WorkerChannel`, a Unix datagram
  socket in a private directory and one thread that keeps each worker's latest report;
  a measured cell's begin and end turn them into :class:`~jupyter_gpumem.model.WorkerReport`
  records without waiting for any worker.
- :mod:`.process`: this process's channel (:func:`channel`, :func:`live`,
  :func:`segments_of`) or reporter (:func:`report_from_worker`), and the fork hooks that
  start a reporter in a process forked by a measured cell.
- :mod:`.oom` and :mod:`.segment_requests`: what does not fit a datagram (a worker's OOM
  snapshot, its segment map on request) travels as files in the channel's directory.

Ranks on other hosts report through a ``torch.distributed`` store
(``collectors/distributed.py``), Ray workers through a Ray actor
(``collectors/ray_workers.py``): the same reporter and the same check, another transport.
"""

from __future__ import annotations

from .kernel_channel import WorkerChannel, choose_worker
from .message import (
    INTERVAL,
    KEEPALIVE,
    MAX_DATAGRAM,
    MAX_WORKERS,
    SILENT_AFTER,
    WORKERS_ENV,
    parse_message,
    worker_message,
)
from .process import channel, live, report_from_worker, segments_of
from .reporter import DatagramSender, WorkerReporter

__all__ = [
    "INTERVAL",
    "KEEPALIVE",
    "MAX_DATAGRAM",
    "MAX_WORKERS",
    "SILENT_AFTER",
    "WORKERS_ENV",
    "DatagramSender",
    "WorkerChannel",
    "WorkerReporter",
    "channel",
    "choose_worker",
    "live",
    "parse_message",
    "report_from_worker",
    "segments_of",
    "worker_message",
]
