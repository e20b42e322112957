"""Live bars as self-contained HTML, from a protocol ``Sample`` (docs/protocol.md).

Used by the ipywidgets panel (``%gpumem panel``) for frontends without the JupyterLab
extension. Colours come from JupyterLab's CSS variables with plain fallbacks. The bar's
geometry and words follow the JupyterLab panel's (``labextension/src/present/bar.ts``,
``views/overview/deviceSection.tsx``): by default the full width is fitted to what this kernel
holds, so that 800 MiB on a 140 GiB GPU is not a sliver.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any, Literal

from ..units import cuda_label, format_bytes, join_sizes

# What the full width stands for: ``fit``, the largest of what this process holds
# (reserved, peak, cap, its NVML figure), with room; ``total``, the device's capacity.
BarScale = Literal["fit", "total"]

_COLORS = {
    "allocated": "var(--jp-brand-color1,#1976d2)",
    "reserved": "var(--jp-brand-color3,#90caf9)",
    "process": "var(--jp-warn-color2,#ffcc80)",
    "device": "var(--jp-layout-color3,#bdbdbd)",
}
_LABELS = {
    "allocated": "Allocated",
    "reserved": "Reserved",
    "process": "This process",
    "device": "All processes",
}
# The JupyterLab panel's title for a sample's state (present/messages.ts, statusText)
STATE_TITLES = {
    "no_torch": "torch is not imported yet",
    "cpu_only": "This torch is a CPU-only build",
    "no_gpu": "No GPU",
    "not_initialized": "CUDA not initialised: showing NVML figures only",
}
_ROOM = 1.1  # the fitted scale leaves a tenth free: the largest figure is not the edge


@dataclass(frozen=True, slots=True)
class Segment:
    key: str  # allocated, reserved, process, device
    bytes: int
    fraction: float  # of the bar's width, 0..1
    clipped: bool  # larger than the scale: drawn to the end, cut


@dataclass(frozen=True, slots=True)
class BarGeometry:
    scale: float  # bytes the full width stands for
    scale_is_total: bool  # the device's capacity (else fitted to this kernel's figures)
    segments: tuple[Segment, ...]  # outermost first: inner ones are drawn on top
    peak: float | None  # where the peak-allocated mark sits, 0..1
    limit: float | None  # where the cap sits, 0..1


def _bytes(v: Any) -> int | None:
    """A figure that can be drawn: a known, non-negative byte count."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def bar_geometry(d: dict[str, Any], scale: BarScale = "fit") -> BarGeometry:
    """The bar of one protocol ``Device``. Unknown figures are left out, never drawn as 0.
    With ``fit`` the scale fits reserved, peak, cap and this process; other processes'
    memory beyond it is drawn cut. Without any figure of this process (CUDA not
    initialised) the bar shows the device's total."""
    ready = bool(d.get("initialized"))
    limit = _bytes(d["limit"]["bytes"]) if d.get("limit") else None
    peak = _bytes(d.get("peak_allocated")) if ready else None
    figures = [
        (key, v)
        for key, v in (
            ("device", _bytes(d.get("device_used"))),
            ("process", _bytes(d.get("process_used"))),
            ("reserved", _bytes(d.get("reserved")) if ready else None),
            ("allocated", _bytes(d.get("allocated")) if ready else None),
        )
        if v is not None
    ]
    marks = [v for v in (peak, limit) if v is not None]
    fitted = 0.0
    if scale == "fit":
        fitted = max([v for k, v in figures if k != "device"] + marks, default=0) * _ROOM
    total = _bytes(d.get("total")) or 0
    whole = fitted or float(total) or float(max([v for _, v in figures] + marks, default=0))

    def at(v: int) -> float:
        return max(0.0, min(1.0, v / whole)) if whole > 0 else 0.0

    return BarGeometry(
        whole,
        total > 0 and not fitted,
        tuple(Segment(k, v, at(v), whole > 0 and v > whole) for k, v in figures),
        at(peak) if peak is not None and whole > 0 else None,
        at(limit) if limit is not None and whole > 0 else None,
    )


def scale_line(g: BarGeometry) -> str:
    """Which scale the bar is drawn to, in the JupyterLab panel's words."""
    if g.scale_is_total:
        return f"Scale: the device, {format_bytes(int(g.scale))}"
    return f"Scale: 0 to {format_bytes(int(g.scale))}, fitted to this kernel"


def _html(text: str) -> str:
    """Escaped, each size kept on one line."""
    return join_sizes(escape(text), "&nbsp;")


def device_bar_html(d: dict[str, Any], scale: BarScale = "fit") -> str:
    g = bar_geometry(d, scale)
    total = d.get("total")
    bars = "".join(
        f'<div data-segment="{s.key}" data-bytes="{s.bytes}" '
        f'title="{_html(_LABELS[s.key])}: {_html(format_bytes(s.bytes))}'
        f'{" (beyond the scale)" if s.clipped else ""}" style="position:absolute;left:0;'
        f'top:0;bottom:0;width:{100 * s.fraction:.3f}%;background-color:{_COLORS[s.key]}"></div>'
        for s in g.segments
    )
    peak = d.get("peak_allocated")
    if g.peak is not None:
        bars += (
            f'<div data-mark="peak" title="Peak allocated since the last reset: '
            f'{_html(format_bytes(peak))}" style="position:absolute;top:0;bottom:0;'
            f'left:{100 * g.peak:.3f}%;width:2px;background:var(--jp-error-color1,#d32f2f)">'
            "</div>"
        )
    limit = d.get("limit")
    if g.limit is not None and limit:
        bars += (
            f'<div data-mark="cap" title="Cap: {_html(format_bytes(limit["bytes"]))}" '
            f'style="position:absolute;top:-3px;bottom:-3px;left:{100 * g.limit:.3f}%;'
            'width:2px;background:var(--jp-ui-font-color0,#000)"></div>'
        )
    name = f"{cuda_label(d['index'])} {escape(d.get('name') or '')}"
    if d.get("allocated") is None:
        figures = (
            f"device used {format_bytes(d.get('device_used'))} of {format_bytes(total)} "
            "(NVML; no CUDA context here)"
        )
    else:
        figures = (
            f"allocated {format_bytes(d['allocated'])} · reserved {format_bytes(d['reserved'])} · "
            f"peak {format_bytes(peak)} · non-releasable {format_bytes(d.get('inactive_split'))} · "
            f"process {format_bytes(d.get('process_used'))} · device "
            f"{format_bytes(d.get('device_used'))} / {format_bytes(total)}"
        )
        if limit:
            figures += f" · cap {format_bytes(limit['bytes'])}"
    small = "font-size:var(--jp-ui-font-size0,11px)"
    return (
        f'<div class="jp-GpuMem-device" style="margin:4px 0"><div><b>{name}</b></div>'
        f'<div class="jp-GpuMem-scale" data-scale="{scale}" style="{small};'
        f'color:var(--jp-ui-font-color2,#666)">{_html(scale_line(g))}</div>'
        '<div class="jp-GpuMem-bar" style="position:relative;height:14px;overflow:hidden;'
        "border:1px solid var(--jp-border-color1,#999);"
        f'background:var(--jp-layout-color1,#fff)" data-scale-bytes="{g.scale:.0f}">{bars}</div>'
        f'<div style="{small}">{_html(figures)}</div></div>'
    )


def sample_html(sample: dict[str, Any], scale: BarScale = "fit") -> str:
    """A protocol ``Sample`` as the panel's bars, each device's drawn to ``scale``."""
    parts = []
    replay = sample.get("replay")
    if replay:
        from .html import replay_html

        parts.append(replay_html(str(replay.get("description", "replay"))))
    title = STATE_TITLES.get(str(sample.get("state")))
    if title is not None:
        parts.append(f'<div class="jp-GpuMem-state"><b>{escape(title)}</b></div>')
    if sample.get("message"):
        parts.append(f"<div><i>{escape(sample['message'])}</i></div>")
    caching = sample.get("caching")
    if caching is not None:
        parts.append(f"<div>caching allocator: {'on' if caching else 'OFF'}</div>")
    parts += [device_bar_html(d, scale) for d in sample.get("devices", [])]
    if not sample.get("devices"):
        parts.append("<div>no GPU devices</div>")
    if sample.get("workers"):
        parts.append(workers_html(sample["workers"]))
    return '<div class="jp-GpuMem-bars">' + "".join(parts) + "</div>"


def workers_html(workers: list[dict[str, Any]]) -> str:
    """The notebook's worker processes (protocol ``Worker``s), one line per device."""
    lines = []
    for w in workers:
        who = f"rank {w['rank']}" if w.get("rank") is not None else "worker"
        for d in w.get("devices") or [None]:
            where = f" · {cuda_label(d['index'])}" if d else ""
            figures = (
                f"allocated {format_bytes(d['allocated'])} · "
                f"peak {format_bytes(d['peak_allocated'])} · "
                f"reserved {format_bytes(d['reserved'])}"
                if d
                else "no GPU memory"
            )
            lines.append(
                f"<div><b>{escape(who)} (pid {int(w['pid'])}){where}</b> {escape(figures)} "
                f"· {escape(str(w.get('status', '')))}</div>"
            )
    style = "margin:4px 0;font-size:var(--jp-ui-font-size0,11px)"
    return (
        f'<div class="jp-GpuMem-workers" style="{style}"><div><b>worker processes</b></div>'
        + "".join(lines)
        + "</div>"
    )
