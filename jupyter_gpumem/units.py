"""Byte sizes: format for people, parse what people type; a bad value as an error message
repeats it (:func:`shown`). ``KiB``, ``MiB``, ``GiB`` and ``TiB`` are the one definition of
the binary units for every module of the package."""

from __future__ import annotations

import re
from functools import lru_cache

ECHO = 60  # characters of a bad value an error message repeats

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40


def shown(value: object) -> str:
    """A bad value as an error message repeats it: its repr, at most ``ECHO`` characters
    (a 10 MiB argument gets a short message)."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's digit limit (sys.get_int_max_str_digits)
        if not isinstance(value, int):
            return "?"
        return f"{'a negative' if value < 0 else 'an'} integer of {value.bit_length()} bits"
    return text if len(text) <= ECHO else text[: ECHO - 1] + "…"


# The one spelling of sizes shown to people: binary units, as nvidia-smi and PyTorch's
# messages use. Decimal units are accepted as input only (see parse_size).
_BINARY = (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB))
UNIT_NAMES = ("B", "KiB", "MiB", "GiB", "TiB")

_UNITS: dict[str, int] = {
    "b": 1,
    "": 1,
    "k": 1000,
    "kb": 1000,
    "kib": KiB,
    "m": 10**6,
    "mb": 10**6,
    "mib": MiB,
    "g": 10**9,
    "gb": 10**9,
    "gib": GiB,
    "t": 10**12,
    "tb": 10**12,
    "tib": TiB,
}

_ABSURD = 1 << 80  # bytes: format_bytes shows a power of two

# A number as people type it in a size or a fraction: digits with an optional decimal part,
# no sign, no exponent (the panel's cap field reads the same, labextension/src/present/cap.ts).
NUMBER = r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+"
_SIZE_RE = re.compile(rf"^\s*({NUMBER})\s*([a-zA-Z]*)\s*$")


def cuda_label(index: object) -> str:
    """How a CUDA device is named in every view: ``cuda:0``."""
    return f"cuda:{index}"


@lru_cache(maxsize=8192)  # views format the same block sizes thousands of times
def format_bytes(n: int | None) -> str:
    """``1536 -> '1.50 KiB'``; ``None -> 'n/a'``. Negative sizes keep their sign. Always
    B, KiB, MiB, GiB or TiB: ``1048575 -> '1.00 MiB'``, never ``'1024.00 KiB'``."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    a = abs(n)
    if a >= _ABSURD:  # no device has it, and beyond ~2**1024 no float holds it
        return f"{sign}~2**{a.bit_length() - 1} B"
    for i, (name, size) in enumerate(_BINARY):
        if a >= size:
            text = f"{a / size:.2f}"
            if i and float(text) >= 1024:  # rounds up to the next unit
                name, size = _BINARY[i - 1]
                text = f"{a / size:.2f}"
            return f"{sign}{text} {name}"
    return f"{sign}{a} B"


def format_delta(n: int | None) -> str:
    """A change: ``+1.00 GiB``, ``-512 B``, ``0 B``."""
    if n is None:
        return "n/a"
    if n > 0:
        return "+" + format_bytes(n)
    return format_bytes(n)


# A size as format_bytes writes it.
_SHOWN_SIZE = re.compile(rf"(?<![\w.])(\d+(?:\.\d+)?) ({'|'.join(UNIT_NAMES)})\b")


def join_sizes(text: str, joiner: str) -> str:
    """``text`` with each size's number and unit joined by ``joiner`` instead of a space:
    ``join_sizes(escape(cell), "&nbsp;")`` keeps ``64.00 MiB`` on one line in an HTML
    table cell however narrow the column."""
    return _SHOWN_SIZE.sub(lambda m: m.group(1) + joiner + m.group(2), text)


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
