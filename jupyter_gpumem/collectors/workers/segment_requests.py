"""A worker's segment map on request (``%gpumem segments --rank N``), through files.

The kernel asks; the worker answers from its reporter thread; both ways go through the
channel's private directory (mode 0700), with the writer, reader and checks of
``oom.py``. No port, socket or signal of ours:

- **The request**: the kernel writes ``req-<pid>.json`` (``{"v": 1, "nonce": <32 hex
  digits>}``, under a temporary name, then renamed; a newer request replaces an older
  one). The worker's reporter looks for it once a tick (every 0.25 s): one ``access``
  call, about a microsecond, the only cost while nobody asks.
- **The answer**: the worker reads the request once (then deletes it), takes its
  allocator snapshot (the backend's ``raw_snapshot``: ``torch.cuda.memory._snapshot()``,
  taken in the reporter thread, between the worker's own allocations, under the
  allocator's lock) and writes its segments and blocks, every device's, as compact JSON
  to ``seg-<pid>-<nonce>.json``. Past :data:`~.oom.SNAPSHOT_LIMIT` each run of
  adjacent live blocks becomes one block (*trimmed*); still too large, or no CUDA yet,
  the answer says so in a word.
- **The kernel** waits for that one name at most :data:`ANSWER_WAIT` seconds (looking
  every 10 ms), reads it once, deletes it and checks it field by field: the nonce it
  sent, the pid, each segment and block (``oom.parse_segments``). A file that
  fails is dropped (and deleted) and the kernel goes on waiting for the real answer
  until the deadline; with none by then, the refusal's reason is the answer
  (``Answer.refused``: ``rank 1 (pid 4242)'s answer was refused: its blocks cover 1 B of
  a segment of 1.00 TiB``). Answers of earlier requests (another nonce) are deleted unread
  when the next request is made; the request is deleted when nobody took it in time.

Both sides read, never trust: a name bound to the pid (and nonce), ``O_NOFOLLOW`` (no
symlink), a regular file of this user, a size cap, JSON checked field by field.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from ...log import logger
from ...model import AllocatorSnapshot, Segment
from .oom import (
    SNAPSHOT_LIMIT,
    BadFile,
    _merged,
    parse_segments,
    reduce_segments,
    take_file,
    write_file,
)

ANSWER_WAIT = 2.0  # seconds the kernel waits for a worker's answer, never longer
LOOK_EVERY = 0.01  # how often the kernel looks for the answer meanwhile (seconds)
REQUEST_LIMIT = 256  # bytes of a request file
MAX_DEVICES = 16
VERSION = 1
NONCE = re.compile(r"[0-9a-f]{32}")
ANSWER_NAME = re.compile(r"seg-([0-9]{1,7})-([0-9a-f]{32})\.json")
# What an answer may say instead of segments: a word, worded by the kernel.
ERRORS = ("no_cuda", "too_large")


def request_name(pid: int) -> str:
    return f"req-{pid}.json"


def answer_name(pid: int, nonce: str) -> str:
    return f"seg-{pid}-{nonce}.json"


def _dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def _nonce() -> str:
    return secrets.token_hex(16)


# -- the worker's side -------------------------------------------------------------------
class RequestWatch:
    """In a worker's reporter thread: answers the kernel's requests for its segments."""

    def __init__(self, directory: str, pid: int, backend: Any) -> None:
        self.directory = directory
        self.pid = pid
        self.backend = backend
        self.name = request_name(pid)
        self.path = os.path.join(directory, self.name)

    def poll(self) -> bool:
        """Once a tick: answer a pending request; False (one ``access`` call) when none."""
        if not os.access(self.path, os.F_OK):
            return False
        data = take_file(self.directory, self.name, REQUEST_LIMIT, "segments request")
        nonce = parse_request(data) if data is not None else None
        if nonce is None:
            return False
        raw = None
        if self.backend.cuda_ready():
            take = getattr(self.backend, "raw_snapshot", None)
            raw = take() if callable(take) else None
        doc = segments_answer(raw, nonce, self.pid)
        write_file(self.directory, answer_name(self.pid, nonce), doc)
        return True


def parse_request(data: bytes) -> str | None:
    """The request's nonce, or None (and a debug line) for anything else."""
    try:
        m = json.loads(data) if len(data) <= REQUEST_LIMIT else None
    except (ValueError, RecursionError):
        m = None
    nonce = m.get("nonce") if isinstance(m, dict) and m.get("v") == VERSION else None
    if not isinstance(nonce, str) or not NONCE.fullmatch(nonce):
        logger.debug("segments request dropped: not a request of this version")
        return None
    return nonce


def segments_answer(raw: dict[str, Any] | None, nonce: str, pid: int) -> bytes:
    """The answer file's bytes: every device's segments of ``raw``
    (``torch.cuda.memory._snapshot()``'s dict), trimmed to fit the cap if need be."""
    head: dict[str, Any] = {"v": VERSION, "nonce": nonce, "pid": pid}
    if raw is None:
        return _dumps({**head, "error": "no_cuda"})
    devices = sorted({int(s.get("device", 0)) for s in raw.get("segments", ())})[:MAX_DEVICES]
    doc = {
        **head,
        "devices": [[d, reduce_segments(raw, d, detail=True)] for d in devices],
        "trimmed": False,
    }
    data = _dumps(doc)
    if len(data) > SNAPSHOT_LIMIT:
        doc["devices"] = [[d, [_merged(s) for s in segs]] for d, segs in doc["devices"]]
        doc["trimmed"] = True
        data = _dumps(doc)
        if len(data) > SNAPSHOT_LIMIT:
            logger.debug("segments answer: %d bytes even trimmed: not sent", len(data))
            return _dumps({**head, "error": "too_large"})
    return data


# -- the kernel's side -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Answer:
    """What a worker answered: its snapshot, or a word (:data:`ERRORS`) instead; or,
    when only answers that failed the checks came, why the last one was refused."""

    snapshot: AllocatorSnapshot | None
    trimmed: bool = False
    error: str | None = None
    refused: str | None = None


def ask_segments(directory: str, pid: int, wait: float = ANSWER_WAIT) -> Answer | None:
    """Ask the worker ``pid`` for its segments and wait at most ``wait`` seconds; None
    when no answer came in time (an answer with ``refused`` when only answers that
    failed the checks came). May raise OSError (the request not written)."""
    deadline = time.monotonic() + wait
    drop_answers(directory, pid)  # of earlier requests: never shown for this one
    with contextlib.suppress(OSError):  # a request's temporary file left by a crash
        os.unlink(os.path.join(directory, f".{request_name(pid)}.tmp"))
    nonce = _nonce()
    write_file(directory, request_name(pid), _dumps({"v": VERSION, "nonce": nonce}))
    name = answer_name(pid, nonce)
    path = os.path.join(directory, name)
    refused: str | None = None
    try:
        while True:
            if os.path.lexists(path):  # a symlink too: take_file refuses and deletes it
                data = take_file(directory, name, SNAPSHOT_LIMIT, "segments answer")
                answer = checked_answer(data, nonce, pid) if data is not None else None
                if isinstance(answer, Answer):
                    return answer
                refused = answer or refused
            left = deadline - time.monotonic()
            if left <= 0:
                return None if refused is None else Answer(None, refused=refused)
            time.sleep(min(LOOK_EVERY, left))
    finally:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, request_name(pid)))  # nobody took it: gone


def drop_answers(directory: str, pid: int) -> None:
    """Delete the answers of this pid's earlier requests (answered after the kernel
    stopped waiting) and their temporary files: they are never read."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for n in names:
        m = ANSWER_NAME.fullmatch(n.removeprefix(".").removesuffix(".tmp"))
        if m is not None and int(m.group(1)) == pid:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, n))


def parse_answer(data: bytes, nonce: str, pid: int) -> Answer | None:
    """The answer, checked field by field; None (and a debug line) for anything else."""
    answer = checked_answer(data, nonce, pid)
    return answer if isinstance(answer, Answer) else None


def checked_answer(data: bytes, nonce: str, pid: int) -> Answer | str:
    """The answer, checked field by field; else why it was refused, in words (and a
    debug line)."""
    try:
        return _checked(data, nonce, pid)
    except BadFile as e:
        logger.debug("segments answer of pid %d dropped: %s", pid, e)
        return str(e)
    except Exception:
        logger.debug("segments answer of pid %d dropped", pid, exc_info=True)
        return "not an answer the kernel can read"


def _checked(data: bytes, nonce: str, pid: int) -> Answer:
    if len(data) > SNAPSHOT_LIMIT:
        raise BadFile(f"{len(data)} bytes long")
    try:
        m = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise BadFile(f"not JSON: {e}") from None
    if not isinstance(m, dict) or m.get("v") != VERSION or isinstance(m.get("v"), bool):
        raise BadFile("not an answer of this version")
    if m.get("nonce") != nonce:
        raise BadFile("the answer to another request")
    if m.get("pid") != pid or isinstance(m.get("pid"), bool):
        raise BadFile("another process's answer")
    if "error" in m:
        if m["error"] not in ERRORS:
            raise BadFile("bad error")
        return Answer(None, error=m["error"])
    devices, trimmed = m.get("devices"), m.get("trimmed")
    if not isinstance(devices, list) or len(devices) > MAX_DEVICES:
        raise BadFile("bad devices")
    if not isinstance(trimmed, bool):
        raise BadFile("bad trimmed")
    segments: list[Segment] = []
    seen: set[int] = set()
    n_blocks = [0]
    for entry in devices:
        if not (isinstance(entry, list) and len(entry) == 2):
            raise BadFile("bad device")
        device = entry[0]
        if not isinstance(device, int) or isinstance(device, bool) or not 0 <= device < 1 << 16:
            raise BadFile("bad device")
        if device in seen:
            raise BadFile("a device twice")
        seen.add(device)
        segments += parse_segments(entry[1], device, n_blocks)
    return Answer(AllocatorSnapshot(time=time.time(), segments=segments, tracking=False), trimmed)
