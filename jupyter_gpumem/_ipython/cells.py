"""IPython's quirks around cells, names and tracebacks, in one place.

- Cells are compiled under generated file names (ipykernel: ``<tmp>/ipykernel_<pid>/
  <hash of the code>.py``; plain IPython: ``<ipython-input-N-...>``);
  ``shell.compile._filename_map`` maps each name to the execution count it last ran as
  (re-running the same code in ipykernel reuses its name), and ``linecache`` has the source.
- The user's namespace also holds IPython's own names (``In``, ``_ih``, ``_i3``, ``_3``,
  ``exit``...): ``shell.user_ns_hidden`` lists them; ``Out``, ``_``, ``__`` and ``___`` hold
  outputs, which keep tensors alive.
- After a failure IPython keeps the traceback in ``sys.last_traceback`` (and
  ``sys.last_value``/``sys.last_exc``), in ``shell.InteractiveTB.tb`` and in the failed
  cell's ``ExecutionResult``; the frames keep their locals alive.
"""

from __future__ import annotations

import linecache
import re
import sys
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import Any

from ..collectors.namespace import Root

_HISTORY_NAME = re.compile(r"^_(?:i+|i?\d+|ih|oh|dh)$")
_OUTPUT_NAMES = ("_", "__", "___")


class IPythonCells:
    """:class:`~jupyter_gpumem.analysis.sites.CellNames` for one shell."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell

    @property
    def _map(self) -> dict[str, int]:
        return getattr(getattr(self.shell, "compile", None), "_filename_map", None) or {}

    def execution_count(self, filename: str) -> int | None:
        n = self._map.get(filename)
        return int(n) if n is not None else None

    def line_text(self, filename: str, line: int) -> str:
        return linecache.getline(filename, line).strip()

    def files_of(self, execution_count: int) -> frozenset[str]:
        """The file names of a cell's code (one, unless the same count compiled twice)."""
        return frozenset(f for f, n in self._map.items() if n == execution_count)


class IPythonWorkspace:
    """:class:`~jupyter_gpumem.core.attribution.Workspace` of one IPython shell: its user
    namespace, cells, kept traceback and input transforms."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.cells = IPythonCells(shell)

    def roots(self, optimizer_type: type | None) -> list[Root]:
        return namespace_roots(self.shell, optimizer_type)

    def traceback_roots(self) -> list[Root]:
        return traceback_roots(self.shell)

    def release_traceback(self) -> int:
        return release_traceback(self.shell)

    def variables(self) -> list[tuple[str, Any]]:
        hidden = getattr(self.shell, "user_ns_hidden", {}) or {}
        return [(k, v) for k, v in list(self.shell.user_ns.items()) if k not in hidden]

    def namespace(self) -> dict[str, Any]:
        ns: dict[str, Any] = self.shell.user_ns
        return ns

    def python(self, raw: str) -> str:
        """The cell as Python (IPython's transforms: magics become calls)."""
        if not raw:
            return ""
        try:
            return str(self.shell.transform_cell(raw))
        except Exception:
            return raw


def namespace_roots(shell: Any, optimizer_type: type | None = None) -> list[Root]:
    """The user's own variables first (optimizers last among them, so parameters are
    attributed to their model), then IPython's output history (``Out[N]`` before its
    aliases ``_``, ``__``, ``___``)."""
    ns: dict[str, Any] = shell.user_ns
    hidden = getattr(shell, "user_ns_hidden", {}) or {}
    variables: list[Root] = []
    aliases: list[Root] = []
    for name, value in list(ns.items()):
        if name in _OUTPUT_NAMES:
            aliases.append(Root(name, value, via="output history"))
            continue
        if name in hidden or _HISTORY_NAME.match(name):
            continue
        if name.startswith("__") and name.endswith("__"):
            continue
        variables.append(Root(name, value))
    if optimizer_type is not None:
        variables.sort(key=lambda r: issubclass(type(r.obj), optimizer_type))
    outputs: list[Root] = []
    out = ns.get("Out")
    if isinstance(out, dict):
        for n in sorted(out, key=lambda k: (not isinstance(k, int), str(k))):
            outputs.append(Root(f"Out[{n}]", out[n], via="output history"))
    return variables + outputs + aliases


def _tracebacks() -> Iterator[TracebackType]:
    """The kept traceback and those of the exceptions chained to it."""
    value = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    seen: set[int] = set()
    tb = getattr(sys, "last_traceback", None)
    if tb is not None:
        seen.add(id(tb))
        yield tb
    depth = 0
    while isinstance(value, BaseException) and depth < 16:
        t = value.__traceback__
        if t is not None and id(t) not in seen:
            seen.add(id(t))
            yield t
        value = value.__cause__ or value.__context__
        depth += 1


_MACHINERY = ("IPython.", "ipykernel.", "jupyter_gpumem.")


def traceback_frames(shell: Any) -> list[FrameType]:
    """Frames of the kept traceback that have locals of their own: not the cell's
    module-level frame (its locals are the namespace itself), nor IPython's own frames that
    ran the cell (``run_code``)."""
    frames: list[FrameType] = []
    seen: set[int] = set()
    ns = getattr(shell, "user_ns", None)
    for tb in _tracebacks():
        cur: TracebackType | None = tb
        while cur is not None:
            f = cur.tb_frame
            module = f.f_globals.get("__name__") or ""
            if (
                id(f) not in seen
                and f.f_globals is not f.f_locals
                and f.f_locals is not ns
                and not module.startswith(_MACHINERY)
            ):
                seen.add(id(f))
                frames.append(f)
            cur = cur.tb_next
    return frames


def frame_label(f: FrameType, cells: IPythonCells) -> str:
    filename, line = f.f_code.co_filename, f.f_lineno
    count = cells.execution_count(filename)
    where = f"In[{count}] line {line}" if count is not None else f"{_short(filename)}:{line}"
    return f"{f.f_code.co_name}() at {where}"


def traceback_roots(shell: Any) -> list[Root]:
    cells = IPythonCells(shell)
    roots: list[Root] = []
    for f in traceback_frames(shell):
        label = frame_label(f, cells)
        try:
            local_vars = dict(f.f_locals)
        except Exception:
            continue
        for name, value in local_vars.items():
            roots.append(Root(f"traceback: {label}: {name}", value, via="traceback", path=name))
    return roots


def release_traceback(shell: Any) -> int:
    """Drop what IPython keeps of the last failure: ``sys.last_*``, the traceback in
    ``InteractiveTB`` and the failed result, and clear the frames' locals. Returns the
    number of frames cleared. The user's variables are untouched: the cell's own module-level
    frame, whose locals are the namespace, is never cleared."""
    cleared = 0
    for f in traceback_frames(shell):
        try:
            f.clear()
            cleared += 1
        except RuntimeError:  # a frame still executing (not the case after a failure)
            continue
        # Python <= 3.12 keeps a dict of the frame's locals once f_locals was read (the walk
        # read it); frame.clear() empties the frame but not that dict.
        try:
            snapshot = f.f_locals
        except Exception:
            continue
        if isinstance(snapshot, dict) and snapshot is not f.f_globals:
            snapshot.clear()
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            try:
                delattr(sys, name)
            except AttributeError:
                pass
    itb = getattr(shell, "InteractiveTB", None)
    if itb is not None and hasattr(itb, "tb"):
        itb.tb = None
    result = getattr(shell, "last_execution_result", None)
    if result is not None and getattr(result, "error_in_exec", None) is not None:
        result.error_in_exec = None
    return cleared


def _short(path: str) -> str:
    from ..model import short_path

    return short_path(path)
