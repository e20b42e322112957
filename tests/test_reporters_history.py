from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from jupyter_gpumem.collectors import Collector
from jupyter_gpumem.core.history import History
from jupyter_gpumem.core.tracker import CellTracker
from jupyter_gpumem.reporters import cell_report_html, cell_report_text, measurement_text
from tests.fakes import ScriptedBackend, scenario


def spike_report(**kw):
    before, after, _ = scenario("transient_spike")
    t = CellTracker(Collector(ScriptedBackend(before, after)))
    t.begin()
    return t.end(**kw)


def test_text_report_numbers():
    text = cell_report_text(spike_report(execution_count=7, first_line="y = f(x)"))
    lines = text.splitlines()
    assert lines[0].startswith("gpumem: cell [7] ok in ")
    assert "cuda:0 NVIDIA H200" in text
    assert "allocated              256.00 MiB -> 320.00 MiB (+64.00 MiB)" in text
    assert "reserved               256.00 MiB -> 832.00 MiB (+576.00 MiB)" in text
    assert "peak allocated         832.00 MiB (+576.00 MiB above start)   [exact]" in text
    assert "cudaMalloc / cudaFree  2 / 0" in text


def test_html_is_escaped():
    r = spike_report(first_line="<script>alert(1)</script>", error=ValueError("<b>bad</b>"))
    html = cell_report_html(r)
    assert "<script>" not in html and "<b>bad" not in html
    assert "&lt;b&gt;bad&lt;/b&gt;" in html
    assert "FAILED (ValueError: &lt;b&gt;bad&lt;/b&gt;)" in html


def test_measurement_text_table():
    _, after, _ = scenario("keep_n_bytes")
    m = Collector(ScriptedBackend(after)).measure()
    text = measurement_text(m)
    header, _rule, row = text.splitlines()[:3]
    assert header.split()[:3] == ["device", "allocated", "reserved"]
    assert row.startswith("cuda:0 NVIDIA H200  256.00 MiB  256.00 MiB")


def test_history_bounded_and_records():
    h = History(maxlen=3)
    r = spike_report(execution_count=1, first_line="x" * 500)
    for i in range(5):
        h.add(replace(r, execution_count=i))
    assert len(h) == 3
    assert [row.execution_count for row in h] == [2, 3, 4]
    rec = h.records()[0]
    assert rec["device"] == 0 and rec["allocated_delta"] == 64 << 20
    assert len(rec["first_line"]) == 60


def test_history_row_is_small():
    """History holds compact rows, not the full reports (target: <= 1 KiB per cell)."""
    h = History()
    h.add(spike_report(execution_count=1, first_line="loss = model(x).sum()"))
    row = h.last(1)[0]
    size = sys.getsizeof(row) + sum(sys.getsizeof(v) for v in row)
    size += sum(sys.getsizeof(d) + sum(sys.getsizeof(v) for v in d) for d in row.devices)
    assert size <= 1024


def test_csv_never_overwrites(tmp_path):
    h = History()
    h.add(spike_report(execution_count=3))
    path = tmp_path / "h.csv"
    assert h.write_csv(str(path)) == 1
    content = path.read_text().splitlines()
    assert content[0].startswith("execution_count,time,first_line,wall_time,failed")
    assert content[1].startswith("3,")
    with pytest.raises(FileExistsError):
        h.write_csv(str(path))
    assert path.read_text().splitlines() == content


def test_dataframe():
    pd = pytest.importorskip("pandas")
    h = History()
    h.add(spike_report(execution_count=3))
    df = h.dataframe()
    assert list(df["allocated_delta"]) == [64 << 20]
    assert df["time"].dtype.kind == "M"
    assert isinstance(df, pd.DataFrame)


@pytest.mark.parametrize(
    "line", ['=HYPERLINK("http://x","y")', "+1+1", "-2+3", "@SUM(A1)", "\tx", "\rx"]
)
def test_csv_neutralises_formulas(tmp_path, line):
    import csv

    h = History()
    h.add(spike_report(execution_count=3, first_line=line))
    path = tmp_path / "h.csv"
    h.write_csv(str(path))
    with open(path, newline="") as f:
        row = next(iter(csv.DictReader(f)))
    assert row["first_line"] == "'" + line  # a spreadsheet shows it as text
    assert row["allocated_delta"] == str(64 << 20)  # numbers stay numbers
    assert row["peak_above_start"].lstrip("-").isdigit()


def test_history_counts_the_cells_out_of_memory_errors_per_device():
    """Recorded on an H200: a 2 GiB request under a 1 GiB cap, one OOM in the cell; the
    history's device row says so (the panel and `%gpumem history` show it)."""
    from jupyter_gpumem.protocol.convert import to_protocol

    before, after, _ = scenario("oom_at_cap")
    t = CellTracker(Collector(ScriptedBackend(before, after)))
    t.begin()
    h = History()
    row = h.add(t.end(execution_count=7, error=MemoryError("CUDA out of memory")))
    (d,) = row.devices
    assert (d.device, d.ooms, d.worker) == (0, 1, None)
    assert h.records()[0]["ooms"] == 1
    assert to_protocol(row)["devices"][0]["ooms"] == 1
