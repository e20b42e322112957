"""What a comparison of runs reads: run documents (``jupyter-gpumem run --save``/
``--json``, version 1, checked by :func:`check_document`), the kernel's history as one
(:func:`session_document`), and the tolerance as typed (:func:`parse_tolerance`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import DiffInputError
from ..model import HistoryRow, Tolerance
from ..units import parse_size
from .cell_match import normalized

VERSION = 1  # the run document's version this reads
MAX_BYTES = 256 << 20  # the largest run document read
DEFAULT_TOLERANCE = "1%"


def parse_tolerance(text: str) -> Tolerance:
    """``1%`` (of the first run's figure), ``64MiB`` (a size), or both, ``1%,64MiB`` (the
    larger of the two). A bare number other than 0 is refused: ``1`` is ``1%`` or 1 B?"""
    relative, absolute = 0.0, 0
    parts = [p.strip() for p in str(text).split(",")]
    if not text.strip() or not all(parts):
        raise DiffInputError(f"--tolerance {text!r}: expected a share such as 1% or a size")
    for part in parts:
        if part.endswith("%"):
            try:
                share = float(part[:-1])
            except ValueError:
                raise DiffInputError(
                    f"--tolerance {text!r}: {part!r} is not a percentage"
                ) from None
            if not 0 <= share < 1e6:  # also refuses nan and inf
                raise DiffInputError(f"--tolerance {text!r}: a share must be 0% or more")
            relative = max(relative, share / 100)
        elif re.fullmatch(r"0*\.?0*", part):
            continue  # 0: no growth allowed
        elif re.fullmatch(r"[0-9.]+", part):
            raise DiffInputError(
                f"--tolerance {text!r}: a bare number is ambiguous; write {part}% (of the "
                f"first run's figure) or a size such as {part}MiB"
            )
        else:
            try:
                absolute = max(absolute, parse_size(part))
            except ValueError as e:
                raise DiffInputError(
                    f"--tolerance {text!r}: {e}; expected a share such as 1% or a size such "
                    "as 64MiB"
                ) from None
    return Tolerance(relative, absolute, ",".join(parts))


def check_document(doc: Any, name: str) -> None:
    """A ``DiffInputError`` unless ``doc`` is a run document this version reads."""
    if not isinstance(doc, dict) or "cells" not in doc or "version" not in doc:
        raise DiffInputError(
            f"{name} is not a jupyter-gpumem run document (write one with "
            "`jupyter-gpumem run NOTEBOOK --save FILE`)"
        )
    version = doc["version"]
    if version != VERSION:
        newer = isinstance(version, int) and version > VERSION
        raise DiffInputError(
            f"{name} is a run document of version {version!r}; this jupyter-gpumem reads "
            f"version {VERSION}" + (": upgrade jupyter-gpumem" if newer else "")
        )
    cells = doc["cells"]
    if not isinstance(cells, list) or not all(
        isinstance(c, dict) and isinstance(c.get("devices", []), list) for c in cells
    ):
        raise DiffInputError(f"{name}: its cells are not a list of cell records")


def session_document(rows: Sequence[HistoryRow], sources: Mapping[int, str]) -> dict[str, Any]:
    """The kernel's measured cells (its history) as a run document: each distinct code's latest run
    (``sources``: execution count -> the cell's code as typed)."""
    latest: dict[str, dict[str, Any]] = {}
    for row in rows:
        source = sources.get(row.execution_count) if row.execution_count is not None else None
        if source is None:
            continue
        latest.pop(normalized(source), None)  # (re-inserted: the order of last runs)
        latest[normalized(source)] = {
            "index": None,
            "execution_count": row.execution_count,
            "first_line": row.first_line,
            "source": source,
            "status": "error" if row.failed else "ok",
            "measured": True,
            "devices": [
                {
                    "index": d.device,
                    "kept": d.allocated_delta,
                    "peak": d.peak_allocated,
                    "peak_above_start": d.peak_above_start,
                    "allocated": d.allocated,
                    "reserved": d.reserved,
                    "reserved_delta": d.reserved_delta,
                    "peak_reserved": None,
                    "kept_at": d.kept_at,
                    **({"worker": d.worker} if d.worker else {}),
                }
                for d in row.devices
            ],
        }
    return {"version": VERSION, "cells": list(latest.values()), "summary": None}


def device_key(d: Mapping[str, Any]) -> tuple[str | None, int]:
    """What names a device row across runs: a worker's label without its pid (a new run
    has new pids: ``rank 1``), and the device's index."""
    w = d.get("worker")
    return (re.sub(r"\s*\(pid \d+\)$", "", str(w)) if w else None, int(d["index"]))
