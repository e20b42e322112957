"""``%%gpumem --trace``: a cell's allocated memory over its run as stacked allocations (as
PyTorch's memory_viz "active memory timeline" draws it), the peak marked, and the
allocations alive at the peak. Self-contained SVG (no script, no CDN) and a text twin.

x is the event number (every alloc/free is one step, so short-lived allocations stay
visible), drawn in at most ``COLUMNS`` columns: each column shows the state at its highest
event, so no peak is lost. The largest allocations get a band each, stacked in the order
they were made on top of what was allocated before the cell; the rest share one band.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from ..model import CellTrace, Timeline, TraceAllocation
from ..units import cuda_label, format_bytes
from .picture import picture

WIDTH, HEIGHT = 640, 180
LEFT, RIGHT, TOP, BOTTOM = 64, 8, 14, 20
COLUMNS = 600
BANDS = 16
# Mid-tone colours that read on light and dark backgrounds alike.
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#86bcb6",
    "#8cd17d",
    "#d4a6c8",
)
BASE = "var(--jp-layout-color3,#bdbdbd)"
OTHER = "var(--jp-layout-color4,#9e9e9e)"


def summary_lines(t: Timeline) -> list[str]:
    lines = [
        (
            f"{cuda_label(t.device)}: trace of {len(t.active)} alloc/free events over "
            f"{t.duration_ms:.1f} ms: allocated {format_bytes(t.base)} at the start, "
            f"peak {format_bytes(t.peak)} "
            f"({'+' if t.peak_above_start >= 0 else ''}{format_bytes(t.peak_above_start)} "
            "above the start)"
        )
    ]
    kept = t.kept()
    if kept:
        lines.append(
            f"alive at the end: {len(kept)} allocation(s), "
            f"{format_bytes(sum(a.size for a in kept))}"
        )
    note = f"{t.entries} trace entries (at most {t.max_entries}), snapshot {t.snapshot_ms:.1f} ms"
    if not t.complete:
        note += (
            f"; the trace kept only the last {t.max_entries} entries: earlier events of this "
            "cell are lost, so its start and peak are not exact (raise --entries)"
        )
    lines.append(note)
    return lines


def peak_rows(t: Timeline, n: int = 20) -> list[tuple[str, str, str]]:
    """(size, where, when) of the allocations alive at the peak, largest first."""
    rows = []
    for a in t.alive_at_peak()[:n]:
        when = "kept" if a.end is None else f"freed at event {a.end}"
        rows.append((format_bytes(a.size), a.label, f"made at event {a.start}, {when}"))
    return rows


def timeline_text(t: Timeline) -> str:
    from .text import table_text

    out = summary_lines(t)
    rows = peak_rows(t)
    if rows:
        out.append("alive at the peak:")
        out.append(table_text(("size", "allocated at", "life"), rows))
    return "\n".join(out)


def _columns(t: Timeline) -> list[int]:
    """The event each column shows: the highest one of its range."""
    n = len(t.active)
    cols = min(n, COLUMNS)
    reps = []
    for c in range(cols):
        lo, hi = c * n // cols, max(c * n // cols + 1, (c + 1) * n // cols)
        reps.append(max(range(lo, hi), key=t.active.__getitem__))
    return reps


def timeline_svg(t: Timeline) -> str:
    reps = _columns(t)
    if not reps:
        return ""
    top = max(t.peak, 1) * 1.05
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / len(reps)

    def y(v: float) -> float:
        return TOP + plot_h - v / top * plot_h

    def xs(c: int) -> tuple[float, float]:
        return LEFT + c * step, LEFT + (c + 1) * step

    bands: list[TraceAllocation] = sorted(t.allocations, key=lambda a: -a.size)[:BANDS]
    band_order = sorted(bands, key=lambda a: a.start)
    # bottom of each band (and of "other") per column
    lower: dict[int, list[tuple[int, float, float]]] = {id(a): [] for a in band_order}
    other_path: list[tuple[int, float, float]] = []
    for c, e in enumerate(reps):
        alive = [a for a in band_order if a.alive_at(e)]
        other = t.active[e] - t.base - sum(a.size for a in alive)
        other_path.append((c, t.base, t.base + max(other, 0)))
        level = t.base + max(other, 0)
        for a in alive:
            lower[id(a)].append((c, level, level + a.size))
            level += a.size
    parts = [
        (
            f'<rect x="{LEFT}" y="{y(t.base):.2f}" width="{plot_w}" '
            f'height="{y(0) - y(t.base):.2f}" '
            f'fill="{BASE}"><title>'
            f"{escape(f'allocated before the cell: {format_bytes(t.base)}')}</title>"
            "</rect>"
        )
    ]
    parts.append(_band(other_path, xs, y, OTHER, "other allocations of this cell"))
    for i, a in enumerate(band_order):
        title = f"{format_bytes(a.size)} at {a.label}" + (" (kept)" if a.end is None else "")
        parts.append(_band(lower[id(a)], xs, y, PALETTE[i % len(PALETTE)], title))
    # the peak
    pc = reps.index(t.peak_event) if t.peak_event in reps else 0
    px = (xs(pc)[0] + xs(pc)[1]) / 2
    peak_label = f"peak {format_bytes(t.peak)} (+{format_bytes(t.peak_above_start)})"
    parts.append(
        f'<line x1="{px:.2f}" x2="{px:.2f}" y1="{TOP - 4}" y2="{TOP + plot_h}" '
        'stroke="var(--jp-error-color1,#d32f2f)" stroke-dasharray="3 2" stroke-width="1.2">'
        f"<title>{escape(peak_label)}</title></line>"
    )
    anchor = "end" if px > WIDTH / 2 else "start"
    parts.append(
        f'<text x="{px + (-4 if anchor == "end" else 4):.2f}" y="{TOP - 3}" font-size="10" '
        f'text-anchor="{anchor}" fill="var(--jp-error-color1,#d32f2f)">{escape(peak_label)}'
        "</text>"
    )
    axis = 'font-size="10" fill="var(--jp-ui-font-color2,#666)"'
    parts.append(
        f'<text x="{LEFT - 4}" y="{y(t.peak) + 3:.2f}" text-anchor="end" {axis}>'
        f"{escape(format_bytes(t.peak))}</text>"
    )
    parts.append(f'<text x="{LEFT - 4}" y="{TOP + plot_h}" text-anchor="end" {axis}>0</text>')
    parts.append(f'<text x="{LEFT}" y="{HEIGHT - 4}" {axis}>event 0</text>')
    parts.append(
        f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 4}" text-anchor="end" {axis}>'
        f"event {len(t.active) - 1} ({t.duration_ms:.1f} ms)</text>"
    )
    parts.append(
        f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + plot_h}" y2="{TOP + plot_h}" '
        'stroke="var(--jp-border-color1,#999)" stroke-width="0.5"/>'
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" '
        f'style="max-width:{WIDTH * 1.5:.0f}px" role="img" '
        f'aria-label="{escape(summary_lines(t)[0])}">' + "".join(parts) + "</svg>"
    )


def _band(
    points: list[tuple[int, float, float]],
    xs: Callable[[int], tuple[float, float]],
    y: Callable[[float], float],
    color: str,
    title: str,
) -> str:
    if not points:
        return ""
    upper = []
    for c, _, hi in points:
        x0, x1 = xs(c)
        upper += [f"{x0:.2f},{y(hi):.2f}", f"{x1:.2f},{y(hi):.2f}"]
    lower = []
    for c, lo, _ in reversed(points):
        x0, x1 = xs(c)
        lower += [f"{x1:.2f},{y(lo):.2f}", f"{x0:.2f},{y(lo):.2f}"]
    return (
        f'<polygon points="{" ".join(upper + lower)}" fill="{color}" fill-opacity="0.85">'
        f"<title>{escape(title)}</title></polygon>"
    )


def timeline_html(t: Timeline) -> str:
    from .html import table_html

    lines = summary_lines(t)
    out = [
        (
            '<div class="jp-GpuMem-timeline" style="font-family:var(--jp-ui-font-family,'
            'sans-serif);font-size:var(--jp-ui-font-size1,13px)">'
        )
    ]
    out.append(f"<div><b>{escape(lines[0])}</b></div>")
    out += [f"<div>{escape(line)}</div>" for line in lines[1:]]
    out.append(picture(timeline_svg(t)))
    rows = peak_rows(t)
    if rows:
        out.append("<div>alive at the peak:</div>")
        out.append(table_html(("size", "allocated at", "life"), rows))
    out.append("</div>")
    return "".join(out)


def _saved_line(trace: CellTrace) -> str:
    return (
        f"saved {trace.saved} ({format_bytes(trace.saved_bytes)}): open it at "
        "https://pytorch.org/memory_viz "
        "(the page reads the file locally)"
    )


def trace_text(trace: CellTrace) -> str:
    out = [timeline_text(t) for t in trace.timelines]
    if trace.note:
        out.append(f"trace: {trace.note}")
    if trace.saved:
        out.append(_saved_line(trace))
    return "\n".join(out)


def trace_html(trace: CellTrace) -> str:
    out = [timeline_html(t) for t in trace.timelines]
    if trace.note:
        out.append(f"<div>trace: {escape(trace.note)}</div>")
    if trace.saved:
        out.append(f"<div>{escape(_saved_line(trace))}</div>")
    return "".join(out)
