"""``%gpumem who``: live GPU memory by owner, line or cell, as text and HTML tables."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from ..model import WhoReport
from ..units import cuda_label, format_bytes
from .html import table_html
from .text import table_text

_FIRST = {"variable": "owner", "line": "allocated at", "cell": "cell"}
_DETAIL = {"variable": "how", "line": "code", "cell": "first line"}
_EXAMPLE = {"variable": "e.g.", "line": "held by", "cell": "held by"}


def who_table(
    r: WhoReport, clip: int | None = None
) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """``clip``: longest detail/example text (the text view: a table must stay readable)."""
    header: tuple[str, ...] = (_FIRST[r.by], "bytes", "blocks", _DETAIL[r.by])
    sites = r.by == "variable" and any(w.site for w in r.rows)
    if sites:
        header += ("allocated at",)
    header += (_EXAMPLE[r.by],)
    rows: list[tuple[str, ...]] = []
    for w in r.rows:
        row: tuple[str, ...] = (w.key, format_bytes(w.bytes), str(w.blocks), _clip(w.detail, clip))
        if sites:
            row += (_clip(w.site, clip),)
        rows.append((*row, _clip(w.example, clip)))
    return header, rows


def _clip(text: str, n: int | None) -> str:
    return text if n is None or len(text) <= n else text[: n - 1] + "…"


def who_title(r: WhoReport) -> str:
    share = f"{100 * r.explained_share:.1f} %" if r.allocated else "all"
    what = {"variable": "names", "line": "recorded lines", "cell": "cells"}[r.by]
    return (
        f"{cuda_label(r.device)}: allocated {format_bytes(r.allocated)}; "
        f"{what} explain {format_bytes(r.explained)} ({share})"
    )


def who_notes(r: WhoReport) -> list[str]:
    notes = list(r.notes)
    if r.outside_allocator:
        notes.append(
            f"{format_bytes(r.outside_allocator)} of reachable tensors is not PyTorch's cache "
            "(allocated "
            "while caching was off, or from another library): not counted in allocated"
        )
    notes.append(f"took {r.elapsed * 1000:.1f} ms")
    return notes


def who_text(reports: Sequence[WhoReport]) -> str:
    out = []
    for r in reports:
        header, rows = who_table(r, clip=60)
        out.append(who_title(r))
        out.append(table_text(header, rows))
        out += [f"  {n}" for n in who_notes(r)]
    return "\n".join(out) if out else "no device holds GPU memory"


def who_html(reports: Sequence[WhoReport]) -> str:
    parts = []
    for r in reports:
        header, rows = who_table(r)
        parts.append(f'<div style="font-weight:bold">{escape(who_title(r))}</div>')
        parts.append(table_html(header, rows))
        parts += [f"<div>{escape(n)}</div>" for n in who_notes(r)]
    return '<div class="jp-GpuMem-who">' + ("".join(parts) or "no device") + "</div>"
