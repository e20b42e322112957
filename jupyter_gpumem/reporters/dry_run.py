"""``%%gpumem --dry-run``: the predicted peaks per device, what each peak would be made of
(the ``--breakdown`` report: categories, phase, modules), what sits beside them, and, last,
the answer to "does it fit", as text and as HTML (an HTML table, the breakdown's bar).
Every figure is marked predicted; ``--check``'s measured figures stand beside them."""

from __future__ import annotations

from dataclasses import replace
from html import escape

from ..analysis.dry_breakdown import is_predicted
from ..model import CATEGORIES, Breakdown, DryRun, DryScan
from ..units import cuda_label, format_bytes
from .breakdown import body_html, body_lines
from .html import table_html
from .text import table_text

PREDICTED = "predicted, nothing ran on the GPU"


def _percent(predicted: int, measured: int) -> str:
    if measured <= 0:
        return ""
    return f" ({100 * (predicted - measured) / measured:+.1f} %)"


def headline(r: DryRun) -> str:
    where = f"cell [{r.execution_count}]" if r.execution_count is not None else "function"
    rank = f", as rank 0 of {r.world_size} processes" if r.world_size > 1 else ""
    return f"gpumem: dry run of {where}{rank}: {PREDICTED} ({r.seconds:.2f} s)"


def rows(r: DryRun) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for d in r.devices:
        out.append(
            (
                f"{cuda_label(d.device)}",
                format_bytes(d.peak_allocated),
                format_bytes(d.peak_reserved),
                format_bytes(d.workspaces),
                str(d.requests),
                str(d.segments),
                d.out_of_memory or "",
            )
        )
    return out


COLUMNS = (
    "device",
    "peak allocated",
    "peak reserved",
    "of it cuBLAS workspaces",
    "allocations",
    "cudaMalloc",
    "under the cap",
)


def answer(r: DryRun) -> str:
    if r.target is None:
        return ""
    if r.stopped is not None:
        need = f" (what it saw needs {format_bytes(r.need)})" if r.need is not None else ""
        return f"fits in {r.target.label}: unknown: the dry run stopped before the cell's end{need}"
    if r.fits is None or r.headroom is None:
        return f"fits in {r.target.label}: unknown ({r.outside_source})"
    need = ""
    if r.need is not None:
        held = (
            f" with what it uses of the kernel's tensors ({format_bytes(r.held)})" if r.held else ""
        )
        need = (
            f" (needs {format_bytes(r.need)} in a fresh process{held}, the CUDA context included)"
        )
    if r.unseen:
        need += f"; a lower bound: not seen: {', '.join(r.unseen)}"
    if r.fits:
        return f"fits in {r.target.label}: yes, with {format_bytes(r.headroom)} to spare{need}"
    return f"fits in {r.target.label}: no, about {format_bytes(-r.headroom)} short{need}"


def breakdown_title(b: Breakdown) -> str:
    """The heading of a device's predicted breakdown."""
    when = (
        f"during the {b.phase}"
        if b.phase != "other"
        else "outside forward, backward and optimizer steps"
    )
    return (
        f"what the peak would be made of (predicted): {cuda_label(b.device)} peak allocated "
        f"{format_bytes(b.peak)}, {when}"
    )


def _body(b: Breakdown) -> Breakdown:
    """The breakdown as the dry run's report shows it: its title already says predicted."""
    return replace(b, note="") if is_predicted(b) else b


def breakdown_lines(r: DryRun) -> list[str]:
    out: list[str] = []
    for d in r.devices:
        if d.breakdown is not None:
            out.append(f"  {breakdown_title(d.breakdown)}")
            out.extend(body_lines(_body(d.breakdown)))
    return out


def lines(r: DryRun) -> list[str]:
    """The report's lines: headline, stopped, the table, the breakdowns, then
    :func:`tail_lines` (what sits beside, checks, notes, and last the answer)."""
    out = [headline(r)]
    if r.stopped is not None:
        out.append(f"  stopped: {r.stopped}")
    out.append(table_text(COLUMNS, rows(r)))
    out.extend(breakdown_lines(r))
    out.extend(tail_lines(r))
    return out


def _owners(held_by: tuple[tuple[str, int], ...], limit: int = 4) -> str:
    shown = [f"{name} {format_bytes(n)}" for name, n in held_by[:limit]]
    if len(held_by) > limit:
        shown.append(f"{len(held_by) - limit} more")
    return ", ".join(shown)


def held_lines(r: DryRun) -> list[str]:
    """What the kernel held before the cell: counted (the cell uses it) and not."""
    out: list[str] = []
    for d in r.devices:
        if d.held:
            who = f" ({_owners(r.held_by)})" if r.held_by and len(r.devices) == 1 else ""
            own = d.peak_allocated - d.held - d.untouched * d.untouched_counted
            out.append(
                f"held before the cell on {cuda_label(d.device)}: {format_bytes(d.held)}{who}, "
                "what the cell uses of the kernel's tensors, counted from the cell's start as "
                "a fresh process that ran the earlier cells holds it; the cell's own peak: "
                f"{format_bytes(max(0, own))} allocated above that"
            )
        if d.untouched:
            if d.untouched_counted:
                out.append(
                    f"counted too (--count-untouched): {format_bytes(d.untouched)} more that "
                    f"the kernel holds on {cuda_label(d.device)} and the cell does not use"
                )
            else:
                out.append(
                    f"not counted: the kernel holds {format_bytes(d.untouched)} more on "
                    f"{cuda_label(d.device)} that the cell does not use (a fresh process running "
                    "this cell needs none of it; --count-untouched counts it)"
                )
    return out


def tail_lines(r: DryRun) -> list[str]:
    """What follows the breakdowns; the answer against the card is the last line."""
    out: list[str] = held_lines(r)
    if r.outside is not None:
        out.append(
            f"beside PyTorch: {format_bytes(r.outside)} (CUDA context and libraries; "
            f"{r.outside_source})"
        )
    else:
        out.append(f"beside PyTorch: unknown ({r.outside_source})")
    for c in r.checks:
        d = next((x for x in r.devices if x.device == c.device), None)
        if not c.ran or d is None:
            out.append(f"check: {cuda_label(c.device)} did not run for real: {c.note}")
            continue
        base = d.held + d.untouched * d.untouched_counted  # the check measures above it
        allocated, reserved = d.peak_allocated - base, d.peak_reserved - base
        above = " above the cell's start" if base else ""
        out.append(
            f"check, run for real on {cuda_label(c.device)}{above}: peak allocated "
            f"{format_bytes(c.peak_allocated)} measured, {format_bytes(allocated)} predicted"
            f"{_percent(allocated, c.peak_allocated)}; peak reserved "
            f"{format_bytes(c.peak_reserved)} measured, {format_bytes(reserved)} predicted"
            f"{_percent(reserved, c.peak_reserved)}"
        )
        if c.breakdown is not None and d.breakdown is not None:
            out.extend(compared_lines(d.breakdown, c.breakdown))
    out.extend(f"note: {n}" for n in r.notes)
    if r.target is not None:
        out.append(answer(r))
    return out


def compared_lines(predicted: Breakdown, measured: Breakdown) -> list[str]:
    """The predicted peak's categories beside the measured run's (``--check``): the phase
    of each, then one row per category either has."""
    out = [
        (
            f"  what the peak was made of, predicted / measured: during the {predicted.phase} / "
            f"during the {measured.phase} (the measured run counts cuBLAS's workspaces as "
            "temporaries or kept from before)"
        )
    ]
    rows = []
    for category in CATEGORIES:
        p, m = predicted.bytes_of(category), measured.bytes_of(category)
        if p or m:
            rows.append(
                (
                    category,
                    format_bytes(p),
                    format_bytes(m),
                    _percent(p, m).strip(" ()") if m else "",
                )
            )
    out.extend(
        "    " + line
        for line in table_text(("category", "predicted", "measured", ""), rows).splitlines()
    )
    return out


def dry_run_text(r: DryRun) -> str:
    return "\n".join(lines(r))


def dry_run_html(r: DryRun) -> str:
    """The HTML twin of :func:`dry_run_text`, in the same order: headline, stopped, the
    table, each device's predicted breakdown (bar, categories, modules), what sits beside,
    checks, notes, and last the answer (in bold)."""
    parts = [
        (f'<div class="jp-GpuMem-dryRun"><div style="font-weight:bold">{escape(headline(r))}</div>')
    ]
    if r.stopped is not None:
        parts.append(f"<div>stopped: {escape(r.stopped)}</div>")
    parts.append(table_html(COLUMNS, rows(r)))
    for d in r.devices:
        if d.breakdown is not None:
            parts.append(
                '<div class="jp-GpuMem-breakdown" style="margin:6px 0">'
                f"<div><b>{escape(breakdown_title(d.breakdown))}</b></div>"
                f"{body_html(_body(d.breakdown))}</div>"
            )
    tail = tail_lines(r)
    last = answer(r) if r.target is not None else None
    for line in tail:
        if line == last:
            parts.append(f'<div style="font-weight:bold">{escape(line)}</div>')
        elif line.startswith("  "):  # the check's categories: a table of aligned columns
            parts.append(f'<pre style="margin:0">{escape(line)}</pre>')
        else:
            parts.append(f"<div>{escape(line)}</div>")
    parts.append("</div>")
    return "".join(parts)


# -- a scan without running ------------------------------------------------------------------
SCAN_COLUMNS = ("value", "peak allocated", "peak reserved", "with the context", "fits")


def _v(v: float | None, integer: bool) -> str:
    if v is None:
        return "-"
    return str(int(v)) if integer else f"{v:g}"


def scan_rows(s: DryScan) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for p in s.points:
        fits = "?" if p.fits is None else ("yes" if p.fits else "no")
        out.append(
            (
                _v(p.value, s.integer),
                format_bytes(p.peak_allocated),
                format_bytes(p.peak_reserved),
                format_bytes(p.need) if p.need is not None else "-",
                fits,
            )
        )
    return out


def scan_answer(s: DryScan) -> str:
    where = s.target.label
    if s.largest is None:
        first = s.points[0] if s.points else None
        need = (
            f": {_v(first.value, s.integer)} needs {format_bytes(first.need)}"
            if first and first.need
            else ""
        )
        return f"no value tried fits in {where}{need} (predicted); scan smaller values"
    tail = ""
    if s.smallest_failing is not None:
        p = next((p for p in s.points if p.value == s.smallest_failing), None)
        if p is not None and p.need is not None:
            tail = f"; {_v(p.value, s.integer)} needs {format_bytes(p.need)}"
    if s.unseen:
        tail += (
            f"; at most: not seen: {', '.join(s.unseen)}, which a value this close to the "
            "card may not have room for"
        )
    # unseen ops: the largest may not fit (an upper bound); no value failed: larger ones
    # may fit too (everything tried fit, or the search stopped): a floor
    bound = "at most " if s.unseen else "at least " if s.smallest_failing is None else ""
    return (
        f"largest {s.name} that fits in {where}: {bound}{_v(s.largest, s.integer)} "
        f"(predicted by {len(s.points)} dry runs, nothing ran on the GPU{tail})"
    )


def _scan_held(s: DryScan) -> str:
    held = sum(n for _, n in s.held_by)
    return (
        f"held before the cell: {format_bytes(held)} ({_owners(s.held_by)}), counted in each "
        "value's need"
    )


def dry_scan_lines(s: DryScan) -> list[str]:
    where = f"cell [{s.execution_count}]" if s.execution_count is not None else "function"
    rank = f", as rank 0 of {s.world_size} processes" if s.world_size > 1 else ""
    return [
        f"gpumem: scan of {where} without running{rank}: {s.name} ({s.seconds:.1f} s)",
        table_text(SCAN_COLUMNS, scan_rows(s)),
        (
            f"target: {s.target.label} ({s.target.source}); "
            f"beside PyTorch {format_bytes(s.outside)} "
            f"({s.outside_source})"
        ),
        *([_scan_held(s)] if s.held_by else []),
        scan_answer(s),
        *(f"note: {n}" for n in s.notes),
    ]


def dry_scan_text(s: DryScan) -> str:
    return "\n".join(dry_scan_lines(s))


def dry_scan_html(s: DryScan) -> str:
    lines = dry_scan_lines(s)
    return (
        f'<div class="jp-GpuMem-dryRun"><div style="font-weight:bold">{escape(lines[0])}</div>'
        + table_html(SCAN_COLUMNS, scan_rows(s))
        + "".join(f"<div>{escape(line)}</div>" for line in lines[2:])
        + "</div>"
    )
