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
import math
from collections.abc import Iterable, Sized
from itertools import islice
from typing import Any

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
        return f"{_quoted(name)} is not a Python variable name"
    if len(name) > 100:
        return f"{_quoted(name)} is too long a name"
    if keyword.iskeyword(name):
        return f"{name!r} is a Python keyword"
    return None


# The values of a scan: ``%%gpumem --scan NAME=V1,V2`` and ``jupyter_gpumem.scan(fn, values)``
# take them by the same rule, checked here.
MAX_SCAN_VALUES = 8  # each is a run of the step
VALUE_CHARS = 20  # a value as typed: longer is no batch size, and is not converted
MAX_SCAN_VALUE = 2**53  # larger integers are not exact as floats (the fit's numbers)


def scan_values(values: Iterable[object]) -> tuple[tuple[float, ...], bool]:
    """The values to scan and whether all are integers; ValueError, whose message both
    front ends show as it is, for anything else. A value is a number, or its text as typed
    (at most ``VALUE_CHARS`` characters). The count is checked first, on at most
    ``MAX_SCAN_VALUES + 1`` of them: a long list (or an endless iterator) costs nothing."""
    taken = list(islice(values, MAX_SCAN_VALUES + 1))
    if len(taken) > MAX_SCAN_VALUES:
        n = len(values) if isinstance(values, Sized) else "more"
        raise ValueError(f"at most {MAX_SCAN_VALUES} values, got {n}")
    out: list[float] = []
    whole = True
    for value in taken:
        v = _number(value)
        whole = whole and isinstance(v, int)
        out.append(float(v))
    if len(set(out)) < 2:
        raise ValueError("two different values at least are needed (three show curvature)")
    return tuple(out), whole


def _number(value: object) -> int | float:
    v = value
    if isinstance(value, str):
        value = text = value.strip()
        if len(text) > VALUE_CHARS:
            raise ValueError(
                f"{_quoted(text)} is too long: a value has {VALUE_CHARS} characters at most"
            )
        try:
            v = int(text)
        except ValueError:
            try:
                v = float(text)
            except ValueError:
                raise ValueError(f"{_quoted(text)} is not a number") from None
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ValueError(f"{_quoted(value)} is not a number")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{_quoted(value)} is not a finite number")
    if v <= 0:
        raise ValueError(f"{_quoted(value)}: values must be positive, finite numbers")
    if v > MAX_SCAN_VALUE:  # an int of any size compares exactly
        raise ValueError(f"{_quoted(value)} is too large: values are 2**53 at most")
    return v


def _quoted(value: object) -> str:
    """A bad value as an error quotes it: text as typed, in quotes, or a number; at most
    ``VALUE_CHARS`` characters, and only those are ever converted to text."""
    if isinstance(value, str):
        text = value if len(value) <= VALUE_CHARS else value[: VALUE_CHARS - 1] + "…"
        return repr(text)
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"{'-' if value < 0 else ''}an integer of {value.bit_length()} bits"
    if isinstance(value, (int, float)):
        return repr(value)  # at most 24 characters
    return f"a {type(value).__name__}"
