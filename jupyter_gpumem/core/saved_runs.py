"""Saved runs read back: the run documents ``jupyter-gpumem run --save`` writes, for the
front ends that compare with one (``run --baseline``, ``jupyter-gpumem diff``, ``%gpumem
history --diff``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..analysis.run_documents import MAX_BYTES, check_document
from ..errors import DiffInputError
from ..units import format_bytes


def load_document(path: str | Path, what: str = "") -> dict[str, Any]:
    """The run document in ``path``; a :class:`DiffInputError` that says what is wrong
    with it (missing, a folder, too large, not JSON, not a run document, another version)."""
    p = Path(path).expanduser()
    name = f"{what} {p}" if what else str(p)
    if not p.exists():
        raise DiffInputError(f"{name}: no such file")
    if p.is_dir():
        raise DiffInputError(f"{name} is a folder, not a run document")
    if not p.is_file():
        raise DiffInputError(f"{name} is not a regular file")
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise DiffInputError(f"{name}: cannot read it ({e.strerror or e})") from None
    if len(data) > MAX_BYTES:
        raise DiffInputError(f"{name} is larger than {format_bytes(MAX_BYTES)}")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise DiffInputError(f"{name} is not JSON ({_short(e)}): not a run document") from None
    check_document(doc, name)
    return dict(doc)


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:120] + ("…" if len(text) > 120 else "")
