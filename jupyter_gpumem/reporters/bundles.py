"""Mime bundles (``text/plain`` + ``text/html``): what Jupyter shows for each record.

The one place where a record's text and HTML views are paired. Importing this module
registers them with the model (``model/render.py``), so that a record shows itself:
``%%gpumem -o r`` then ``r`` shows the report, ``jupyter_gpumem.scan(...)`` shows the
scan. The front ends display records (or, for lists and tables, these bundles); they
never build bundles themselves. The cell report's views are imported with this module
(every measured cell shows one: an import statement per call cost microseconds); the
others when first used.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from ..model import (
    Breakdown,
    CellReport,
    DryRun,
    DryScan,
    HistoryRow,
    Measurement,
    Replay,
    RunDiff,
    ScanResult,
    SegmentMap,
    WhoReport,
    WorkerReport,
)
from ..model.render import Bundle, register
from ._rows import cell_sections, compact_line
from .html import cell_report_html
from .replay import replay_sentence
from .text import cell_report_text


def cell_report(report: CellReport, compact: bool = False) -> Bundle:
    """The cell's report: its sections, then its breakdown and its trace when it has them;
    ``compact``: the one line of ``-c``/auto mode."""
    if compact:
        text = compact_line(report)
        if report.after.replay is not None:
            text += " [replay]"
        html = (
            '<div class="jp-GpuMem-compact" style="font-family:var(--jp-code-font-family,'
            'monospace);font-size:var(--jp-code-font-size,12px);opacity:0.75">'
            f"{escape(text)}</div>"
        )
        return {"text/plain": text, "text/html": html}
    sections = cell_sections(report)  # laid out twice, built once
    text, html = cell_report_text(report, sections), cell_report_html(report, sections)
    if report.breakdowns:
        b = breakdown(report.breakdowns)
        text += "\n" + b["text/plain"]
        html += b["text/html"]
    elif report.breakdown_note:
        text += f"\n  breakdown: {report.breakdown_note}"
        html += f"<div>breakdown: {escape(report.breakdown_note)}</div>"
    if report.trace is not None:
        from .timeline import trace_html, trace_text

        text += "\n" + trace_text(report.trace)
        html += trace_html(report.trace)
    return {"text/plain": text, "text/html": html}


def measurement(m: Measurement) -> Bundle:
    from .html import measurement_html
    from .text import measurement_text

    return {"text/plain": measurement_text(m), "text/html": measurement_html(m)}


def who(reports: Sequence[WhoReport]) -> Bundle:
    from .who import who_html, who_text

    return {"text/plain": who_text(reports), "text/html": who_html(reports)}


def segments(maps: Sequence[SegmentMap]) -> Bundle:
    from .segments import segments_html, segments_text

    return {"text/plain": segments_text(list(maps)), "text/html": segments_html(list(maps))}


def breakdown(items: Sequence[Breakdown]) -> Bundle:
    from .breakdown import breakdown_html, breakdown_text

    return {"text/plain": breakdown_text(items), "text/html": breakdown_html(items)}


def dry_run(result: DryRun) -> Bundle:
    from .dry_run import dry_run_html, dry_run_text

    return {"text/plain": dry_run_text(result), "text/html": dry_run_html(result)}


def dry_scan(result: DryScan) -> Bundle:
    from .dry_run import dry_scan_html, dry_scan_text

    return {"text/plain": dry_scan_text(result), "text/html": dry_scan_html(result)}


def scan(result: ScanResult) -> Bundle:
    from .scan import scan_html, scan_text

    return {"text/plain": scan_text(result), "text/html": scan_html(result)}


def workers(reports: Sequence[WorkerReport]) -> Bundle:
    """Each worker process's own allocator (``%gpumem workers``)."""
    from ._rows import workers_section
    from .html import section_html
    from .text import section_lines

    s = workers_section(tuple(reports))
    return {"text/plain": "\n".join(section_lines(s, "")), "text/html": section_html(s)}


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> Bundle:
    from .html import table_html
    from .text import table_text

    return {"text/plain": table_text(header, rows), "text/html": table_html(header, rows)}


def history(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    plot: Sequence[HistoryRow] | None,
    device: int = 0,
    replay: Replay | None = None,
) -> Bundle:
    """The history table; its HTML a plot of ``plot``'s rows on ``device`` when given;
    under the replay's line when the figures are replayed."""
    bundle = table(header, rows)
    if plot is not None:
        from .history_plot import history_html

        bundle["text/html"] = history_html(plot, device)
    return marked(bundle, replay)


def run_diff(diff: RunDiff) -> Bundle:
    """Two runs compared: the regressions and why, the runs side by side."""
    from .run_diff import diff_text
    from .run_diff_html import diff_html

    return {"text/plain": diff_text(diff, exit_code=False), "text/html": diff_html(diff)}


def marked(bundle: Bundle, replay: Replay | None) -> Bundle:
    """``bundle`` under the replay's line when its figures are replayed, else unchanged."""
    if replay is not None:
        from .html import replay_html

        bundle["text/plain"] = replay_sentence(replay) + "\n" + bundle["text/plain"]
        bundle["text/html"] = replay_html(replay) + bundle["text/html"]
    return bundle


register(CellReport, cell_report)
register(Measurement, measurement)
register(WhoReport, lambda r: who([r]))
register(SegmentMap, lambda m: segments([m]))
register(Breakdown, lambda b: breakdown([b]))
register(ScanResult, scan)
register(DryRun, dry_run)
register(DryScan, dry_scan)
register(RunDiff, run_diff)
