"""A ``%%gpumem --scan`` cell's body, run again and again in the user's namespace.

The body is compiled once under IPython's own cell file name (tracebacks and allocation
sites still say ``In[N] line L``, with the lines the user sees) and executed with the
scanned name bound to each value. Between runs what a run bound is undone: names it added
are dropped, names it rebound or deleted get back what they held before the scan, so that
runs do not stack. What a run changed *inside* existing objects (an optimizer step on a
model that already existed, state an optimizer created, a list appended to) cannot be
undone: docs/planning.md says so.
"""

from __future__ import annotations

import keyword
from typing import Any

from ..core.scan_values import quoted

_MISSING = object()


class CellRuns:
    def __init__(self, shell: Any, name: str, body: str, integer: bool) -> None:
        self.shell = shell
        self.name = name
        self.integer = integer
        self.ns: dict[str, Any] = shell.user_ns
        self._before = dict(self.ns)  # name -> what it held before the scan
        text = shell.transform_cell(body)
        # The magic's own line is line 1 of the cell: keep the body's lines where they are.
        text = "\n" + text
        filename = shell.compile.cache(text, shell.execution_count)
        self.code = shell.compile(text, filename, "exec")  # SyntaxError: the caller says so

    def run(self, value: float) -> BaseException | None:
        self.ns[self.name] = int(value) if self.integer else float(value)
        try:
            exec(self.code, self.shell.user_global_ns, self.ns)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:
            return e
        return None

    def cleanup(self) -> None:
        """Undo what the last run bound (not what it did inside existing objects)."""
        ns, before = self.ns, self._before
        for k in [k for k in ns if k not in before]:
            del ns[k]
        for k, v in before.items():
            if ns.get(k, _MISSING) is not v:
                ns[k] = v

    def finish(self) -> None:
        """After the scan: the namespace as it was, the scanned name included."""
        self.cleanup()
        self._before = {}


def check_name(name: str) -> str | None:
    """Why ``name`` can't be scanned, or None."""
    if not name.isidentifier():
        return f"{quoted(name)} is not a Python variable name"
    if len(name) > 100:
        return f"{quoted(name)} is too long a name"
    if keyword.iskeyword(name):
        return f"{name!r} is a Python keyword"
    return None


# The values of a scan: ``%%gpumem --scan NAME=V1,V2`` and ``jupyter_gpumem.scan(fn, values)``
# take them by the same rule, checked here.
