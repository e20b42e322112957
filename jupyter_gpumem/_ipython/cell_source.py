"""A cell's source for a dry run, compiled and run as IPython runs cells, in a copy of the
user's namespace: what ``core/dry_run.py`` records for ``%%gpumem --dry-run`` and for each
value of ``--scan ... --dry-run`` (the :class:`~jupyter_gpumem.core.dry_run.Cell` it
takes). IPython's compile (its transforms, the cell's own file name, so that lines read
``In[N] line L``) and its namespace are handled here, beside the rest of IPython's quirks
(``cells.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..collectors.dry_run import FakeRun, Stopped, Workspaces, record
from .cells import IPythonCells

_MISSING = object()


class CellSource:
    """``source`` as a cell of ``shell`` (``first_line``: the line of the cell the source
    starts on: 2 below a ``%%gpumem`` line). Each :meth:`record` compiles it and runs it
    under the dry run in a shallow copy of the user's namespace; afterwards
    ``shell.user_ns`` holds exactly what it held: names the cell bound are gone, names it
    rebound (through functions' ``global``) get their objects back, and what it bound inside
    the user's objects is put back (``collectors/dry_run/keep.py``). Modules are named after
    the cell's names (those it had before and those it binds)."""

    def __init__(self, shell: Any, source: str, first_line: int = 1) -> None:
        self.shell = shell
        self.code = source
        self.first_line = first_line

    @property
    def execution_count(self) -> int | None:
        return getattr(self.shell, "execution_count", None)

    def record(
        self,
        *,
        device_type: str = "cuda",
        workspaces: Workspaces | None = None,
        breakdown: bool = True,
        progress: Callable[[int, str | None, float], None] | None = None,
        bind: Mapping[str, object] | None = None,
    ) -> FakeRun:
        """The dry run of the cell. ``bind``: names the cell sees bound to these values (a
        scan's value), in the copy only. ``breakdown=False``: without the breakdown's hooks
        (a scan's dry runs need only the peaks)."""
        shell = self.shell
        ns: dict[str, Any] = shell.user_ns
        before = dict(ns)
        try:
            text = "\n" * (self.first_line - 1) + shell.transform_cell(self.code)
            filename = shell.compile.cache(text, shell.execution_count)
            code = shell.compile(text, filename, "exec")
        except SyntaxError as e:
            run = FakeRun(device_type)
            where = f"line {e.lineno}" if e.lineno else None
            run.error = Stopped("syntax", None, f"SyntaxError: {e.msg}", where)
            run.notes.append(run.error.line)
            return run
        hidden = getattr(shell, "user_ns_hidden", {}) or {}
        keep = [v for k, v in before.items() if k not in hidden and not k.startswith("_")]
        scratch = dict(before)
        scratch.update(bind or {})

        def bound() -> list[tuple[str, Any]]:
            """The names the cell sees (those before it and those it bound so far)."""
            return [(k, v) for k, v in list(scratch.items()) if k not in hidden and k[:1] != "_"]

        try:
            return record(
                lambda: exec(code, scratch),
                device_type=device_type,
                workspaces=workspaces,
                keep=keep,
                cell_names=IPythonCells(shell).execution_count,
                names=bound,
                breakdown=breakdown,
                progress=progress,
            )
        finally:
            scratch.clear()
            for k in [k for k in ns if k not in before]:
                del ns[k]
            for k, v in before.items():
                if ns.get(k, _MISSING) is not v:
                    ns[k] = v
