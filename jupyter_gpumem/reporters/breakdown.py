"""``%%gpumem --breakdown``: what each device's peak was made of, as text and as HTML (a
stacked bar of the categories, then a table; self-contained, theme colours)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from ..model import Breakdown
from ..units import cuda_label, format_bytes

# Mid-tone colours that read on light and dark backgrounds alike.
COLORS: dict[str, str] = {
    "parameters": "#1e88e5",
    "buffers": "#64b5f6",
    "gradients": "#8e24aa",
    "optimizer state": "#ba68c8",
    "activations": "#fb8c00",
    "library workspaces": "#26a69a",
    "temporaries": "#fdd835",
    "kept from before": "#78909c",
    "block slack": "#b0bec5",
}
MEANING: dict[str, str] = {
    "parameters": "nn.Module parameters",
    "buffers": "nn.Module buffers (running statistics, ...)",
    "gradients": "the parameters' .grad",
    "optimizer state": "tensors the optimizer keeps (momenta, ...)",
    "activations": "tensors autograd saved for backward",
    "library workspaces": "cuBLAS's workspaces, taken from PyTorch's caching allocator",
    "temporaries": "allocated in the cell, alive at the peak, none of the above",
    "kept from before": "alive when the cell began, none of the above",
    "block slack": "the allocator's blocks beyond the tensors' rounded sizes",
}


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "-"


def headline(b: Breakdown) -> str:
    above = b.peak - b.base
    return (
        f"{cuda_label(b.device)} peak {format_bytes(b.peak)} "
        f"({'+' if above >= 0 else ''}{format_bytes(above)} above the start), "
        f"during the {b.phase}"
        if b.phase != "other"
        else f"{cuda_label(b.device)} peak {format_bytes(b.peak)} "
        f"({format_bytes(above)} above the start), outside forward, backward and optimizer steps"
    )


def _notes(b: Breakdown) -> list[str]:
    out = []
    if b.cached_free_at_peak is not None:
        out.append(f"beside it: {format_bytes(b.cached_free_at_peak)} cached but free at the peak")
    if b.outside_torch is not None:
        out.append(
            f"{format_bytes(b.outside_torch)} outside PyTorch (context, libraries; at the end)"
        )
    check = "equals" if b.exact else "differs from"
    if b.counter_peak is not None:
        out.append(
            f"the sum {check} the allocator's own peak counter ({format_bytes(b.counter_peak)})"
        )
    if b.note:
        out.append(b.note)
    return out


def breakdown_text(items: Sequence[Breakdown]) -> str:
    lines = []
    for b in items:
        lines.append(f"  what the peak is made of: {headline(b)}")
        lines.extend(body_lines(b))
    return "\n".join(lines)


def body_lines(b: Breakdown) -> list[str]:
    """One breakdown's categories, notes and modules, indented under its title."""
    lines = []
    width = max((len(c.category) for c in b.categories), default=10)
    for c in b.categories:
        lines.append(
            f"    {c.category:<{width}}  {format_bytes(c.bytes):>12}  {_share(c.bytes, b.peak):>7}"
            f"  {c.blocks} block(s)"
        )
    lines.append(f"    {'total':<{width}}  {format_bytes(sum(c.bytes for c in b.categories)):>12}")
    for n in _notes(b):
        lines.append(f"    {n}")
    if b.modules:
        lines.append("    modules by bytes alive at the peak (activations + temporaries):")
        for m in b.modules:
            lines.append(
                f"      {m.module}: {format_bytes(m.bytes)} "
                f"({format_bytes(m.activations)} activations, "
                f"{format_bytes(m.temporaries)} temporaries)"
            )
    return lines


def _bar(b: Breakdown) -> str:
    if not b.peak:
        return ""
    parts = []
    for c in b.categories:
        width = 100 * c.bytes / b.peak
        if width <= 0:
            continue
        tip = f"{c.category}: {format_bytes(c.bytes)} ({_share(c.bytes, b.peak)})"
        parts.append(
            f'<div title="{escape(tip)}" style="width:{width:.3f}%;'
            f'background-color:{COLORS[c.category]}"></div>'
        )
    return (
        '<div class="jp-GpuMem-breakdown-bar" role="img" aria-label="what the peak is made of" '
        'style="display:flex;height:16px;margin:4px 0;'
        'border:1px solid var(--jp-border-color1,#999)">' + "".join(parts) + "</div>"
    )


_CELL = "padding:1px 8px;text-align:left"
_NUM = "padding:1px 8px;text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap"


def breakdown_html(items: Sequence[Breakdown]) -> str:
    out = []
    for b in items:
        out.append(
            '<div class="jp-GpuMem-breakdown" style="margin:6px 0">'
            f"<div><b>{escape('what the peak is made of: ' + headline(b))}</b></div>"
            f"{body_html(b)}</div>"
        )
    return "".join(out)


def body_html(b: Breakdown) -> str:
    """One breakdown's bar, table, notes and modules (the HTML twin of body_lines)."""
    rows = []
    for c in b.categories:
        swatch = (
            f'<span style="display:inline-block;width:10px;height:10px;margin-right:6px;'
            f'background-color:{COLORS[c.category]}"></span>'
        )
        rows.append(
            f'<tr title="{escape(MEANING[c.category])}"><td style="{_CELL}">{swatch}'
            f'{escape(c.category)}</td><td style="{_NUM}">{format_bytes(c.bytes)}</td>'
            f'<td style="{_NUM}">{_share(c.bytes, b.peak)}</td>'
            f'<td style="{_NUM}">{c.blocks}</td></tr>'
        )
    total = sum(c.bytes for c in b.categories)
    rows.append(
        f'<tr><td style="{_CELL}"><b>total</b></td><td style="{_NUM}"><b>{format_bytes(total)}</b>'
        f'</td><td style="{_NUM}"></td><td style="{_NUM}"></td></tr>'
    )
    notes = "".join(f"<div>{escape(n)}</div>" for n in _notes(b))
    modules = ""
    if b.modules:
        mrows = "".join(
            f'<tr><td style="{_CELL}">{escape(m.module)}</td><td style="{_NUM}">'
            f"{format_bytes(m.activations)}</td>"
            f'<td style="{_NUM}">{format_bytes(m.temporaries)}</td></tr>'
            for m in b.modules
        )
        modules = (
            '<table style="border-collapse:collapse;margin-top:4px"><tr>'
            f'<th style="{_CELL}">module</th><th style="{_NUM}">activations</th>'
            f'<th style="{_NUM}">temporaries</th></tr>{mrows}</table>'
        )
    return (
        f"{_bar(b)}"
        '<table style="border-collapse:collapse">'
        f'<tr><th style="{_CELL}">category</th><th style="{_NUM}">bytes</th>'
        f'<th style="{_NUM}">share</th><th style="{_NUM}">blocks</th></tr>'
        f"{''.join(rows)}</table>{notes}{modules}"
    )
