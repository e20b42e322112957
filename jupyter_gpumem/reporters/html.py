"""HTML views (``text/html``): self-contained, every value escaped, no scripts."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from ..model import CellReport, Forecast, Measurement, Replay
from ._rows import (
    TABLE_COLUMNS,
    Section,
    cell_header,
    cell_sections,
    forecast_line,
    measurement_notes,
    no_device_line,
    table_rows,
    workers_section,
)
from .replay import replay_sentence

_STYLE = (
    "font-family:var(--jp-code-font-family,monospace);font-size:var(--jp-code-font-size,12px);"
    "border-collapse:collapse"
)
_CELL = "padding:1px 8px;text-align:left"
_REPLAY = (
    "margin:2px 0;padding:1px 6px;font-weight:bold;color:var(--jp-warn-color0,#bf360c);"
    "border-left:3px solid var(--jp-warn-color0,#bf360c)"
)

_FORECAST = (  # a warning, in the theme's warning colour (light and dark themes define it)
    "margin:2px 0;padding:1px 6px;color:var(--jp-warn-color0,#bf360c);"
    "border-left:3px solid var(--jp-warn-color0,#bf360c)"
)


# A size never breaks between its number and its unit ("64.00 / MiB" in a narrow output):
# cells do not wrap, except the notes column of a report, which holds words, not sizes.
_NOWRAP = _CELL + ";white-space:nowrap"


def _tr(cells: Sequence[str], tag: str = "td", wrap_last: bool = False) -> str:
    last = len(cells) - 1 if wrap_last else -1
    return (
        "<tr>"
        + "".join(
            f'<{tag} style="{_CELL if i == last else _NOWRAP}">{escape(c)}</{tag}>'
            for i, c in enumerate(cells)
        )
        + "</tr>"
    )


def cell_report_html(r: CellReport, sections: list[Section] | None = None) -> str:
    color = "var(--jp-error-color1,#d32f2f)" if r.failed else "inherit"
    out = [
        (
            f'<div class="jp-GpuMem-report"><div style="font-weight:bold;color:{color}">'
            f"{escape(cell_header(r))}</div>"
        )
    ]
    if r.after.replay is not None:
        out.append(replay_html(r.after.replay))
    sections = cell_sections(r) if sections is None else sections
    if not sections:
        out.append(f"<div>{escape(no_device_line(r))}</div>")
    out += [section_html(s) for s in sections]
    out += [forecast_html(f) for f in r.forecasts]
    if r.hints:
        out.append("<ul>" + "".join(f"<li>{escape(h)}</li>" for h in r.hints) + "</ul>")
    out.append("</div>")
    return "".join(out)


def forecast_html(f: Forecast) -> str:
    """The full report's forecast line, marked as a warning (the theme's colour)."""
    return f'<div class="jp-GpuMem-forecast" style="{_FORECAST}">{escape(forecast_line(f))}</div>'


def replay_html(replay: Replay | str) -> str:
    """The banner above replayed figures (a record, or a protocol object's sentence)."""
    text = replay_sentence(replay) if isinstance(replay, Replay) else replay
    return f'<div class="jp-GpuMem-replay" style="{_REPLAY}">{escape(text)}</div>'


def section_html(s: Section) -> str:
    head = f'<tr><th colspan="3" style="{_CELL}">{escape(s.title)}</th></tr>'
    body = "".join(_tr((row.label, row.value, row.note), wrap_last=True) for row in s.rows)
    return f'<table style="{_STYLE}">{head}{body}</table>'


def table_html(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    body = _tr(header, "th") + "".join(_tr([str(c) for c in r]) for r in rows)
    return f'<table style="{_STYLE}">{body}</table>'


def measurement_html(m: Measurement) -> str:
    rows = table_rows(m)
    parts = [replay_html(m.replay)] if m.replay is not None else []
    parts.append(table_html(TABLE_COLUMNS, rows) if rows else "<div>no GPU devices</div>")
    parts += [f"<div>{escape(n)}</div>" for n in measurement_notes(m)]
    if m.workers:
        parts.append(section_html(workers_section(m.workers)))
    return '<div class="jp-GpuMem-now">' + "".join(parts) + "</div>"
