"""What a dry run refuses to do outside the process, and what it lists that it cannot undo.

A dry run runs the cell's Python for real; only its tensors are fake. So while it runs,
in the thread that runs it, this module refuses what would change the world outside the
process: files opened for writing, appending or truncating (``torch.save``, ``np.save``,
a CSV log), deletes, renames and other changes to files, new processes (``subprocess``,
``os.system``, ``!`` lines), network connections. Python's audit hooks (PEP 578) see each
of these before it happens; the hook raises :class:`Refused`, so the call does not happen
(``torch.save`` opens its file before it pickles: the file stays as it was). A hook cannot
be removed, so one is installed the first time a dry run runs and acts only for the thread
and the time of a dry run; other threads of the kernel are not affected.

:class:`Refused` derives from ``BaseException``: a cell's ``except Exception`` does not
swallow it, and the run stops with one line (what, which file or command, the user's
line). A refusal the cell swallowed anyway (a bare ``except``) still stops the run
(:attr:`Guard.refused`).

What the cell's Python did that cannot be undone is listed (:meth:`Guard.undoable`):
iterators among the user's names that moved on (a data loader that lost a batch), and
lines printed (their values are the dry run's, not real ones).

Reads (datasets, configs, tokenizers), imports and their bytecode caches work as usual.
Writes to files that were opened before the dry run are not seen (no audit event).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

# open()'s flags that write: any of them refuses the open
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_WRITE_MODES = frozenset("wax+")
# paths whose writes are the interpreter's own, not the cell's
_HARMLESS = (os.devnull,)

# audit event -> (what it does, in words; index of the argument that names its target)
_FILES = {
    "os.remove": ("delete", 0),
    "os.rmdir": ("delete the folder", 0),
    "os.rename": ("rename", 0),
    "os.truncate": ("truncate", 0),
    "os.mkdir": ("make the folder", 0),
    "os.chmod": ("change the mode of", 0),
    "os.chown": ("change the owner of", 0),
    "os.symlink": ("make a link", 1),
    "os.link": ("make a link", 1),
    "os.utime": ("change the times of", 0),
    "shutil.copyfile": ("copy to", 1),
    "shutil.copytree": ("copy to", 1),
    "shutil.move": ("move", 0),
    "shutil.rmtree": ("delete the folder", 0),
    "shutil.make_archive": ("make the archive", 0),
    "shutil.unpack_archive": ("unpack", 0),
}
_PROCESSES = {
    "subprocess.Popen": 1,
    "os.system": 0,
    "os.exec": 0,
    "os.posix_spawn": 1,
    "os.spawn": 1,
    "os.fork": None,
    "os.forkpty": None,
    "pty.spawn": 0,
    "os.startfile": 0,
    "os.kill": None,
    "os.killpg": None,
}
# what a run may do to its own new scratch files (see Guard.scratch)
_SCRATCH_EVENTS = frozenset(
    {"open", "os.mkdir", "os.remove", "os.rmdir", "os.rename", "os.truncate", "os.chmod",
     "os.utime", "shutil.rmtree", "os.link", "os.symlink"}
)  # fmt: skip


# where an event's path is relative to a folder's descriptor (shutil.rmtree's way):
# event -> the argument index of the descriptor for each path argument
_DIR_FDS: dict[str, tuple[int | None, ...]] = {
    "os.remove": (1,),
    "os.rmdir": (1,),
    "os.mkdir": (2,),
    "os.rename": (2, 3),
    "os.chmod": (2,),
    "os.utime": (3,),
}


def _real(path: Any, dir_fd: Any = None) -> str | None:
    if not isinstance(path, (str, bytes, os.PathLike)):
        return None
    try:
        name = os.fsdecode(path)
        if isinstance(dir_fd, int) and dir_fd >= 0 and not os.path.isabs(name):
            name = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), name)
        return os.path.realpath(name)
    except (TypeError, ValueError, OSError):
        return None


_NETWORK = {"socket.connect": 1, "socket.sendto": 2, "socket.sendmsg": 2, "urllib.Request": 0}


class Refused(BaseException):
    """What a dry run would have done outside the process, refused: what (one plain
    line) and the user's line it was asked at."""

    def __init__(self, message: str, where: str | None) -> None:
        super().__init__(message + (f" at {where}" if where else ""))
        self.message = message
        self.where = where


def shown(value: Any, limit: int = 80) -> str:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, (list, tuple)):
        value = " ".join(shown(v, limit) for v in value)
    text = str(value)
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _refusal(event: str, args: tuple[Any, ...]) -> str | None:
    """The refusal's words for an audit event a dry run must not let happen, else None."""
    if event == "open":
        path, mode, flags = (*args, None, None, 0)[:3]
        writes = bool(isinstance(flags, int) and flags & _WRITE_FLAGS) or bool(
            isinstance(mode, str) and _WRITE_MODES & set(mode)
        )
        if not writes:
            return None
        name = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else None
        if name is not None and (f"{os.sep}__pycache__{os.sep}" in name or name in _HARMLESS):
            return None  # the import system's bytecode cache
        what = "append to" if isinstance(mode, str) and "a" in mode else "write"
        target = f"'{shown(name)}'" if name is not None else f"file descriptor {path}"
        how = repr(mode) if mode else f"flags {flags:#x}"
        return (
            f"a dry run writes no file: open({target}, {how}) to {what} it was refused; "
            "the file is as it was"
        )
    if event in _FILES:
        what, i = _FILES[event]
        fd = (_DIR_FDS.get(event) or (None,))[0]
        dir_fd = args[fd] if fd is not None and len(args) > fd else None
        target = shown(_real(args[i], dir_fd) or args[i]) if len(args) > i else "?"
        return f"a dry run changes no file: {event} ({what} '{target}') was refused"
    if event in _PROCESSES:
        at = _PROCESSES[event]
        command = f" `{shown(args[at])}`" if at is not None and len(args) > at else ""
        return f"a dry run starts no process and sends no signal: {event}{command} was refused"
    if event in _NETWORK:
        i = _NETWORK[event]
        target = f" to {shown(args[i])}" if len(args) > i else ""
        return f"a dry run opens no connection: {event}{target} was refused"
    return None


# the one hook's state: which thread a dry run runs in now, and where refusals go
_ACTIVE: Guard | None = None
_INSTALLED = False
_INSTALL_LOCK = threading.Lock()


def _hook(event: str, args: tuple[Any, ...]) -> None:
    guard = _ACTIVE
    if guard is None or guard.thread != threading.get_ident() or guard.busy:
        return
    guard.busy = True  # the guard's own work (the user's line) raises events too
    try:
        if guard.scratch(event, args):
            return
        line = _refusal(event, args)
        if line is None:
            return
        where, text = guard.where()
        if event in _PROCESSES and _PROCESSES[event] is None and text:
            line += f" (`{shown(text)}`)"  # os.fork has no command: the user's line has it
        guard.refused.append((line, where))
    finally:
        guard.busy = False
    raise Refused(line, where)


def _install() -> None:
    global _INSTALLED
    with _INSTALL_LOCK:
        if not _INSTALLED:
            sys.addaudithook(_hook)
            _INSTALLED = True


class _Counting:
    """``sys.stdout``/``sys.stderr`` while a dry run runs: what the run's thread writes is
    counted (and shown as usual); other threads' writes pass untouched."""

    def __init__(self, stream: Any, guard: Guard) -> None:
        self._stream = stream
        self._guard = guard
        self._thread = guard.thread
        self.lines = 0
        self.first: str | None = None

    def write(self, text: str) -> Any:
        if threading.get_ident() == self._thread and text and not self._guard.busy:
            self.lines += text.count("\n")
            if self.first is None and text.strip():
                self.first = text.strip().splitlines()[0]
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _position(obj: Any) -> object:
    """Where an iterator is, as something that changes when it moves on (None: can't tell)."""
    frame = getattr(obj, "gi_frame", None)
    if hasattr(obj, "gi_frame"):  # a generator: its frame's last instruction
        return None if frame is None else (frame.f_lasti, id(frame))
    yielded = getattr(obj, "_num_yielded", None)  # a DataLoader's iterator
    if isinstance(yielded, int):
        return yielded
    try:
        reduced = obj.__reduce__()
    except Exception:
        return None
    if isinstance(reduced, tuple) and len(reduced) > 2 and isinstance(reduced[2], int):
        return reduced[2]  # list, tuple, range and the like: the index
    return None


def _iterators(names: Iterable[tuple[str, Any]]) -> dict[str, tuple[Any, object]]:
    out: dict[str, tuple[Any, object]] = {}
    for name, value in names:
        if hasattr(type(value), "__next__") and not isinstance(value, type):
            try:
                out[name] = (value, _position(value))
            except Exception:
                continue
    return out


class Guard:
    """One dry run's refusals and what it could not undo. Use as a context manager around
    the run, in the thread that runs it (:func:`guarded`); ``where`` names the user's line
    running now and gives its text."""

    def __init__(self, where: Callable[[], tuple[str | None, str]]) -> None:
        self.where = where
        self.thread = threading.get_ident()
        self.busy = False
        self.refused: list[tuple[str, str | None]] = []  # (what, the user's line)
        self.moved: list[str] = []  # iterators among the user's names that moved on
        self.printed = 0
        self.first_printed: str | None = None
        import tempfile

        self.temp = os.path.realpath(tempfile.gettempdir()) + os.sep
        self.made: set[str] = set()  # new files and folders the run made under temp

    def scratch(self, event: str, args: tuple[Any, ...]) -> bool:
        """Whether the event only makes or changes the run's own new scratch files:
        libraries make temporary folders and files (``tempfile.mkdtemp``, ``mkstemp``)
        while a model is built; a new file or folder under the temporary folder may be made,
        and what the run made there may be written, renamed and deleted. Nothing that
        existed before the run is touched."""
        if event not in _SCRATCH_EVENTS:
            return False
        if event == "open" and args and isinstance(args[0], int):
            return True  # a descriptor opened before: its own open was the one to judge
        if event in ("os.link", "os.symlink"):  # a new link in a folder the run made
            link = _real(args[1]) if len(args) > 1 else None
            if link is None or os.path.lexists(link) or not self._ours(os.path.dirname(link)):
                return False
            self.made.add(link)
            return True
        fds = _DIR_FDS.get(event, ())
        paths = [
            _real(a, args[fd] if fd is not None and len(args) > fd else None)
            for a, fd in zip(
                args[: 2 if event == "os.rename" else 1], fds or (None, None), strict=False
            )
        ]
        if not paths or any(p is None for p in paths):
            return False
        if all(self._ours(p) for p in paths if p is not None):
            return True
        (path,) = paths[:1]
        assert path is not None
        new = event == "os.mkdir" or (
            event == "open"
            and isinstance(args[2] if len(args) > 2 else None, int)
            and args[2] & os.O_CREAT
            and args[2] & os.O_EXCL
        )
        inside = (path + os.sep).startswith(self.temp)
        if new and inside and not os.path.lexists(path):
            self.made.add(path)
            return True
        # tempfile opens the temporary folder itself with an opener that makes the file
        # (an audited open of its own, judged above); a folder is never written as a file
        return event == "open" and inside and os.path.isdir(path)

    def _ours(self, path: str) -> bool:
        return any(path == m or path.startswith(m + os.sep) for m in self.made)

    def quietly(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` as the tool's own work, not the cell's: its events are not refused
        and what it prints is not counted (a dry run's progress line)."""
        was, self.busy = self.busy, True
        try:
            return fn(*args)
        finally:
            self.busy = was

    def undoable(self) -> list[str]:
        """What the cell's Python did that a dry run cannot undo, one plain line each."""
        out = [
            f"not undone: the cell advanced `{name}` (an iterator: what it yielded in the "
            "dry run is gone, as a batch a data loader gave)"
            for name in self.moved
        ]
        left = [m for m in self.made if os.path.lexists(m)]
        if left:
            out.append(
                f"not undone: the run made {len(left)} new temporary file(s) or folder(s) "
                f"under {self.temp.rstrip(os.sep)} (its libraries' scratch; nothing that "
                "existed was touched)"
            )
        if self.printed:
            first = f" (first: {shown(self.first_printed, 60)!r})" if self.first_printed else ""
            out.append(
                f"not undone: the cell printed {self.printed} line"
                f"{'s' if self.printed != 1 else ''}{first}: values in it are the dry "
                "run's (a value read is 0), not the real run's"
            )
        return out


@contextlib.contextmanager
def guarded(
    where: Callable[[], tuple[str | None, str]], names: Iterable[tuple[str, Any]] = ()
) -> Iterator[Guard]:
    """Refuse writes outside the process while the body runs in this thread; count what it
    prints; compare the user's iterators (``names``: the namespace's pairs) before and
    after."""
    global _ACTIVE
    _install()
    guard = Guard(where)
    before = _iterators(names)
    outer = _ACTIVE
    out, err = sys.stdout, sys.stderr
    counting: list[Any] = [_Counting(out, guard), _Counting(err, guard)]
    sys.stdout, sys.stderr = counting
    _ACTIVE = guard
    try:
        yield guard
    finally:
        _ACTIVE = outer
        if sys.stdout is counting[0]:
            sys.stdout = out
        if sys.stderr is counting[1]:
            sys.stderr = err
        guard.printed = counting[0].lines + counting[1].lines
        guard.first_printed = counting[0].first or counting[1].first
        for name, (obj, position) in before.items():
            try:
                now = _position(obj)
            except Exception:
                continue
            if position is not None and now != position:
                guard.moved.append(name)
