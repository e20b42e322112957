"""``%%gpumem --scan``: the runs, the fit, the budget, the verification and the answer, as
text and as HTML with an inline SVG of the peak against the scanned value."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from ..analysis.fit import formula
from ..model import ScanResult, ScanRun
from ..units import cuda_label, format_bytes
from ..units import format_delta as fd
from .picture import picture

COLUMNS = (
    "run",
    "value",
    "peak allocated",
    "peak in",
    "peak reserved",
    "margin",
    "kept",
    "time",
    "result",
)
_KIND = {"probe": "probe", "repeat": "probe again", "verify": "verify"}


def _value(v: float, integer: bool) -> str:
    return str(int(v)) if integer else f"{v:g}"


def run_rows(runs: Sequence[ScanRun], integer: bool) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for r in runs:
        if r.ok:
            result = "ok" + (f" under the {format_bytes(r.cap)} cap" if r.cap is not None else "")
        elif r.oom:
            result = "out of memory" + (
                f" under the {format_bytes(r.cap)} cap" if r.cap is not None else ""
            )
        else:
            result = r.error or "failed"
        rows.append(
            (
                _KIND[r.kind],
                _value(r.value, integer),
                format_bytes(r.peak_allocated),
                r.peak_phase or "",
                format_bytes(r.peak_reserved),
                format_bytes(r.margin),
                fd(r.kept),
                f"{r.wall_time * 1000:.1f} ms" if r.wall_time < 1 else f"{r.wall_time:.2f} s",
                result,
            )
        )
    return rows


def budget_lines(r: ScanResult) -> list[str]:
    t = r.target
    lines = [f"target: {t.label} ({t.source})"]
    if t.whole_card:
        lines.append(
            f"  - {format_bytes(r.outside_torch)} this process holds outside PyTorch (context, "
            f"libraries; measured here) = {format_bytes(r.cap)} PyTorch may reserve"
        )
    else:
        lines.append(f"  = {format_bytes(r.cap)} PyTorch may reserve")
    lines.append(
        f"  - {format_bytes(r.margin)} fragmentation margin "
        "(the most a probe could not use: reserved "
        f"beyond allocated at its peak, at most its free pieces of used segments) = "
        f"{format_bytes(r.budget)} for the peak allocated"
    )
    return lines


def fit_lines(r: ScanResult) -> list[str]:
    if r.fit is None:
        return []
    f = r.fit
    res = ", ".join(
        f"{_value(x, r.integer)}: {fd(round(e))}" for x, e in zip(f.xs, f.residuals, strict=True)
    )
    if not f.phases:
        return [f"fit ({f.kind}): {formula(f, r.name)}", f"  residuals (measured - fitted): {res}"]
    lines = [f"fit per phase: peak({r.name}) = the largest of the phases' peaks"]
    for c in f.phases:
        binds = " (binds at the prediction)" if c.phase == f.phase and r.predicted else ""
        peaks = ", ".join(format_bytes(y) for y in c.ys)
        lines.append(f"  {c.phase} ({c.kind}): {formula(c, r.name)}{binds}; measured {peaks}")
    lines.append(f"  residuals of the peak (measured - fitted): {res}")
    return lines


def scan_text(r: ScanResult) -> str:
    from .text import table_text

    cell = f" of cell [{r.execution_count}]" if r.execution_count is not None else ""
    lines = [f"gpumem: scan{cell}: {r.name} on {cuda_label(r.device)}"]
    lines.append(table_text(COLUMNS, run_rows(r.runs, r.integer)))
    lines += fit_lines(r)
    lines += budget_lines(r)
    if r.predicted is not None:
        lines.append(f"prediction: {r.name} = {_value(r.predicted, r.integer)}")
    if r.verify_note:
        lines.append(r.verify_note)
    lines += [f"note: {n}" for n in r.notes]
    lines.append(r.answer)
    return "\n".join(lines)


def stopped_text(runs: Sequence[ScanRun], why: str, integer: bool) -> str:
    from .text import table_text

    lines = [f"gpumem: scan stopped: {why}"]
    if runs:
        lines.append(table_text(COLUMNS, run_rows(runs, integer)))
    return "\n".join(lines)


# -- the picture ------------------------------------------------------------------------
W, H = 560, 220
L, R, T, B = 70, 16, 14, 34
_INK = "var(--jp-ui-font-color1,#333)"
_DIM = "var(--jp-ui-font-color2,#777)"


def scan_svg(r: ScanResult) -> str:
    points = [x for x in r.runs if x.peak_allocated is not None]
    if not points:
        return ""
    xs = [p.value for p in points] + ([r.predicted] if r.predicted is not None else [])
    x_hi = max(xs) * 1.08 or 1.0
    y_hi = max([p.peak_allocated or 0 for p in points] + [r.cap]) * 1.08 or 1.0
    pw, ph = W - L - R, H - T - B

    def sx(v: float) -> float:
        return L + v / x_hi * pw

    def sy(v: float) -> float:
        return T + ph - max(0.0, v) / y_hi * ph

    out = []
    axis = f'font-size="10" fill="{_DIM}"'
    out.append(f'<line x1="{L}" y1="{T + ph}" x2="{L + pw}" y2="{T + ph}" stroke="{_DIM}"/>')
    out.append(f'<line x1="{L}" y1="{T}" x2="{L}" y2="{T + ph}" stroke="{_DIM}"/>')
    for frac in (0, 0.5, 1):
        v = y_hi / 1.08 * frac
        out.append(
            f'<text x="{L - 4}" y="{sy(v) + 3:.1f}" text-anchor="end" '
            f"{axis}>{format_bytes(round(v))}</text>"
        )
    for v in sorted({p.value for p in points}):
        out.append(
            f'<text x="{sx(v):.1f}" y="{T + ph + 12}" text-anchor="middle" {axis}>'
            f"{escape(_value(v, r.integer))}</text>"
        )
    middle = f'x="{L + pw / 2:.0f}" y="{H - 4}" text-anchor="middle"'
    out.append(f"<text {middle} {axis}>{escape(r.name)}</text>")
    # the cap and the budget
    for level, label, dash in ((r.cap, "cap", ""), (r.budget, "budget", ' stroke-dasharray="4 3"')):
        out.append(
            f'<line x1="{L}" y1="{sy(level):.1f}" x2="{L + pw}" y2="{sy(level):.1f}" '
            f'stroke="var(--jp-error-color1,#d32f2f)"{dash}><title>{label}: '
            f"{format_bytes(level)}</title>"
            "</line>"
        )
        out.append(
            f'<text x="{L + pw - 2}" y="{sy(level) - 3:.1f}" text-anchor="end" font-size="10" '
            f'fill="var(--jp-error-color1,#d32f2f)">{label} {format_bytes(level)}</text>'
        )
    if r.fit is not None:
        steps = 48
        path = " ".join(
            f"{'M' if i == 0 else 'L'}{sx(x_hi * i / steps):.1f},{sy(r.fit(x_hi * i / steps)):.1f}"
            for i in range(steps + 1)
        )
        out.append(
            f'<path d="{path}" fill="none" stroke="var(--jp-brand-color1,#1976d2)" '
            f'stroke-width="1.5"><title>{escape(formula(r.fit, r.name))}</title></path>'
        )
    for p in points:
        color = "var(--jp-brand-color1,#1976d2)" if p.ok else "var(--jp-error-color1,#d32f2f)"
        shape = "rect" if p.kind == "verify" else "circle"
        tip = (
            f"{_KIND[p.kind]} {r.name}={_value(p.value, r.integer)}: "
            f"peak {format_bytes(p.peak_allocated)}"
        )
        tip += "" if p.ok else " (out of memory)"
        cx, cy = sx(p.value), sy(p.peak_allocated or 0)
        if shape == "circle":
            out.append(
                f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3.5" fill="{color}">'
                f"<title>{escape(tip)}</title></circle>"
            )
        else:
            fill = color if p.ok else "none"
            out.append(
                f'<rect x="{cx - 3.5:.1f}" y="{cy - 3.5:.1f}" width="7" height="7" fill="{fill}" '
                f'stroke="{color}"><title>{escape(tip)}</title></rect>'
            )
    if r.largest is not None:
        x = sx(r.largest)
        out.append(
            f'<line x1="{x:.1f}" y1="{T}" x2="{x:.1f}" y2="{T + ph}" stroke="{_INK}" '
            f'stroke-dasharray="2 2"/><text x="{x + 3:.1f}" y="{T + 10}" font-size="10" '
            f'fill="{_INK}">{escape(_value(r.largest, r.integer))}</text>'
        )
    label = f"peak allocated against {r.name}, with the fit, the cap and the answer"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="100%" '
        f'style="max-width:{W}px" role="img" aria-label="{escape(label)}">'
        f"<title>{escape(label)}</title>{''.join(out)}</svg>"
    )


def scan_html(r: ScanResult) -> str:
    from .html import table_html

    cell = f" of cell [{r.execution_count}]" if r.execution_count is not None else ""
    parts = [
        f'<div class="jp-GpuMem-scan"><div><b>{escape(r.answer)}</b></div>',
        f"<div>scan{escape(cell)}: {escape(r.name)} on {cuda_label(r.device)}</div>",
        picture(scan_svg(r)),
        table_html(COLUMNS, run_rows(r.runs, r.integer)),
    ]
    parts += [f"<div>{escape(line)}</div>" for line in fit_lines(r) + budget_lines(r)]
    if r.verify_note:
        parts.append(f"<div>{escape(r.verify_note)}</div>")
    parts += [f"<div>note: {escape(n)}</div>" for n in r.notes]
    parts.append("</div>")
    return "".join(parts)
