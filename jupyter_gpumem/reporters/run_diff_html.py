"""A comparison of two runs as HTML: the two runs side by side, cell by cell, each
regression with its reasons; :func:`diff_page` adds each run's chart and makes a
self-contained page (``--html``); :func:`diff_html` is the part a notebook shows. Every
value is escaped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from ..model import CellDiff, DeviceDiff, DeviceRow, HistoryRow, RunDiff
from ..units import format_bytes
from .page import PAGE_CSS
from .run_diff import (
    LABELS,
    MATCH_WORDS,
    change_text,
    headline,
    judged_sentence,
    judged_text,
    where,
    why_text,
)

SHOWN = ("peak", "kept", "reserved")
_STYLE = """
.jp-GpuMem-diff { border-collapse: collapse; font-size: .9em; width: 100%; }
.jp-GpuMem-diff th, .jp-GpuMem-diff td { padding: .2em .5em; text-align: left;
  border-bottom: 1px solid var(--jp-border-color2, var(--line, #ddd)); vertical-align: top; }
.jp-GpuMem-diff td.num { text-align: right; font-variant-numeric: tabular-nums;
  white-space: nowrap; }
.jp-GpuMem-diff .side { border-left: 2px solid var(--jp-border-color1, #999); }
.jp-GpuMem-diff .reg { color: var(--jp-error-color1, var(--fail, #c62828)); font-weight: 600; }
.jp-GpuMem-diff .better { color: var(--jp-success-color1, var(--ok, #1b7f3b)); }
.jp-GpuMem-diff .change { display: block; font-size: .85em; opacity: .85; }
.jp-GpuMem-diff .why td { font-size: .9em; }
.jp-GpuMem-diff td.cell { min-width: 14em; max-width: 24em; overflow-wrap: anywhere; }
.jp-GpuMem-runs { display: flex; gap: 1em; flex-wrap: wrap; }
.jp-GpuMem-runs > div { flex: 1 1 420px; min-width: 0; }
"""


def _e(v: Any) -> str:
    return escape(str(v), quote=True)


def _cell(c: CellDiff) -> str:
    """The cell as the second run has it (a removed one: as the first run had it), and
    where it was when that differs."""
    ref = c.ref
    was = ""
    if c.before is not None and c.after is not None and c.before.label != c.after.label:
        was = f'<span class="change">was {_e(c.before.label)}</span>'
    return f'<td class="cell" title="{_e(ref.first_line)}"><code>{_e(ref.label)}</code>{was}</td>'


def _values(d: DeviceDiff | None, side: str) -> str:
    cells = []
    for i, name in enumerate(SHOWN):
        f = d.figure(name) if d is not None else None
        v = None if f is None else (f.before if side == "before" else f.after)
        cls = "num side" if i == 0 else "num"
        if f is None or v is None:
            cells.append(f'<td class="{cls}">-</td>')
            continue
        text = _e(format_bytes(v))
        if side == "after" and f.change:
            mark = {"regression": " reg", "improvement": " better"}.get(f.outcome, "")
            tip = _e(f"allowed {format_bytes(f.allowed)} ({judged_text(f)})")
            text += f'<span class="change{mark}" title="{tip}">{_e(change_text(f))}</span>'
        cells.append(f'<td class="{cls}">{text}</td>')
    return "".join(cells)


def _rows(c: CellDiff, diff: RunDiff) -> list[str]:
    match = MATCH_WORDS[c.match]
    if c.similarity is not None:
        match += f" ({c.similarity * 100:.0f}%)"
    outcome = "regression" if c.regressions else ""
    if c.carried_only:
        outcome = "regression (carried from earlier cells)"
    if not outcome and any(f.outcome == "improvement" for d in c.devices for f in d.figures):
        outcome = "improved"
    out = []
    devices: Sequence[DeviceDiff | None] = c.devices or [None]
    for k, d in enumerate(devices):
        first = k == 0
        device = _e(where(d)) if d is not None else _e("; ".join(c.notes) or "no figures")
        cls = ' class="reg"' if c.regressions else ""
        out.append(
            "<tr>"
            + (_cell(c) if first else "<td></td>")
            + (f"<td>{_e(match)}</td>" if first else "<td></td>")
            + f"<td>{device}</td>{_values(d, 'before')}{_values(d, 'after')}"
            + f"<td{cls}>{_e(outcome) if first else ''}</td></tr>"
        )
    reasons = [f"<li>the code changed: <code>{_e(x)}</code></li>" for x in c.code]
    if c.regressions:
        reasons += [f"<li>{_e(n)}</li>" for n in c.notes]
        for d in c.devices:
            if d.regressions:
                reasons += [
                    f"<li>{_e(where(d))}: {_e(why_text(w, diff.before))}</li>" for w in d.why
                ]
                reasons += [f"<li>{_e(where(d))}: {_e(n)}</li>" for n in d.notes]
    if reasons and (c.regressions or c.code):
        out.append(f'<tr class="why"><td colspan="10"><ul>{"".join(reasons)}</ul></td></tr>')
    return out


def diff_html(diff: RunDiff) -> str:
    """The verdict, the two runs side by side, each regression's reasons below its cell."""
    word = {0: "OK", 1: "REGRESSION", 2: "INCOMPLETE"}[diff.exit_code]
    cls = {0: "pass", 1: "fail", 2: "error"}[diff.exit_code]
    style = "font-weight:600;padding:.3em .6em;border-left:4px solid"
    heads = "".join(f'<th style="text-align:right">{_e(LABELS[n])}</th>' for n in SHOWN)
    parts = [
        f"<style>{_STYLE}</style>",
        f'<p class="verdict {cls}" style="{style}"><b>{word}</b>: {_e(headline(diff))}</p>',
    ]
    if diff.warnings:
        parts.append(
            '<ul class="warn">' + "".join(f"<li>{_e(w)}</li>" for w in diff.warnings) + "</ul>"
        )
    parts.append(
        '<table class="jp-GpuMem-diff"><thead>'
        '<tr><th colspan="3"></th>'
        f'<th colspan="3" class="side">{_e(diff.before)}</th>'
        f'<th colspan="3" class="side">{_e(diff.after)}</th><th></th></tr>'
        f"<tr><th>cell</th><th>match</th><th>device</th>{heads}{heads}<th></th></tr>"
        "</thead><tbody>"
    )
    for c in diff.cells:
        parts += _rows(c, diff)
    for d in diff.run:
        mark = "regression" if d.regressions else ""
        parts.append(
            f"<tr><td>whole run</td><td></td><td>{_e(where(d))}</td>{_values(d, 'before')}"
            f'{_values(d, "after")}<td class="{"reg" if mark else ""}">{mark}</td></tr>'
        )
    parts.append("</tbody></table>")
    parts.append(f'<p class="meta">{_e(judged_sentence(diff))}</p>')
    return "\n".join(parts)


def _history_rows(cells: Sequence[Mapping[str, Any]]) -> list[HistoryRow]:
    """A run document's measured cells as the history keeps them (what the chart draws)."""
    rows = []
    for c in cells:
        devices = tuple(
            DeviceRow(
                int(d["index"]),
                d.get("allocated"),
                d.get("kept"),
                d.get("reserved"),
                d.get("reserved_delta"),
                d.get("peak"),
                d.get("peak_above_start"),
                None,
                None,
                d.get("kept_at"),
                d.get("worker"),
            )
            for d in c.get("devices", [])
            if d.get("peak") is not None
        )
        if c.get("measured") and devices:
            rows.append(
                HistoryRow(
                    c.get("execution_count"),
                    0.0,
                    str(c.get("first_line", ""))[:60],
                    float(c.get("wall_time") or 0.0),
                    c.get("status") == "error",
                    None,
                    devices,
                )
            )
    return rows


def _charts(diff: RunDiff, sides: Sequence[Sequence[Mapping[str, Any]]]) -> str:
    from .history_plot import COLORS, history_svg

    rows = [_history_rows(cells) for cells in sides]
    indices = sorted(
        {d.device for side in rows for r in side for d in r.devices if d.worker is None}
    )
    if not indices:
        return ""
    legend = "".join(
        f'<span><span style="display:inline-block;width:14px;height:3px;background:'
        f'{COLORS[k]};margin-right:4px;vertical-align:middle"></span>{k}</span>'
        for k in ("allocated", "reserved", "peak")
    )
    out = ["<h2>Allocated and reserved after each measured cell, and its peak</h2>"]
    out.append(f'<div class="legend">{legend}</div>')
    for i in indices:
        out.append('<div class="jp-GpuMem-runs">')
        for name, side in zip((diff.before, diff.after), rows, strict=True):
            # Inline SVG in HTML needs no namespace: leave the URL out, the page fetches nothing.
            svg = history_svg(side, i).replace(' xmlns="http://www.w3.org/2000/svg"', "")
            out.append(f"<div><h3>{_e(name)}</h3>{svg or '<p>no figures</p>'}</div>")
        out.append("</div>")
    return "".join(out)


def comparison_html(
    diff: RunDiff,
    before_cells: Sequence[Mapping[str, Any]],
    after_cells: Sequence[Mapping[str, Any]],
) -> str:
    """The comparison and each run's chart, side by side (a part of a page)."""
    return diff_html(diff) + _charts(diff, (before_cells, after_cells))


def diff_page(
    diff: RunDiff,
    before_cells: Sequence[Mapping[str, Any]],
    after_cells: Sequence[Mapping[str, Any]],
    title: str = "GPU memory",
) -> str:
    """A self-contained page: no scripts, no URLs; light and dark."""
    heading = f"{title}: {diff.after} against {diff.before}"
    return "\n".join(
        [
            "<!doctype html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{_e(heading)}</title><style>{PAGE_CSS}</style></head><body>",
            f"<h1>{_e(heading)}</h1>",
            comparison_html(diff, before_cells, after_cells),
            "</body></html>",
        ]
    )
