"""Every view with hostile text in it: cell code that looks like HTML, a formula, a quote.

HTML views must show it as text (escaped, no element or attribute of its own), CSV must
not let a spreadsheet run it, and text views must keep it as it is.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from jupyter_gpumem.collectors import Collector
from jupyter_gpumem.collectors.snapshot import snapshot_from_dict
from jupyter_gpumem.core.history import History
from jupyter_gpumem.core.tracker import CellTracker
from jupyter_gpumem.testing.replay import RecordedCells
from tests.conftest import run
from tests.fakes import ScriptedBackend, scenario

HOSTILE = "x = '<img src=x onerror=alert(1)>' + \"</svg><script>alert(2)</script>\" # =1+1"
RECORDED = Path(__file__).parent.parent / "jupyter_gpumem/testing/recorded/attribution.json"
FIXTURE = json.loads(RECORDED.read_text())


OUR_IMAGE = re.compile(
    r'<img class="jp-GpuMem-pictureImage" style="[^"<>]*" alt="[^"<>]*" '
    r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]*)"/>'
)


def assert_inert(html: str) -> None:
    """No element, attribute or entity the hostile text could have made (a picture's image
    fallback is ours: the SVG inside it is held to the same rule)."""
    import base64

    for encoded in OUR_IMAGE.findall(html):
        svg = base64.b64decode(encoded).decode()
        assert "<script" not in svg and "<img" not in svg and "</svg><script>" not in svg
    html = OUR_IMAGE.sub("", html)
    assert (
        "<img" not in html
        and "<script" not in html
        and "onerror=" not in html.replace("onerror=alert(1)&gt;", "")
    )
    assert "</svg><script>" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html  # shown, as text


def spike_report(first_line=HOSTILE, **kw):
    before, after, _ = scenario("transient_spike")
    t = CellTracker(Collector(ScriptedBackend(before, after)))
    t.begin()
    return t.end(first_line=first_line, **kw)


def hostile_record(name):
    """A recorded snapshot whose source lines are the hostile text."""
    rec = json.loads(json.dumps(FIXTURE[name]))
    for lines in rec["lines"].values():
        for k in lines:
            lines[k] = HOSTILE
    return rec


def test_cell_report_and_compact_line():
    from jupyter_gpumem.reporters import cell_report_html, cell_report_text, compact_line

    r = spike_report(error=ValueError(HOSTILE))
    assert_inert(cell_report_html(r))
    assert HOSTILE in cell_report_text(r)
    assert HOSTILE in compact_line(r)


def test_auto_mode_line_through_the_shell(ip):
    from jupyter_gpumem._ipython import current

    before, after, _ = scenario("transient_spike")
    current().collector.backend = ScriptedBackend(before, after)
    run(ip, "%gpumem auto on")
    _, _, cap = run(ip, HOSTILE)
    run(ip, "%gpumem auto off")
    html = next(o.data["text/html"] for o in cap.outputs if "text/html" in o.data)
    assert "<img" not in html and "<script" not in html  # the line shows no code at all


def test_history_table_plot_and_csv(tmp_path):
    from jupyter_gpumem.reporters import table_html
    from jupyter_gpumem.reporters.history_plot import history_html

    h = History()
    for i in range(3):
        h.add(replace(spike_report(), execution_count=i + 1))
    assert_inert(table_html(("first line",), [(row.first_line,) for row in h]))
    plot = history_html(h.last(), 0)
    assert_inert(plot)
    assert len(OUR_IMAGE.findall(plot)) == 1  # the picture's image fallback
    path = tmp_path / "h.csv"
    h.write_csv(str(path))  # starts with "x = ", not a formula: kept as it is
    import csv

    with open(path, newline="") as f:
        assert next(iter(csv.DictReader(f)))["first_line"] == HOSTILE[:60]
    h2 = History()
    h2.add(spike_report(first_line="=cmd|' /C calc'!A0"))
    h2.write_csv(str(tmp_path / "f.csv"))
    assert "'=cmd|' /C calc'!A0" in (tmp_path / "f.csv").read_text()


def test_who_segments_timeline_and_post_mortem():
    from jupyter_gpumem.analysis.postmortem import explain_oom
    from jupyter_gpumem.analysis.segments import segment_map
    from jupyter_gpumem.analysis.sites import SiteResolver
    from jupyter_gpumem.analysis.timeline import build_timeline
    from jupyter_gpumem.analysis.who import holdings
    from jupyter_gpumem.model import OomEvent, Reference
    from jupyter_gpumem.reporters.html import cell_report_html
    from jupyter_gpumem.reporters.segments import segments_html
    from jupyter_gpumem.reporters.timeline import timeline_html
    from jupyter_gpumem.reporters.who import who_html
    from jupyter_gpumem.testing.replay import recorded_device_after

    rec = hostile_record("oom_fragmentation")
    snap = snapshot_from_dict(rec, tracking=True)
    resolver = SiteResolver(RecordedCells(rec), rec["library_dirs"])
    refs = [Reference(*r) for r in rec["refs"]]
    h = holdings(snap, 0, refs, resolver)
    for by in ("variable", "line", "cell"):
        assert_inert(who_html([h.report(by)]))
    assert_inert(segments_html([segment_map(snap, 0, resolver)]))
    pm = explain_oom(OomEvent(*rec["oom"]), recorded_device_after(rec), rec["segments"], h)
    r = replace(spike_report(first_line="ok"), postmortems=(pm,))
    assert_inert(cell_report_html(r))
    trace = hostile_record("trace")
    cells = RecordedCells(trace)
    t = build_timeline(
        trace["device_traces"][0],
        0,
        0,
        SiteResolver(cells, trace["library_dirs"]),
        cells.files_of(trace["truth"]["execution_count"]),
        2000,
    )
    assert_inert(timeline_html(t))


@pytest.mark.parametrize("name", ["<b>x</b>", 'a"b'])
def test_owner_names_are_escaped_too(name):
    from jupyter_gpumem.analysis.sites import SiteResolver
    from jupyter_gpumem.analysis.who import holdings
    from jupyter_gpumem.model import Reference
    from jupyter_gpumem.reporters.who import who_html

    rec = FIXTURE["cells"]
    snap = snapshot_from_dict(rec, tracking=True)
    refs = [Reference(*r[:3], name, *r[4:]) for r in rec["refs"]]
    html = who_html([holdings(snap, 0, refs, SiteResolver(library_dirs=())).report()])
    assert name not in html and re.search(r"&lt;b&gt;x&lt;/b&gt;|a&quot;b", html)
