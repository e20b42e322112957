"""Views of a run: the progress line, the text table, the JSON document (schema:
``schema.json`` beside this file, explained in ``docs/run.md``), the self-contained HTML
report and the metadata written into the executed notebook. Pure functions of the
records in ``execute`` and ``verdict``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from functools import cache
from html import escape
from importlib import resources
from typing import Any

from .._version import __version__
from ..reporters.page import PAGE_CSS as _CSS
from ..units import cuda_label, format_bytes, format_delta
from .budgets import Budget
from .execute import CellRun, RunResult
from .verdict import Verdict, peak_cell

JSON_VERSION = 1


@cache
def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the ``--json`` document."""
    return dict(json.loads(resources.files(__package__).joinpath("schema.json").read_text()))


def seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def _devices(c: CellRun) -> list[dict[str, Any]]:
    return [d for d in c.devices if d.get("peak_allocated") is not None]


def where(d: dict[str, Any]) -> str:
    """``cuda:1``, or ``rank 1 (pid 4242) cuda:1`` for a worker process's device."""
    worker = d.get("worker")
    return f"{worker} {cuda_label(d['index'])}" if worker else f"{cuda_label(d['index'])}"


def figures(c: CellRun) -> str:
    """``kept +1.00 GiB, peak 5.20 GiB`` (one device), each device named when several."""
    devs = _devices(c)
    parts = [
        f"kept {format_delta(d.get('allocated_delta'))}, peak {format_bytes(d['peak_allocated'])}"
        for d in devs
    ]
    if len(devs) > 1:
        parts = [f"{where(d)} {p}" for d, p in zip(devs, parts, strict=True)]
    return "; ".join(parts)


def progress_line(c: CellRun, k: int, total: int) -> str:
    """``[3/12] cell 5 [3] `x = f()`: kept +1.00 GiB, peak 5.20 GiB, 1.30 s``."""
    if c.status == "skipped":
        what = "skipped (tagged skip-execution)"
    elif c.status == "error":
        ename, evalue = c.error or ("", "")
        what = f"FAILED {ename}: {_one_line(evalue, 120)}"
        if c.has_figures:
            what += f"; {figures(c)}"
    elif not c.measured:
        what = "not measured"
    elif not c.has_figures:
        what = "no GPU figures"
    else:
        what = figures(c)
    line = f"[{k}/{total}] {c.label}: {what}, {seconds(c.wall_time)}"
    broken = [r.budget.text for r in c.failed_budgets]
    if broken:
        line += f"  BUDGET FAILED: {', '.join(dict.fromkeys(broken))}"
    return line


def _budget_cell(c: CellRun) -> str:
    if not c.results:
        return "-"
    broken = [r.budget.text for r in c.failed_budgets]
    if broken:
        return "FAIL " + ", ".join(dict.fromkeys(broken))
    if all(r.ok is None for r in c.results):
        return "not checked"
    return "ok"


def _one_line(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def table_rows(cells: Sequence[CellRun]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for c in cells:
        n = f"[{c.execution_count}]" if c.execution_count is not None else ""
        code = _one_line(c.first_line, 48)
        status = {"error": "raised", "not_run": "not run", "skipped": "skipped"}.get(c.status, "")
        if c.status == "error" and c.error:
            status = f"raised {c.error[0]}"
        devs = _devices(c)
        if not devs:
            what = status or ("not measured" if not c.measured else "no GPU figures")
            took = seconds(c.wall_time) if c.status in ("ok", "error") else "-"
            rows.append((str(c.index + 1), n, "-", "-", "-", took, _budget_cell(c), what, code))
            continue
        for i, d in enumerate(devs):
            first = i == 0
            rows.append(
                (
                    str(c.index + 1) if first else "",
                    n if first else "",
                    where(d),
                    format_delta(d.get("allocated_delta")),
                    format_bytes(d["peak_allocated"]),
                    seconds(c.wall_time) if first else "",
                    _budget_cell(c) if first else "",
                    status if first else "",
                    code if first else "",
                )
            )
    return rows


TABLE_HEAD = ("cell", "[n]", "device", "kept", "peak", "time", "budgets", "status", "code")
_RIGHT = {0, 3, 4, 5}


def table_text(cells: Sequence[CellRun]) -> str:
    rows = [TABLE_HEAD, *table_rows(cells)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEAD))]

    def fmt(r: tuple[str, ...]) -> str:
        return "  ".join(
            v.rjust(w) if i in _RIGHT else v.ljust(w)
            for i, (v, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()

    lines = [fmt(rows[0]), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in rows[1:]]
    return "\n".join(lines)


# -- JSON --------------------------------------------------------------------------------
def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="seconds")


def _gpu(sample: dict[str, Any] | None) -> dict[str, Any] | None:
    if sample is None:
        return None
    return {
        "state": sample.get("state"),
        "message": sample.get("message") or "",
        "torch_version": sample.get("torch_version"),
        "devices": [
            {
                "index": d["index"],
                "name": d.get("name", ""),
                "backend": d.get("backend"),
                "total": d.get("total"),
                "limit": d.get("limit"),
            }
            for d in sample.get("devices", [])
        ],
    }


def _replay(replay: dict[str, Any] | None) -> dict[str, Any] | None:
    if not replay:
        return None
    return {
        "gpu": replay.get("gpu", ""),
        "torch_version": replay.get("torch_version"),
        "recorded": replay.get("recorded"),
        "description": replay.get("description", ""),
    }


# A CellRun in the JSON document: each field under the name schema.json gives it, in the
# schema's order, so a new field is the record's and the schema's only (a field the schema
# lacks must be named in _CELL_OMIT: tests/test_run_report.py checks both ways).
_CELL_NAMES = {"oom": "out_of_memory", "oom_fix": "postmortem_fix", "results": "budgets"}
_CELL_OMIT = frozenset({"budgets"})  # what a cell must satisfy: its results travel instead
_CELL_VALUES: dict[str, Any] = {
    "error": lambda e: None if e is None else {"ename": e[0], "evalue": e[1]},
    "devices": lambda ds: [device_record(d) for d in ds],
    "results": lambda rs: [r.to_dict() for r in rs],
}
# A device row of the kernel's history (the protocol's HistoryCell keys) in the document
_DEVICE_NAMES = {"allocated_delta": "kept", "peak_allocated": "peak"}
_DEVICE_OPTIONAL = frozenset({"worker", "oom"})  # sent only when set
# Recorded only when asked (--save, --baseline, --repeat): sent when the row has the key
_DEVICE_ASKED = frozenset({"kept_lines", "breakdown", "spread"})
LINES_KEPT = 20  # kept lines and breakdown modules written per device, largest first


@cache
def cell_plan() -> tuple[tuple[str, str], ...]:
    """(JSON key, CellRun field), in the schema's order."""
    from dataclasses import fields

    by_key = {_CELL_NAMES.get(f.name, f.name): f.name for f in fields(CellRun)}
    by_key = {k: f for k, f in by_key.items() if f not in _CELL_OMIT}
    return tuple((k, by_key[k]) for k in schema()["$defs"]["cell"]["properties"])


@cache
def device_plan() -> tuple[tuple[str, str], ...]:
    """(JSON key, history device key), in the schema's order."""
    source = {json: key for key, json in _DEVICE_NAMES.items()}
    return tuple((k, source.get(k, k)) for k in schema()["$defs"]["cell_device"]["properties"])


def device_record(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, source in device_plan():
        value = d.get(source)
        if key in _DEVICE_OPTIONAL:
            if value:
                out[key] = value
        elif key in _DEVICE_ASKED:
            if key == "kept_lines" and source in d:
                out[key] = None if value is None else value[:LINES_KEPT]
            elif key == "breakdown" and value is not None:
                out[key] = _breakdown(value)
            elif value is not None:
                out[key] = value
        elif key == "touched":
            out[key] = bool(d.get("touched", True))
        else:
            out[key] = value
    return out


def _breakdown(b: dict[str, Any]) -> dict[str, Any]:
    """The protocol's Breakdown as the document keeps it: the largest modules, no
    device (the row's) and no event counts."""
    keys = schema()["$defs"]["breakdown"]["properties"]
    out = {k: b.get(k) for k in keys}
    out["modules"] = list(b.get("modules") or [])[:LINES_KEPT]
    return out


def cell_record(c: CellRun) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, name in cell_plan():
        value = getattr(c, name)
        convert = _CELL_VALUES.get(name)
        out[key] = convert(value) if convert is not None else value
    return out


def json_document(
    result: RunResult,
    verdict: Verdict,
    notebook: str,
    budgets: Sequence[Budget],
    fits: int | None,
    details: bool = False,
    track: bool = False,
    repeat: int = 1,
    breakdown_all: bool = False,
) -> dict[str, Any]:
    top = peak_cell(result.cells)
    results = [r for c in result.cells for r in c.results]
    return {
        "version": JSON_VERSION,
        "tool": {"name": "jupyter-gpumem", "version": __version__},
        "notebook": notebook,
        "kernel": {"name": result.kernel, "jupyter_gpumem": result.kernel_version},
        "started": _iso(result.started),
        "duration": round(result.duration, 3),
        "options": {
            "budgets": [b.text for b in budgets],
            "fits": fits,
            "details": details,
            "track": track,
            "repeat": repeat,
            "breakdown_all": breakdown_all,
        },
        "limit": result.limit,
        "gpu": _gpu(result.sample),
        "replay": _replay(result.replay),
        "cells": [cell_record(c) for c in result.cells],
        "summary": {
            "exit_code": verdict.exit_code,
            "result": verdict.result,
            "message": verdict.headline,
            "problems": list(verdict.problems),
            "warnings": list(verdict.warnings),
            "gpu_figures": result.has_figures,
            "cells": {
                "code": len(result.cells),
                "run": sum(c.status in ("ok", "error") for c in result.cells),
                "measured": sum(c.measured for c in result.cells),
                "raised": sum(c.status == "error" for c in result.cells),
            },
            "budgets": {
                "held": sum(r.ok is True for r in results),
                "failed": sum(r.ok is False for r in results),
                "not_checked": sum(r.ok is None for r in results),
            },
            "peak": None
            if top is None
            else {
                "bytes": top[1]["peak_allocated"],
                "device": top[1]["index"],
                "cell_index": top[0].index,
                "execution_count": top[0].execution_count,
            },
        },
    }


# -- the executed notebook ----------------------------------------------------------------
def annotate_notebook(result: RunResult, document: dict[str, Any], setup: str) -> Any:
    """Write each cell's figures and budget results into its metadata
    (``metadata.jupyter_gpumem``) and the summary into the notebook's metadata. The setup
    step is not a cell: it is described there."""
    nb = result.notebook
    for c, rec in zip(result.cells, document["cells"], strict=True):
        nb.cells[c.index].metadata["jupyter_gpumem"] = {
            k: rec[k] for k in ("status", "measured", "devices", "budgets", "postmortem_fix")
        }
    nb.metadata["jupyter_gpumem"] = {
        "run": {
            "tool_version": __version__,
            "setup": setup,
            "started": document["started"],
            "limit": document["limit"],
            "replay": document["replay"],
            "summary": document["summary"],
        }
    }
    return nb


# -- HTML ---------------------------------------------------------------------------------


def _e(v: Any) -> str:
    return escape(str(v), quote=True)


def _chart(result: RunResult) -> str:
    from ..model import DeviceRow, HistoryRow
    from ..reporters.history_plot import COLORS, history_svg

    rows = [
        HistoryRow(
            c.execution_count,
            0.0,
            c.first_line[:60],
            c.wall_time or 0.0,
            c.status == "error",
            None,
            tuple(
                DeviceRow(
                    d["index"],
                    d.get("allocated"),
                    d.get("allocated_delta"),
                    d.get("reserved"),
                    d.get("reserved_delta"),
                    d.get("peak_allocated"),
                    d.get("peak_above_start"),
                    None,
                    None,
                    d.get("kept_at"),
                    d.get("worker"),
                )
                for d in c.devices
            ),
        )
        for c in result.cells
        if c.has_figures
    ]
    indices = sorted(
        {d.device for r in rows for d in r.devices if d.allocated is not None and not d.worker}
    )
    if not indices:
        return ""
    legend = "".join(
        f'<span><span style="display:inline-block;width:14px;height:3px;background:'
        f'{COLORS[k]};margin-right:4px;vertical-align:middle"></span>{k}</span>'
        for k in ("allocated", "reserved", "peak")
    )
    # Inline SVG in HTML needs no namespace: leave the URL out, the file fetches nothing.
    svgs = "".join(
        history_svg(rows, i).replace(' xmlns="http://www.w3.org/2000/svg"', "") for i in indices
    )
    return (
        "<h2>Allocated and reserved after each measured cell, and its peak</h2>"
        f'<div class="legend">{legend}</div>{svgs}'
    )


def html_report(
    result: RunResult,
    verdict: Verdict,
    document: dict[str, Any],
    comparison: str | None = None,
) -> str:
    """The run's page; ``comparison`` (``--baseline``: the two runs side by side) takes
    the place of this run's chart."""
    title = f"GPU memory: {document['notebook']}"
    cls = verdict.result
    word = {"pass": "PASS", "fail": "FAIL", "error": "ERROR"}[cls]
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
    ]
    replay = document.get("replay")
    if replay:
        parts.append(f'<p class="replay">{_e(replay["description"])}</p>')
    parts.append(
        f'<p class="verdict {cls}">{word} (exit code {verdict.exit_code}): '
        f"{_e(verdict.headline)}</p>"
    )
    if verdict.problems:
        parts.append(
            '<ul class="fail">' + "".join(f"<li>{_e(p)}</li>" for p in verdict.problems) + "</ul>"
        )
    if verdict.warnings:
        parts.append(
            '<ul class="warn">' + "".join(f"<li>{_e(w)}</li>" for w in verdict.warnings) + "</ul>"
        )
    parts.append(f'<p class="meta">{_meta(document)}</p>')
    parts.append(_chart(result) if comparison is None else comparison)
    parts.append("<h2>Cells</h2><table><thead><tr>")
    parts += [
        f'<th style="text-align:right">{_e(h)}</th>' if i in _RIGHT else f"<th>{_e(h)}</th>"
        for i, h in enumerate(TABLE_HEAD)
    ]
    parts.append("</tr></thead><tbody>")
    rows = [(c, row) for c in result.cells for row in table_rows([c])]
    for c, row in rows:
        tds = []
        for i, v in enumerate(row):
            if i == 6 and v.startswith("FAIL"):
                tds.append(f'<td class="fail">{_e(v)}</td>')
            elif i == 8:
                title = f' title="{_e(c.first_line)}"' if v else ""
                tds.append(f"<td{title}><code>{_e(v)}</code></td>")
            else:
                tds.append(f'<td class="num">{_e(v)}</td>' if i in _RIGHT else f"<td>{_e(v)}</td>")
        parts.append("<tr>" + "".join(tds) + "</tr>")
    parts.append("</tbody></table>")
    ooms = [(c, d) for c in result.cells for d in c.devices if d.get("oom")]
    if ooms:
        parts.append("<h2>Out of memory in worker processes</h2><ul>")
        parts += [
            f"<li>cell {c.index + 1} {_e(c.label)}, {_e(where(d))}: {_e(d['oom'])}</li>"
            for c, d in ooms
        ]
        parts.append("</ul>")
    parts.append(
        '<p class="meta">kept: allocated after the cell minus before; peak: the exact peak '
        "of allocated memory inside the cell (PyTorch's counter, reset before each cell); "
        "time: the cell's wall time. Generated by jupyter-gpumem "
        f"{_e(__version__)}.</p></body></html>"
    )
    return "\n".join(parts)


def _meta(doc: dict[str, Any]) -> str:
    bits = [
        f"kernel {_e(doc['kernel']['name'])}",
        f"started {_e(doc['started'])}",
        f"took {_e(seconds(doc['duration']))}",
    ]
    gpu = doc.get("gpu")
    if gpu:
        if gpu.get("torch_version"):
            bits.append(f"torch {_e(gpu['torch_version'])}")
        for d in gpu.get("devices", []):
            total = f" ({_e(format_bytes(d['total']))})" if d.get("total") else ""
            bits.append(f"{cuda_label(_e(d['index']))} {_e(d['name'])}{total}")
    if doc.get("limit"):
        bits.append(f"capped at {_e(format_bytes(doc['limit']['bytes']))} (--fits)")
    if doc["options"]["budgets"]:
        bits.append("budgets for every cell: " + _e(", ".join(doc["options"]["budgets"])))
    return " · ".join(bits)
