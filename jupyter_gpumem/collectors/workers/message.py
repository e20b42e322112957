"""A worker's report: what it holds, how often it comes, and the kernel's check of it.

The worker builds it (:func:`worker_message`: its allocator's figures, its pid, host and
rank) and a transport carries it: a datagram to the kernel's channel
(:mod:`.reporter`), a ``torch.distributed`` store's key (``collectors/distributed.py``)
or a Ray actor (``collectors/ray_workers.py``). Whatever carried it, the kernel takes it
only through :func:`parse_message`: any process of this user can send to the channel, so
each field is checked where the report arrives (types, ranges, string lengths, nesting)
and a clean copy is kept; what fails is dropped with a debug log line.

Reports are small JSON documents (under :data:`MAX_DATAGRAM` bytes: a datagram arrives
whole or not at all), sent at most every :data:`INTERVAL` seconds while the figures
change and every :data:`KEEPALIVE` seconds regardless; the kernel calls a worker
*silent* after :data:`SILENT_AFTER` seconds without one.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from typing import Any

from ...log import logger
from .oom import UNSHOWABLE, valid_name

WORKERS_ENV = "JUPYTER_GPUMEM_WORKERS"
INTERVAL = 0.25  # a worker sends at most this often while its figures change (seconds)
KEEPALIVE = 2.0  # and this often regardless, so that the kernel can tell it is alive
SILENT_AFTER = 3 * KEEPALIVE  # no report for this long and no last report: "silent"
MAX_WORKERS = 256  # reports kept by the kernel (the oldest exited ones go first)
MAX_DATAGRAM = 8192
MAX_DEVICES = 16
MAX_OOMS = 8
MAX_SNAPSHOTS = 4  # snapshot files one report names (oom.py)
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
    if snapshots:  # OOM snapshot files in the channel's directory (oom.py)
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
        rank = spawn_index()
    return rank, _env_int("WORLD_SIZE")


_SPAWN_INDEX: list[int] = []  # found once: a process's index does not change
_SPAWN_FILE = os.path.join("torch", "multiprocessing", "spawn.py")


def spawn_index() -> int | None:
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


# -- the kernel's check ----------------------------------------------------------------
_INT_FIELDS = ("allocated", "reserved", "peak_allocated", "peak_reserved", "ooms", "device_allocs")


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
        if not all(valid_name(n, out["pid"]) for n in names):
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
    # control characters, lone surrogates, bidi overrides: U+FFFD (oom.UNSHOWABLE)
    return v if v.isascii() and v.isprintable() else UNSHOWABLE.sub("\ufffd", v)


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
