"""Byte sizes: format for people, parse what people type; a bad value as an error message
repeats it (:func:`shown`)."""

from __future__ import annotations

import re
from functools import lru_cache

ECHO = 60  # characters of a bad value an error message repeats


def shown(value: object) -> str:
    """A bad value as an error message repeats it: its repr, at most ``ECHO`` characters
    (a 10 MB argument gets a short message)."""
    text = repr(value)
    return text if len(text) <= ECHO else text[: ECHO - 1] + "…"


_BINARY = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_DECIMAL = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3))

_UNITS: dict[str, int] = {
    "b": 1,
    "": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 1 << 20,
    "g": 10**9,
    "gb": 10**9,
    "gib": 1 << 30,
    "t": 10**12,
    "tb": 10**12,
    "tib": 1 << 40,
}

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


@lru_cache(maxsize=8192)  # views format the same block sizes thousands of times
def format_bytes(n: int | None, units: str = "binary") -> str:
    """``1536 -> '1.50 KiB'``; ``None -> 'n/a'``. Negative sizes keep their sign."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    a = abs(n)
    for name, size in _BINARY if units == "binary" else _DECIMAL:
        if a >= size:
            return f"{sign}{a / size:.2f} {name}"
    return f"{sign}{a} B"


def format_delta(n: int | None, units: str = "binary") -> str:
    """A change: ``+1.00 GiB``, ``-512 B``, ``0 B``."""
    if n is None:
        return "n/a"
    if n > 0:
        return "+" + format_bytes(n, units)
    return format_bytes(n, units)


def parse_size(text: str) -> int:
    """Parse ``'24GiB'``, ``'24 GB'``, ``'512MiB'``, ``'1000'`` into bytes.

    Decimal units (KB, MB, GB, TB) are powers of 1000 and binary units (KiB, MiB, GiB,
    TiB) powers of 1024, as on a GPU's datasheet and in ``nvidia-smi`` respectively.
    Raises ``ValueError`` with the accepted forms on anything else.
    """
    m = _SIZE_RE.match(text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(
            f"not a size: {shown(text)} (use a number with B, KB, MB, GB, TB, KiB, MiB, GiB "
            "or TiB, e.g. 24GiB)"
        )
    value = float(m.group(1)) * _UNITS[unit]
    if not value < 1 << 64:  # also inf, from a number too long for a float
        raise ValueError(f"size too large: {shown(text)} (at most 16 EiB; e.g. 24GiB)")
    if value < 1:
        raise ValueError(f"size must be at least one byte: {shown(text)}")
    return int(value)
