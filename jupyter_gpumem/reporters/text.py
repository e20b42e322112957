"""Plain-text views (``text/plain``)."""

from __future__ import annotations

from collections.abc import Sequence

from ..model import CellReport, Measurement
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


def cell_report_text(r: CellReport, sections: list[Section] | None = None) -> str:
    lines = [cell_header(r)]
    if r.after.replay is not None:
        lines.append("  " + replay_sentence(r.after.replay))
    sections = cell_sections(r) if sections is None else sections
    if not sections:
        lines.append("  " + no_device_line(r))
    for s in sections:
        lines += section_lines(s)
    for f in r.forecasts:
        lines.append(f"  {forecast_line(f)}")
    for h in r.hints:
        lines.append(f"  hint: {h}")
    return "\n".join(lines)


def section_lines(s: Section, indent: str = "  ") -> list[str]:
    lines = [f"{indent}{s.title}"]
    width = max((len(row.label) for row in s.rows), default=0)
    for row in s.rows:
        note = f"   [{row.note}]" if row.note else ""
        lines.append(f"{indent}  {row.label:<{width}}  {row.value}{note}")
    return lines


def table_text(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*map(str, r)) for r in rows]
    return "\n".join(line.rstrip() for line in out)


def measurement_text(m: Measurement) -> str:
    rows = table_rows(m)
    parts = [replay_sentence(m.replay)] if m.replay is not None else []
    parts.append(table_text(TABLE_COLUMNS, rows) if rows else "no GPU devices")
    parts += measurement_notes(m)
    if m.workers:
        parts += section_lines(workers_section(m.workers), indent="")
    return "\n".join(parts)
