"""IPython's quirks around cells, names and tracebacks, in one place.

- Cells are compiled under generated file names (ipykernel: ``<tmp>/ipykernel_<pid>/
  <hash of the code>.py``; plain IPython: ``<ipython-input-N-...>``);
  ``shell.compile._filename_map`` maps each name to the execution count it last ran as
  (re-running the same code in ipykernel reuses its name), and ``linecache`` has the source.
- The user's namespace also holds IPython's own names (``In``, ``_ih``, ``_i3``, ``_3``,
  ``exit``...): ``shell.user_ns_hidden`` lists them; ``Out``, ``_``, ``__`` and ``___`` hold
  outputs, which keep tensors alive.
- ``%gpumem free`` lets go of each place that keeps objects alive: a name, an output
  (``Out[N]`` is also ``_N``, and maybe ``_``; each in ``user_ns``, ``user_ns_hidden``, the
  display hook and the last execution result), the kept traceback.
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

from ..collectors.namespace import Place, Root

_HISTORY_NAME = re.compile(r"^_(?:i+|i?\d+|ih|oh|dh)$")
OUTPUT_NAMES = ("_", "__", "___")
_OUT_ITEM = re.compile(r"^Out\[(\d+)\]$")
_NUMBERED = re.compile(r"^_(\d+)$")
TRACEBACK = "the kept traceback"


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


def cell_sources(shell: Any) -> dict[int, str]:
    """Each execution count's cell as typed (IPython's raw input history; ``%%`` lines
    included, as the notebook has them)."""
    raw = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None) or []
    return {n: str(code) for n, code in enumerate(raw) if n and code}


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

    def places(self, optimizer_type: type | None) -> list[Place]:
        return places(self.shell, optimizer_type)

    def place(self, name: str) -> Place | None:
        return resolve(self.shell, name)

    def let_go(self, place: Place) -> None:
        let_go(self.shell, place)

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
        if name in OUTPUT_NAMES:
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


# -- what %gpumem free lets go of ----------------------------------------------------------
# Besides the user's names, IPython keeps what a cell shows: ``Out[N]`` (``_oh``, the
# history manager's ``output_hist``), ``_N``, and ``_``, ``__``, ``___``; each of these is in
# ``user_ns`` and again in ``user_ns_hidden`` (``shell.push(..., interactive=False)``), the
# display hook keeps ``_``, ``__``, ``___`` as attributes, and ``last_execution_result.result``
# holds the last value shown. IPython's own ``%xdel`` clears the same places.


def places(shell: Any, optimizer_type: type | None) -> list[Place]:
    """The user's names, the output history (``Out[N]``, ``_N``, ``_``...) and the kept
    traceback, each a place of its own."""
    out: list[Place] = []
    ns = shell.user_ns
    dh = getattr(shell, "displayhook", None)
    for root in namespace_roots(shell, optimizer_type):
        kind = "output" if root.via == "output history" else "name"
        if root.owner not in OUTPUT_NAMES:
            out.append(Place(root.owner, kind, (root,)))
    for name in OUTPUT_NAMES:  # in the namespace and, maybe another value, the display hook
        values = [v for v in (ns.get(name), getattr(dh, name, None)) if _shown(v)]
        if len(values) == 2 and values[0] is values[1]:
            values.pop()
        if values:
            roots = tuple(Root(name, v, via="output history") for v in values)
            out.append(Place(name, "output", roots))
    history = ns.get("Out") if isinstance(ns.get("Out"), dict) else {}
    for name, value in list(ns.items()):
        m = _NUMBERED.match(name)
        if m and _shown(value) and int(m.group(1)) in history:
            out.append(Place(name, "output", (Root(name, value, via="output history"),)))
    tb = traceback_roots(shell)
    if tb:
        out.append(Place(TRACEBACK, "traceback", tuple(tb)))
    return out


def _shown(value: Any) -> bool:
    """An output worth a place (IPython resets ``_`` and friends to ``""``)."""
    return value is not None and not (isinstance(value, str) and value == "")


def resolve(shell: Any, name: str) -> Place | None:
    """The place a user's ``NAME`` argument names: a variable, ``Out[N]``, ``_N``, ``_``."""
    ns = shell.user_ns
    m = _OUT_ITEM.match(name)
    if m:
        history = ns.get("Out")
        n = int(m.group(1))
        if isinstance(history, dict) and n in history:
            return Place(name, "output", (Root(name, history[n], via="output history"),))
        return None
    if name not in ns or not name.isidentifier():
        return None
    if name in OUTPUT_NAMES or _NUMBERED.match(name):
        return Place(name, "output", (Root(name, ns[name], via="output history"),))
    return Place(name, "name", (Root(name, ns[name]),))


def let_go(shell: Any, place: Place) -> None:
    """Drop the references ``place`` is (and IPython's copies of the same reference)."""
    if place.kind == "traceback":
        release_traceback(shell)
        return
    ns = shell.user_ns
    hidden = getattr(shell, "user_ns_hidden", {}) or {}
    owner = place.owner
    m = _OUT_ITEM.match(owner) or _NUMBERED.match(owner)
    if m:  # Out[N] and _N are the same entry
        n = int(m.group(1))
        history = ns.get("Out")
        obj = history.pop(n, None) if isinstance(history, dict) else None
        for where in (ns, hidden):
            if f"_{n}" in where:
                del where[f"_{n}"]
    elif owner in OUTPUT_NAMES:
        obj = ns.get(owner)
        if owner in ns:
            ns[owner] = ""
        if owner in hidden:
            hidden[owner] = ""
        dh = getattr(shell, "displayhook", None)
        if dh is not None and _shown(getattr(dh, owner, None)):
            if obj is None or not _shown(obj):
                obj = getattr(dh, owner)
            setattr(dh, owner, "")
    else:
        obj = ns.pop(owner, None)
        if hidden.get(owner) is obj:
            del hidden[owner]
    result = getattr(shell, "last_execution_result", None)
    if obj is not None and result is not None and getattr(result, "result", None) is obj:
        result.result = None


def _short(path: str) -> str:
    from ..model import short_path

    return short_path(path)
