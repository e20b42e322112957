"""``%gpumem history --plot``: allocated and reserved after each measured cell and each
cell's peak, as a small self-contained SVG chart with the execution counts on the axis."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from ..collectors.torch_build import why_no_gpu
from ..model import DeviceRow, HistoryRow, Measurement
from ..units import cuda_label, format_bytes
from .picture import picture

WIDTH, HEIGHT = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 64, 10, 16, 30
COLORS = {
    "allocated": "var(--jp-brand-color1,#1976d2)",
    "reserved": "var(--jp-brand-color3,#90caf9)",
    "peak": "var(--jp-warn-color2,#ffb74d)",
}


def _points(rows: Sequence[HistoryRow], device: int) -> list[tuple[HistoryRow, DeviceRow]]:
    out = []
    for r in rows:
        for d in r.devices:
            if d.device == device and d.allocated is not None and d.worker is None:
                out.append((r, d))
    return out


def no_plot_reason(rows: Sequence[HistoryRow], device: int, now: Measurement) -> str | None:
    """Why ``rows`` draw no chart of ``device``, or None when they do; ``now``, the
    kernel's state, tells why cells had no GPU figures."""
    if _points(rows, device):
        return None
    if any(_points(rows, d.device) for r in rows for d in r.devices):
        return f"no measured cell has GPU figures on {cuda_label(device)}"
    why = why_no_gpu(None, state=now.state, version=now.torch_version)
    if why is None:
        why = "CUDA was not initialised when they ran"
    return f"no measured cell has GPU figures ({why})"


def history_svg(rows: Sequence[HistoryRow], device: int) -> str:
    pts = _points(rows, device)
    if not pts:
        return ""
    highest = max(max(d.reserved or 0, d.peak_allocated or 0, d.allocated or 0) for _, d in pts)
    top = max(highest, 1) * 1.08
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / len(pts)

    def x(i: int) -> float:
        return LEFT + (i + 0.5) * step

    def y(v: float) -> float:
        return TOP + plot_h - v / top * plot_h

    parts = []
    bar = max(1.0, min(14.0, step * 0.6))
    for i, (r, d) in enumerate(pts):
        if d.peak_allocated is not None:
            parts.append(
                f'<rect x="{x(i) - bar / 2:.2f}" y="{y(d.peak_allocated):.2f}" width="{bar:.2f}" '
                f'height="{y(0) - y(d.peak_allocated):.2f}" fill="{COLORS["peak"]}" '
                f'fill-opacity="0.55"><title>{escape(_tip(r, d))}</title></rect>'
            )
    for key, dash in (("reserved", ' stroke-dasharray="4 2"'), ("allocated", "")):
        line = " ".join(f"{x(i):.2f},{y(getattr(d, key) or 0):.2f}" for i, (_, d) in enumerate(pts))
        parts.append(
            f'<polyline points="{line}" fill="none" stroke="{COLORS[key]}" '
            f'stroke-width="1.6"{dash}/>'
        )
    for i, (r, d) in enumerate(pts):
        parts.append(
            f'<circle cx="{x(i):.2f}" cy="{y(d.allocated or 0):.2f}" r="2.4" '
            f'fill="{COLORS["allocated"]}"><title>{escape(_tip(r, d))}</title></circle>'
        )
    axis = 'font-size="10" fill="var(--jp-ui-font-color2,#666)"'
    every = max(1, -(-len(pts) // 24))  # at most ~24 labels
    for i, (r, _) in enumerate(pts):
        if i % every == 0 and r.execution_count is not None:
            parts.append(
                f'<text x="{x(i):.2f}" y="{HEIGHT - BOTTOM + 12}" text-anchor="middle" '
                f"{axis}>[{r.execution_count}]</text>"
            )
    parts.append(
        f'<text x="{LEFT - 4}" y="{TOP + 4}" text-anchor="end" '
        f"{axis}>{escape(format_bytes(highest))}</text>"
    )
    parts.append(f'<text x="{LEFT - 4}" y="{TOP + plot_h}" text-anchor="end" {axis}>0</text>')
    parts.append(
        f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + plot_h}" y2="{TOP + plot_h}" '
        'stroke="var(--jp-border-color1,#999)" stroke-width="0.5"/>'
    )
    parts.append(
        f'<text x="{LEFT + plot_w / 2:.0f}" y="{HEIGHT - 3}" text-anchor="middle" '
        f"{axis}>measured cells (execution count)</text>"
    )
    label = f"{cuda_label(device)}: allocated and reserved after each of {len(pts)} measured cells"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" '
        f'style="max-width:{WIDTH * 1.5:.0f}px" role="img" aria-label="{escape(label)}">'
        + "".join(parts)
        + "</svg>"
    )


def _tip(r: HistoryRow, d: DeviceRow) -> str:
    cell = f"[{r.execution_count}]" if r.execution_count is not None else "cell"
    lines = [
        f"{cell} {r.first_line}" + (" (failed)" if r.failed else ""),
        f"allocated {format_bytes(d.allocated)} ({_signed(d.allocated_delta)})",
        f"reserved {format_bytes(d.reserved)} ({_signed(d.reserved_delta)})",
        f"peak {format_bytes(d.peak_allocated)} ({_signed(d.peak_above_start)} above start)",
    ]
    if d.kept_at:
        lines.append(f"kept at {d.kept_at}")
    return "\n".join(lines)


def _signed(n: int | None) -> str:
    from ..units import format_delta

    return format_delta(n)


def history_html(rows: Sequence[HistoryRow], device: int) -> str:
    legend = "".join(
        f'<span style="margin-right:12px"><span style="display:inline-block;width:14px;'
        f'height:3px;background-color:{COLORS[k]};margin-right:4px;vertical-align:middle">'
        f"</span>{k}</span>"
        for k in ("allocated", "reserved", "peak")
    )
    svg = history_svg(rows, device)
    if not svg:
        return f"<div>no measured cell touched {cuda_label(device)}</div>"
    return (
        '<div class="jp-GpuMem-historyPlot" style="font-family:var(--jp-ui-font-family,'
        f'sans-serif);font-size:var(--jp-ui-font-size1,13px)"><div>{legend}</div>{picture(svg)}</div>'
    )
