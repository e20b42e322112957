"""Live bars as self-contained HTML, from a protocol ``Sample`` (docs/protocol.md).

Used by the ipywidgets panel (``%gpumem panel``) for frontends without the JupyterLab
extension. Colours come from JupyterLab's CSS variables with plain fallbacks.
"""

from __future__ import annotations

from html import escape
from typing import Any

from ..units import format_bytes as fb

_COLORS = {
    "allocated": "var(--jp-brand-color1,#1976d2)",
    "reserved": "var(--jp-brand-color3,#90caf9)",
    "process": "var(--jp-warn-color2,#ffcc80)",
    "device": "var(--jp-layout-color3,#bdbdbd)",
}


def _pct(part: int | None, whole: int | None) -> float:
    if not part or not whole:
        return 0.0
    return max(0.0, min(100.0, 100.0 * part / whole))


def device_bar_html(d: dict[str, Any]) -> str:
    total = d.get("total")
    layers = [
        ("device", d.get("device_used"), "device used (all processes)"),
        ("process", d.get("process_used"), "this process"),
        ("reserved", d.get("reserved"), "reserved by PyTorch"),
        ("allocated", d.get("allocated"), "allocated (live tensors)"),
    ]
    bars = "".join(
        f'<div title="{escape(label)}: {fb(v)}" style="position:absolute;left:0;top:0;bottom:0;'
        f'width:{_pct(v, total):.2f}%;background:{_COLORS[key]}"></div>'
        for key, v, label in layers
        if v is not None
    )
    peak = d.get("peak_allocated")
    if peak and total:
        bars += (
            f'<div title="peak allocated: {fb(peak)}" style="position:absolute;top:0;bottom:0;'
            f'left:{_pct(peak, total):.2f}%;width:2px;background:var(--jp-error-color1,#d32f2f)">'
            "</div>"
        )
    limit = d.get("limit")
    if limit and total:
        bars += (
            f'<div title="cap: {fb(limit["bytes"])}" style="position:absolute;top:-3px;'
            f"bottom:-3px;left:{_pct(limit['bytes'], total):.2f}%;width:2px;"
            'background:var(--jp-ui-font-color0,#000)"></div>'
        )
    name = f"cuda:{d['index']} {escape(d.get('name') or '')}"
    if d.get("allocated") is None:
        figures = (
            f"device used {fb(d.get('device_used'))} of {fb(total)} (NVML; no CUDA context here)"
        )
    else:
        figures = (
            f"allocated {fb(d['allocated'])} · reserved {fb(d['reserved'])} · "
            f"peak {fb(peak)} · non-releasable {fb(d.get('inactive_split'))} · "
            f"process {fb(d.get('process_used'))} · device {fb(d.get('device_used'))} / {fb(total)}"
        )
        if limit:
            figures += f" · cap {fb(limit['bytes'])}"
    return (
        f'<div class="jp-GpuMem-device" style="margin:4px 0"><div><b>{name}</b></div>'
        '<div style="position:relative;height:14px;border:1px solid var(--jp-border-color1,#999);'
        f'background:var(--jp-layout-color1,#fff)">{bars}</div>'
        f'<div style="font-size:var(--jp-ui-font-size0,11px)">{escape(figures)}</div></div>'
    )


def sample_html(sample: dict[str, Any]) -> str:
    parts = []
    if sample.get("message"):
        parts.append(f"<div><i>{escape(sample['message'])}</i></div>")
    caching = sample.get("caching")
    if caching is not None:
        parts.append(f"<div>caching allocator: {'on' if caching else 'OFF'}</div>")
    parts += [device_bar_html(d) for d in sample.get("devices", [])]
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
            where = f" · cuda:{d['index']}" if d else ""
            figures = (
                f"allocated {fb(d['allocated'])} · peak {fb(d['peak_allocated'])} · "
                f"reserved {fb(d['reserved'])}"
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
