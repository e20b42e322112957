"""A comparison of two runs (:class:`~jupyter_gpumem.model.RunDiff`) as text for a
terminal and as Markdown for a pull request comment; the words both share (and the HTML
views, ``run_diff_html.py``)."""

from __future__ import annotations

import re
from html import escape

from ..model import CellDiff, DeviceDiff, FigureChange, RunDiff, Why
from ..model.run_diff import MATCH_KINDS
from ..units import cuda_label, format_bytes, format_delta

LABELS = {
    "peak": "peak",
    "kept": "kept",
    "allocated": "allocated",
    "reserved": "reserved",
    "peak_reserved": "peak reserved",
}
MATCH_WORDS = {
    "same": "same code",
    "moved": "moved",
    "edited": "edited",
    "added": "added",
    "removed": "removed",
}


# -- shared words -----------------------------------------------------------------------------
def percent(f: FigureChange) -> str:
    change = f.change
    if change is None or not f.before:
        return ""
    return f"{change / abs(f.before) * 100:+.1f}%"


def change_text(f: FigureChange, nested: bool = False) -> str:
    """``+1.00 GiB (+19.2%)`` (``nested``: ``+1.00 GiB, +19.2%``, to go in brackets),
    ``0 B``, ``-`` (no figure)."""
    if f.change is None:
        return "-"
    p = percent(f)
    if not (p and f.change):
        return format_delta(f.change)
    return format_delta(f.change) + (f", {p}" if nested else f" ({p})")


def judged_text(f: FigureChange) -> str:
    """How the figure was judged: ``exact`` or the spread it was given."""
    if f.judged == "exact":
        return "exact"
    s = f.spread
    if s is None:
        return "reserved"
    if s.measured:
        runs = f" over {s.runs} runs" if s.runs else ""
        return f"reserved, spread {format_bytes(s.low)}..{format_bytes(s.high)}{runs}"
    return f"reserved, default spread ±{format_bytes(s.high - (f.before or 0))}"


def where(d: DeviceDiff) -> str:
    return f"{d.worker} {cuda_label(d.device)}" if d.worker else cuda_label(d.device)


def why_text(w: Why, before: str) -> str:
    """One reason, in words."""
    if w.kind == "carried":
        return (
            f"it began with {format_delta(w.change)} {w.name} "
            f"({format_bytes(w.before)} -> {format_bytes(w.after)}): earlier cells keep more"
        )
    if w.kind == "new_line":
        return f"{w.name} now keeps {format_bytes(w.after)} (nothing from this line in {before})"
    if w.kind == "line":
        if w.after is None:
            return f"{w.name} kept {format_bytes(w.before)} in {before}, nothing now"
        return (
            f"{w.name} keeps {format_delta(w.change)} ({format_bytes(w.before)} -> "
            f"{format_bytes(w.after)})"
        )
    what = "category" if w.kind == "category" else "module"
    return (
        f"{what} {w.name} at the peak: {format_delta(w.change)} "
        f"({format_bytes(w.before or 0)} -> {format_bytes(w.after or 0)})"
    )


def tolerance_text(diff: RunDiff) -> str:
    t = diff.tolerance
    parts = ([f"{t.relative * 100:g}%"] if t.relative else []) + (
        [format_bytes(t.absolute)] if t.absolute else []
    )
    if not parts:
        return "0 B"
    return parts[0] if len(parts) == 1 else f"the larger of {parts[0]} and {parts[1]}"


def judged_sentence(diff: RunDiff) -> str:
    """How each kind of figure was judged, and whether the spread was measured."""
    tol = tolerance_text(diff)
    measured = [
        f.spread
        for c in diff.cells
        for d in c.devices
        for f in d.figures
        if f.spread is not None and f.spread.measured
    ]
    share, floor = diff.default_spread
    if measured:
        spread = f"the spread measured over repeated runs of {diff.before}"
    else:
        spread = (
            f"a default spread ({share * 100:g}% of the figure, at least "
            f"{format_bytes(floor)}; not measured: save {diff.before} with --repeat 3 to "
            "measure it)"
        )
    return (
        f"Exact figures (peak, kept, allocated: PyTorch's counters) may grow by {tol}. "
        f"Reserved figures (reserved, peak reserved: they depend on the caching allocator's "
        f"history) may grow by {spread}, plus {tol}."
    )


def whole_run_text(diff: RunDiff) -> list[str]:
    out = []
    for d in diff.run:
        f = d.figure("peak")
        if f is None or f.change is None:
            continue
        out.append(
            f"{where(d)} peak {format_bytes(f.before)} -> {format_bytes(f.after)}"
            + (f", {change_text(f)}" if f.change else "")
        )
    return out


def _largest(c: CellDiff) -> str:
    """The cell's largest own regression: ``peak +2.00 GiB (+100.0%)``."""
    regs = [(d, f) for d, f in c.regressions if not f.inherited] or list(c.regressions)
    # an exact figure first: it is certain, where reserved depends on the allocator's history
    d, f = max(regs, key=lambda df: (df[1].judged == "exact", df[1].change or 0))
    on = f" on {where(d)}" if len(c.devices) > 1 else ""
    return f"{LABELS[f.figure]} {change_text(f, nested=True)}{on}"


def headline(diff: RunDiff) -> str:
    if diff.error is not None:
        return f"{diff.after} did not complete, its figures are partial: {diff.error}"
    regressed = [c for c in diff.cells if c.regressions]
    own = [c for c in regressed if not c.carried_only]
    carried = len(regressed) - len(own)
    run = "; ".join(whole_run_text(diff))
    run = f"; whole run: {run}" if run else ""
    if own:
        first = f"{own[0].ref.label} ({_largest(own[0])})"
        what = (
            f"{first} grew past what is allowed"
            if len(own) == 1
            else f"{len(own)} cells grew past what is allowed, first {first}"
        )
    elif carried:
        what = "no cell grew past what is allowed by itself"
    elif diff.run_regressions:
        what = "the whole run grew past what is allowed"
    else:
        n = sum(1 for c in diff.cells if c.devices and c.before and c.after)
        cells = f"{n} cell{'s' if n != 1 else ''}"
        return f"no figure grew past what is allowed ({cells} compared){run}"
    if carried:
        what += (
            f"; {carried} cell{'s' if carried != 1 else ''} only because earlier cells keep more"
        )
    return what + run


def verdict_line(diff: RunDiff, exit_code: bool = True) -> str:
    """``FAIL (exit 1): ...`` for a command; ``REGRESSION: ...`` in a notebook."""
    if exit_code:
        word = {0: "OK", 1: "FAIL", 2: "ERROR"}[diff.exit_code]
        return f"{word} (exit {diff.exit_code}): {headline(diff)}"
    word = {0: "OK", 1: "REGRESSION", 2: "INCOMPLETE"}[diff.exit_code]
    return f"{word}: {headline(diff)}"


def match_summary(diff: RunDiff) -> str:
    counts = [(k, diff.count(k)) for k in MATCH_KINDS]
    return ", ".join(f"{n} {MATCH_WORDS[k]}" for k, n in counts if n or k == "same")


def cell_title(c: CellDiff, diff: RunDiff) -> str:
    """``cell 5 [3] `x = f()` (edited, 78% alike; was cell 4 [3] `x = g()`)``."""
    bits = [MATCH_WORDS[c.match]]
    if c.similarity is not None:
        bits[0] += f", {c.similarity * 100:.0f}% alike"
    if c.before is not None and c.after is not None and c.before.label != c.after.label:
        bits.append(f"{diff.before}: {c.before.label}")
    return f"{c.ref.label} ({'; '.join(bits)})"


def changed(c: CellDiff) -> bool:
    return any(f.change for d in c.devices for f in d.figures)


# -- text ------------------------------------------------------------------------------------
def _figure_rows(d: DeviceDiff) -> list[str]:
    rows = []
    for f in d.figures:
        if f.change is None:
            continue
        mark = {"regression": "REGRESSION", "improvement": "improved"}.get(f.outcome, "")
        rows.append(
            f"{LABELS[f.figure]:<13} {format_bytes(f.before):>10} -> {format_bytes(f.after):>10}"
            f"  {change_text(f):<20}  allowed {format_delta(f.allowed):<12}  "
            f"{judged_text(f)}  {mark}".rstrip()
        )
    return rows


def carried_text(c: CellDiff) -> str:
    """A cell that regressed only because it began with more, in one line."""
    figures = ", ".join(
        dict.fromkeys(f"{LABELS[f.figure]} {format_delta(f.change)}" for _, f in c.regressions)
    )
    return f"{c.ref.label}: {figures}"


def diff_text(diff: RunDiff, verdict: bool = True, exit_code: bool = True) -> str:
    """The comparison for a terminal: each regression and why, what improved, the cells
    that moved, changed, came or went; ``verdict``: and the verdict line last (with the
    exit code: ``exit_code``)."""
    lines = [f"GPU memory: {diff.after} against {diff.before}", judged_sentence(diff)]
    lines += [f"warning: {w}" for w in diff.warnings]
    for c in diff.cells:
        if not c.regressions or c.carried_only:
            continue
        lines.append("")
        lines.append(f"REGRESSION {cell_title(c, diff)}")
        lines += [f"  code: {line}" for line in c.code]
        lines += [f"  note: {n}" for n in c.notes]
        for d in c.devices:
            if not d.regressions:
                continue
            lines.append(f"  {where(d)}")
            lines += [f"    {r}" for r in _figure_rows(d)]
            lines += [f"    why: {why_text(w, diff.before)}" for w in d.why]
            lines += [f"    note: {n}" for n in d.notes]
    carried = [c for c in diff.cells if c.carried_only]
    if carried:
        lines += ["", "higher only because earlier cells keep more (their own part is allowed):"]
        lines += [f"  {carried_text(c)}" for c in carried]
    better = [
        (c, d, f)
        for c in diff.cells
        for d in c.devices
        for f in d.figures
        if f.outcome == "improvement"
    ]
    if better:
        lines += ["", "improved:"]
        lines += [
            f"  {c.ref.label} {where(d)} {LABELS[f.figure]} {format_bytes(f.before)} -> "
            f"{format_bytes(f.after)}, {change_text(f)}"
            for c, d, f in better
        ]
    other = [c for c in diff.cells if c.match != "same" and not c.regressions]
    if other:
        lines += ["", "moved, edited, added or removed:"]
        for c in other:
            lines.append(f"  {cell_title(c, diff)}")
            lines += [f"    code: {line}" for line in c.code]
    notes = [(c, n) for c in diff.cells if not c.regressions for n in c.notes]
    if notes:
        lines += ["", "notes:"]
        lines += [f"  {c.ref.label}: {n}" for c, n in notes]
    lines += ["", f"cells: {match_summary(diff)}"]
    lines += [f"whole run: {r}" for r in whole_run_text(diff)]
    if verdict:
        lines.append(verdict_line(diff, exit_code))
    return "\n".join(lines)


# -- Markdown (a pull request comment) --------------------------------------------------------
def md_code(text: str) -> str:
    """Code inside Markdown, also inside a table: escaped HTML, no pipe."""
    return "<code>" + escape(text, quote=False).replace("|", "&#124;") + "</code>"


def md_text(text: str) -> str:
    """Text inside Markdown, also inside a table: `code` spans become escaped code."""
    parts = re.split(r"`([^`]*)`", text)
    return "".join(
        md_code(p) if k % 2 else escape(p, quote=False).replace("|", "&#124;").replace("\n", " ")
        for k, p in enumerate(parts)
    )


def _md_cell(c: CellDiff) -> str:
    ref = c.ref
    n = f" [{ref.execution_count}]" if ref.execution_count is not None else ""
    at = f"cell {ref.index + 1}" if ref.index is not None else "cell"
    line = ref.first_line if len(ref.first_line) <= 50 else ref.first_line[:49] + "…"
    return f"{at}{n} {md_code(line)}"


def diff_markdown(diff: RunDiff, title: str = "GPU memory") -> str:
    word = {0: "✅ no regression", 1: "❌ regression", 2: "⚠️ incomplete"}[diff.exit_code]
    out = [f"### {md_text(title)} · {word}", ""]
    out.append(f"{md_text(diff.after)} against {md_text(diff.before)}: {md_text(headline(diff))}")
    out.append("")
    out += [f"> ⚠️ {md_text(w)}" for w in diff.warnings]
    own = [(c, d, f) for c, d, f in diff.regressions if not f.inherited]
    if own:
        out += [
            "| cell | device | figure | before | after | change | allowed | judged |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
        ]
        out += [
            f"| {_md_cell(c)} ({MATCH_WORDS[c.match]}) | {md_text(where(d))} | "
            f"{LABELS[f.figure]} | {format_bytes(f.before)} | {format_bytes(f.after)} | "
            f"**{change_text(f)}** | {format_delta(f.allowed)} | {md_text(judged_text(f))} |"
            for c, d, f in own
        ]
        out += ["", "**Why**", ""]
        for c in diff.cells:
            if not c.regressions or c.carried_only:
                continue
            out.append(f"- {_md_cell(c)}:")
            if c.code:
                out.append("  - the code changed: " + " ".join(md_code(x) for x in c.code))
            out += [f"  - {md_text(n)}" for n in c.notes]
            for d in c.devices:
                if d.regressions:
                    at = md_text(where(d))
                    out += [f"  - {at}: {md_text(why_text(w, diff.before))}" for w in d.why]
                    out += [f"  - {at}: {md_text(n)}" for n in d.notes]
        out.append("")
    carried = [c for c in diff.cells if c.carried_only]
    if carried:
        out.append("Higher only because earlier cells keep more (their own part is allowed): ")
        out.append(", ".join(md_text(carried_text(c)) for c in carried))
        out.append("")
    out += _md_all_cells(diff)
    out += ["", f"<sub>{md_text(judged_sentence(diff))}</sub>"]
    return "\n".join(out) + "\n"


def _md_all_cells(diff: RunDiff) -> list[str]:
    rows = [
        "<details><summary>Every cell (" + md_text(match_summary(diff)) + ")</summary>",
        "",
        "| cell | match | device | peak | kept | reserved |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for c in diff.cells:
        match = MATCH_WORDS[c.match] + (f" from {diff.before}" if c.match == "removed" else "")
        if not c.devices:
            what = "; ".join(c.notes) or "no GPU figures"
            rows.append(f"| {_md_cell(c)} | {match} | - | {md_text(what)} | | |")
            continue
        for d in c.devices:
            vals = []
            for name in ("peak", "kept", "reserved"):
                f = d.figure(name)
                v = None if f is None else f.after if f.after is not None else f.before
                if f is None or v is None:
                    vals.append("-")
                    continue
                text = format_bytes(v)
                if f.change:
                    text += f" ({change_text(f, nested=True)})"
                vals.append(f"**{text}**" if f.outcome == "regression" else text)
            rows.append(
                f"| {_md_cell(c)} | {match} | {md_text(where(d))} | " + " | ".join(vals) + " |"
            )
    rows += ["", "</details>"]
    return rows
