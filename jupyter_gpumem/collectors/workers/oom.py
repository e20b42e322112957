"""A worker's out-of-memory snapshot, handed to the kernel as a file.

A worker's OOM observer (the one its :class:`~.reporter.WorkerReporter`'s collector
attaches, as the kernel's collector does) takes the worker's own allocator snapshot at the
failure: ``torch.cuda.memory._snapshot()``, which PyTorch lets an observer take (it calls
observers after releasing the allocator's lock). A snapshot does not fit a datagram, so
the worker reduces it to what a post-mortem needs (the failing device's segments with
their blocks: address, size, state; the request, free and total device memory, the cap;
the top allocation sites when the worker records them) and writes it as compact JSON into
the kernel's channel directory (mode 0700), a file of mode 0600 named
``oom-<pid>-<n>.json``, written under a temporary name and renamed, so that the kernel
never sees half of one. Its next report names the file.

The kernel reads the file once, size-capped (:data:`SNAPSHOT_LIMIT`), and deletes it
whatever it held; like a datagram it is read, never trusted: a name that is not a plain
``oom-<pid>-<n>.json`` of the reporting pid, a symlink, a file of another user or too
large, JSON that fails any check (types, ranges, a block outside its segment, blocks that
overlap or do not cover their segment) is dropped with a debug line on the
``jupyter_gpumem`` logger.

The same files carry a rank's segment map on request (:mod:`.segment_requests`): the
writer (:func:`write_file`), the reader (:func:`take_file`) and the checks of segments
and blocks (:func:`parse_segments`) are shared.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from collections import defaultdict
from typing import Any

from ...log import logger
from ...model import Segment, WorkerOomSnapshot
from ...model.snapshot import Block, BlockState
from ...units import format_bytes

SNAPSHOT_LIMIT = 4 << 20  # bytes of one snapshot file
MAX_SEGMENTS = 1 << 17
MAX_BLOCKS = 1 << 20  # in all segments
MAX_LINES = 10  # allocation sites kept
MAX_FILES = 8  # snapshot files a worker writes in its life (one per OOM, the first ones)
BYTES_LIMIT = 1 << 64
INDEX_LIMIT = 1 << 16
SITE_LIMIT = 256
NAME = re.compile(r"oom-([0-9]{1,7})-([0-9]{1,3})\.json")
_STATES = {"active_allocated": "a", "active_pending_free": "p", "active_awaiting_free": "p"}
_STATE_NAMES: dict[str, BlockState] = {
    "a": "active_allocated",
    "p": "active_pending_free",
    "i": "inactive",
}
# What a worker's text may not show as is (replaced by U+FFFD): control characters (they
# would break a report's lines), lone surrogates (JSON's "\ud800": no reply carrying one
# could be encoded) and the bidirectional overrides and isolates, U+202A-U+202E and
# U+2066-U+2069 (they reorder what follows them: "gpu0\u202eevil" shows as "gpu0live").
UNSHOWABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e\u2066-\u2069]")


# -- the worker's side -------------------------------------------------------------------
def write_snapshot(
    backend: Any, directory: str, device: int, requested: int, allowed: int, free: int, n: int
) -> str | None:
    """Called from the worker's OOM observer: write the snapshot file; its name, or None
    (no snapshot to take, or too large even trimmed). May raise: the caller swallows."""
    take = getattr(backend, "raw_snapshot", None)
    raw = take() if callable(take) else None
    if not raw:
        return None
    total = device_used = process_used = None
    for d in backend.read(True, True).devices:  # cudaMemGetInfo (and NVML) at the failure
        if d.index == device:
            total, device_used, process_used = d.total, d.device_used, d.process_used
    doc = reduce_snapshot(raw, device, requested, allowed, free)
    doc.update(total=total, device_used=device_used, process_used=process_used)
    data = _dumps(doc)
    if len(data) > SNAPSHOT_LIMIT:
        doc["segments"] = [_merged(s) for s in doc["segments"]]
        doc["trimmed"] = True
        data = _dumps(doc)
        if len(data) > SNAPSHOT_LIMIT:
            logger.debug("worker OOM snapshot: %d bytes even trimmed: not sent", len(data))
            return None
    name = f"oom-{os.getpid()}-{n}.json"
    write_file(directory, name, data)
    return name


def write_file(directory: str, name: str, data: bytes) -> None:
    """Write ``name`` (mode 0600) under a temporary name, then rename it: a reader never
    sees half of it, and a file already there is replaced whole. May raise."""
    tmp = os.path.join(directory, f".{name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.rename(tmp, os.path.join(directory, name))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def reduce_snapshot(
    raw: dict[str, Any], device: int, requested: int, allowed: int, free: int
) -> dict[str, Any]:
    """What the post-mortem needs of ``torch.cuda.memory._snapshot()``'s dict: the failing
    device's segments ``[address, size, expandable, pool, [[address, size, state]...]]``
    (state ``a`` live, ``p`` freed but in use by a stream, ``i`` free), and the top
    allocation sites of its live blocks when frames were recorded."""
    sites: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    segments = reduce_segments(raw, device, sites=sites)
    tracking = any(
        b.get("frames")
        for s in raw.get("segments", ())
        if s.get("device", 0) == device
        for b in s.get("blocks", ())
    )
    settings = raw.get("allocator_settings") or {}
    ranked = sorted(sites.items(), key=lambda kv: -kv[1][0])
    lines: list[list[Any]] = [[k, v[0], v[1]] for k, v in ranked]
    expandable = settings.get("expandable_segments")
    return {
        "v": 1,
        "device": device,
        "requested": requested,
        "allowed": allowed,
        "free": free,
        "segments": segments,
        "lines": lines[:MAX_LINES],
        "tracking": tracking,
        "expandable": bool(expandable) if expandable is not None else None,
        "trimmed": False,
    }


def reduce_segments(
    raw: dict[str, Any],
    device: int,
    sites: dict[str, list[int]] | None = None,
    detail: bool = False,
) -> list[list[Any]]:
    """One device's segments of ``torch.cuda.memory._snapshot()``'s dict, compact:
    ``[address, size, expandable, pool, [[address, size, state]...]]``. With ``detail``
    each block also carries its requested size and each segment its stream (the segment
    map shows both); ``sites`` sums live blocks by allocation site where frames were
    recorded."""
    segments: list[list[Any]] = []
    for s in raw.get("segments", ()):
        if s.get("device", 0) != device:
            continue
        blocks: list[list[Any]] = []
        for b in s.get("blocks", ()):
            state = _STATES.get(b["state"], "i")
            block: list[Any] = [b["address"], b["size"], state]
            if detail:
                block.append(min(int(b.get("requested_size") or 0), b["size"]))
            blocks.append(block)
            frames = b.get("frames")
            if frames and sites is not None and state == "a":
                acc = sites[_site(frames)]
                acc[0] += b["size"]
                acc[1] += 1
        pool = "s" if s.get("segment_type") == "small" else "l"
        seg: list[Any] = [s["address"], s["total_size"], bool(s.get("is_expandable")), pool, blocks]
        if detail:
            seg.append(int(s.get("stream") or 0))
        segments.append(seg)
    return segments


def _site(frames: list[dict[str, Any]]) -> str:
    """The innermost frame outside torch itself: ``train.py:42 forward``."""
    pick = frames[0]
    for f in frames:
        name = str(f.get("filename", ""))
        if f"{os.sep}torch{os.sep}" not in name and not name.startswith("??"):
            pick = f
            break
    where = os.path.basename(str(pick.get("filename", "?")))
    return f"{where}:{pick.get('line', 0)} {pick.get('name', '')}"[:SITE_LIMIT]


def _merged(seg: list[Any]) -> list[Any]:
    """The segment with each run of adjacent live blocks as one block: its free runs and
    allocated bytes unchanged (the trimming)."""
    out: list[list[Any]] = []
    for b in seg[4]:
        last = out[-1] if out else None
        if last is not None and b[2] == "a" == last[2] and last[0] + last[1] == b[0]:
            last[1] += b[1]
            if len(b) > 3:  # the requested sizes add up too
                last[3] += b[3]
        else:
            out.append(list(b))
    return [*seg[:4], out, *seg[5:]]


def _dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


# -- the kernel's side -------------------------------------------------------------------
class BadFile(Exception):
    """Why a file from the channel's directory was refused."""


def valid_name(name: Any, pid: int) -> bool:
    """A plain ``oom-<pid>-<n>.json`` of the reporting worker: no path at all."""
    m = NAME.fullmatch(name) if isinstance(name, str) else None
    return m is not None and int(m.group(1)) == pid


def read_snapshot(directory: str, name: str, pid: int) -> WorkerOomSnapshot | None:
    """Read the file once and delete it, whatever it holds; None (and a debug line) for
    anything but a valid snapshot."""
    if not valid_name(name, pid):
        logger.debug("worker OOM snapshot refused: bad name %r", name)
        return None
    data = take_file(directory, name, SNAPSHOT_LIMIT, "worker OOM snapshot")
    if data is None:
        return None
    try:
        return parse_snapshot(data)
    except BadFile as e:
        logger.debug("worker OOM snapshot %s dropped: %s", name, e)
    except Exception:
        logger.debug("worker OOM snapshot %s dropped", name, exc_info=True)
    return None


def take_file(directory: str, name: str, limit: int, what: str) -> bytes | None:
    """Read the plain file ``name`` of the directory once and delete it, whatever it
    holds; None (and a debug line naming ``what``) when it is missing, a symlink, not a
    regular file, another user's or longer than ``limit`` bytes. The caller checked the
    name (no path in it)."""
    path = os.path.join(directory, name)
    try:
        return _read(path, limit)
    except (OSError, BadFile) as e:
        logger.debug("%s %s refused: %s", what, name, e)
        return None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # read once: a symlink itself, never its target


def _read(path: str, limit: int) -> bytes:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)  # a symlink: ELOOP
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadFile("not a regular file")
        if st.st_uid != os.getuid():
            raise BadFile("another user's file")
        if st.st_size > limit:
            raise BadFile(f"{st.st_size} bytes long")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise BadFile("grew past the limit while read")
        return data
    finally:
        os.close(fd)


def parse_snapshot(data: bytes) -> WorkerOomSnapshot:
    """The file's JSON, checked field by field (raises BadFile)."""
    if len(data) > SNAPSHOT_LIMIT:
        raise BadFile(f"{len(data)} bytes long")
    try:
        m = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise BadFile(f"not JSON: {e}") from None
    if not isinstance(m, dict) or m.get("v") != 1 or isinstance(m.get("v"), bool):
        raise BadFile("not a snapshot of this version")
    device = _int(m.get("device"), INDEX_LIMIT, "device")
    segments = parse_segments(m.get("segments"), device, [0])
    lines = m.get("lines")
    if not isinstance(lines, list) or len(lines) > MAX_LINES:
        raise BadFile("bad lines")
    rows = []
    for r in lines:
        if not (isinstance(r, list) and len(r) == 3 and isinstance(r[0], str)):
            raise BadFile("bad line")
        if len(r[0]) > SITE_LIMIT:
            raise BadFile("bad line")
        site = r[0] if r[0].isprintable() else UNSHOWABLE.sub("\ufffd", r[0])
        rows.append((site, _int(r[1], BYTES_LIMIT, "bytes"), _int(r[2], BYTES_LIMIT, "blocks")))
    for key in ("tracking", "trimmed"):
        if not isinstance(m.get(key), bool):
            raise BadFile(f"bad {key}")
    expandable = m.get("expandable")
    if expandable is not None and not isinstance(expandable, bool):
        raise BadFile("bad expandable")
    return WorkerOomSnapshot(
        device=device,
        requested=_int(m.get("requested"), BYTES_LIMIT, "requested"),
        allowed=_int(m.get("allowed"), BYTES_LIMIT, "allowed"),
        free=_int(m.get("free"), BYTES_LIMIT, "free"),
        total=_int(m.get("total"), BYTES_LIMIT, "total", optional=True),
        device_used=_int(m.get("device_used"), BYTES_LIMIT, "device_used", optional=True),
        process_used=_int(m.get("process_used"), BYTES_LIMIT, "process_used", optional=True),
        segments=tuple(segments),
        lines=tuple(rows),
        tracking=m["tracking"],
        expandable_segments=expandable,
        trimmed=m["trimmed"],
    )


def parse_segments(segs: Any, device: int, n_blocks: list[int]) -> list[Segment]:
    """One device's compact segments (:func:`reduce_segments`' shape), checked: sizes
    and addresses in range, each block inside its segment, blocks sorted without overlap
    that cover their segment exactly (as PyTorch's do: a segment is split into its
    blocks), no empty segment or block, at most MAX_SEGMENTS segments and MAX_BLOCKS
    blocks (``n_blocks[0]`` counts the blocks of every device of one file). Raises
    BadFile, whose message says what is wrong in words."""
    if not isinstance(segs, list) or len(segs) > MAX_SEGMENTS:
        raise BadFile("bad segments")
    segments: list[Segment] = []
    for s in segs:
        if not (isinstance(s, list) and len(s) in (5, 6) and isinstance(s[4], list)):
            raise BadFile("bad segment")
        address, size = _int(s[0], BYTES_LIMIT, "address"), _int(s[1], BYTES_LIMIT, "size")
        if size == 0:
            raise BadFile("a segment of 0 B")
        if not isinstance(s[2], bool) or s[3] not in ("s", "l"):
            raise BadFile("bad segment")
        stream = _int(s[5], BYTES_LIMIT, "stream") if len(s) == 6 else 0
        n_blocks[0] += len(s[4])
        if n_blocks[0] > MAX_BLOCKS:
            raise BadFile("too many blocks")
        blocks: list[Block] = []
        at, allocated, requested, covered = address, 0, 0, 0
        for b in s[4]:
            if not (isinstance(b, list) and len(b) in (3, 4) and b[2] in _STATE_NAMES):
                raise BadFile("bad block")
            ba, bs = _int(b[0], BYTES_LIMIT, "address"), _int(b[1], BYTES_LIMIT, "size")
            if bs == 0:
                raise BadFile("a block of 0 B")
            if ba < at or ba + bs > address + size:  # sorted, no overlap, inside
                raise BadFile("block outside its segment")
            covered += bs
            asked = _int(b[3], bs + 1, "requested size") if len(b) == 4 else bs
            at = ba + bs
            state: BlockState = _STATE_NAMES[b[2]]
            if b[2] == "a":
                allocated += bs
                requested += asked
            blocks.append(Block(address=ba, size=bs, requested_size=asked, state=state, frames=[]))
        if covered != size:  # inside and without overlap: a gap, or a segment left short
            raise BadFile(
                f"its blocks cover {format_bytes(covered)} of a segment of {format_bytes(size)}"
            )
        segments.append(
            {
                "device": device,
                "address": address,
                "total_size": size,
                "allocated_size": allocated,
                "active_size": allocated,
                "requested_size": requested,
                "stream": stream,
                "segment_type": "small" if s[3] == "s" else "large",
                "is_expandable": s[2],
                "blocks": blocks,
            }
        )
    return segments


def _int(v: Any, high: int, what: str, optional: bool = False) -> Any:
    if v is None and optional:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < high:
        raise BadFile(f"bad {what}")
    return v
