"""The values of a scan, checked by one rule for every front end: ``%%gpumem --scan
NAME=V1,V2`` (the values as typed), ``jupyter_gpumem.scan(fn, values)`` (numbers or
text) and anything else that starts a :class:`~jupyter_gpumem.core.scanner.Scanner`.

Two to :data:`MAX_SCAN_VALUES` different values, each a positive, finite number of at most
:data:`MAX_SCAN_VALUE` (given as a number or as its text, at most :data:`VALUE_CHARS`
characters); whether all are integers decides what a run is given. A refusal is a
``ValueError`` whose message every front end shows as it is. Checking costs nothing
however much is given: the count is taken on at most ``MAX_SCAN_VALUES + 1`` values, and
only short text is ever converted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sized
from itertools import islice

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
                f"{quoted(text)} is too long: a value has {VALUE_CHARS} characters at most"
            )
        try:
            v = int(text)
        except ValueError:
            try:
                v = float(text)
            except ValueError:
                raise ValueError(f"{quoted(text)} is not a number") from None
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ValueError(f"{quoted(value)} is not a number")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{quoted(value)} is not a finite number")
    if v <= 0:
        raise ValueError(f"{quoted(value)}: values must be positive, finite numbers")
    if v > MAX_SCAN_VALUE:  # an int of any size compares exactly
        raise ValueError(f"{quoted(value)} is too large: values are 2**53 at most")
    return v


def quoted(value: object) -> str:
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
