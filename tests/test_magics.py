"""%%gpumem and %gpumem through a real IPython InteractiveShell."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from jupyter_gpumem._ipython import current
from tests.conftest import run
from tests.fakes import ScriptedBackend, scenario


@pytest.fixture
def spike(ip):
    before, after, _ = scenario("transient_spike")
    backend = ScriptedBackend(before, after)
    current().collector.backend = backend
    return backend


# -- loading ---------------------------------------------------------------------------
def test_both_names_share_one_session_and_unload_removes_everything(shell):
    n_cleanup = len(shell.input_transformers_cleanup)
    n_pre = len(shell.events.callbacks["pre_run_cell"])
    shell.run_line_magic("load_ext", "gpumem")
    s = current()
    shell.run_line_magic("load_ext", "jupyter_gpumem")
    assert current() is s
    assert "gpumem" in shell.magics_manager.magics["line"]
    assert "gpumem" in shell.magics_manager.magics["cell"]
    assert len(shell.input_transformers_cleanup) == n_cleanup + 1
    shell.run_line_magic("unload_ext", "gpumem")
    assert current() is None
    assert "gpumem" not in shell.magics_manager.magics["line"]
    assert "gpumem" not in shell.magics_manager.magics["cell"]
    assert len(shell.input_transformers_cleanup) == n_cleanup
    assert len(shell.events.callbacks["pre_run_cell"]) == n_pre
    shell.run_line_magic("unload_ext", "jupyter_gpumem")  # a second unload is harmless


def test_loaded_from_config():
    script = textwrap.dedent(
        """
        from traitlets.config import Config
        from IPython.terminal.ipapp import TerminalIPythonApp
        c = Config()
        c.InteractiveShellApp.extensions = ["gpumem"]
        c.GpuMem.history_size = 7
        c.GpuMem.auto = True
        app = TerminalIPythonApp(config=c)
        app.initialize([])
        from jupyter_gpumem._ipython import current
        s = current()
        print(s.history.maxlen, s.auto)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "7 True"


# -- the cell runs as a normal cell ------------------------------------------------------
def test_cell_report_and_out(ip, spike):
    res, texts, _ = run(ip, "%%gpumem -o rep\nx = 40\nx + 2")
    assert res.success and res.result == 42
    assert ip.user_ns["_"] == 42  # Out/_ as without the magic
    assert len(texts) == 1 and "(+64.00 MiB)" in texts[0]
    rep = ip.user_ns["rep"]
    assert rep.first_line == "x = 40" and rep.device(0).allocated_delta == 64 << 20
    assert spike.reads == 2


def test_a_kept_report_shows_itself_as_the_magic_showed_it(ip, spike):
    _, texts, cap = run(ip, "%%gpumem -o rep\nx = 40")
    rep = ip.user_ns["rep"]
    data, _ = ip.display_formatter.format(rep)  # what a kernel sends for `rep`
    assert data["text/plain"] == texts[0]
    assert data["text/html"] == cap.outputs[0].data["text/html"]
    assert "+64.00 MiB" in data["text/html"] and "<script" not in data["text/html"]
    res, _, cap = run(ip, "rep")
    assert res.result is rep
    assert "CellReport(" not in cap.stdout and "+64.00 MiB" in cap.stdout


def test_traceback_line_numbers_are_those_the_user_sees(ip, spike):
    res, texts, _ = run(ip, "%%gpumem -o rep\na = 1\nb = 2\n1/0\n")
    assert isinstance(res.error_in_exec, ZeroDivisionError)
    tb = res.error_in_exec.__traceback__
    while tb.tb_next:
        tb = tb.tb_next
    assert tb.tb_lineno == 4  # line 4 of the cell as typed, %%gpumem being line 1
    assert ip.user_ns["rep"].failed
    assert "FAILED (ZeroDivisionError: division by zero)" in texts[0]


def test_keyboard_interrupt_propagates_and_report_marked(ip, spike):
    res, texts, _ = run(ip, "%%gpumem -o rep\nraise KeyboardInterrupt")
    assert isinstance(res.error_in_exec, KeyboardInterrupt)
    assert ip.user_ns["rep"].error == "KeyboardInterrupt"
    assert "FAILED (KeyboardInterrupt)" in texts[0]


def test_top_level_await(ip, spike):
    res, _, _ = run(ip, "%%gpumem -o rep\nimport asyncio\nawait asyncio.sleep(0)\nv = 5")
    assert res.success and ip.user_ns["v"] == 5 and not ip.user_ns["rep"].failed


def test_from_future_import_still_first(ip, spike):
    res, _, _ = run(ip, "%%gpumem\nfrom __future__ import annotations\nw = 1")
    assert res.success, res.error_in_exec


def test_quiet_records_but_shows_nothing(ip, spike):
    res, texts, _ = run(ip, "%%gpumem -q\nq = 1")
    assert res.success and texts == []
    assert len(current().history) == 1


def test_peak_reset_only_without_keep_peak(ip, spike):
    run(ip, "%%gpumem --keep-peak\nq = 1")
    assert spike.resets == []
    spike.reads = 0
    run(ip, "%%gpumem\nq = 1")
    assert spike.resets == [[0]]


def test_device_option(ip, spike):
    run(ip, "%%gpumem -d 0 -o rep\nq = 1")
    assert [d.index for d in ip.user_ns["rep"].devices] == [0]


# -- bad input: UsageError and the body does not run -------------------------------------
@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("%%gpumem --bogus", "unrecognized arguments: --bogus"),
        ("%%gpumem -d 5", "no device 5: this kernel sees 1 device(s) (0..0)"),
        ("%%gpumem -d x", "not a whole number"),
        ("%%gpumem -o 1bad", "-o needs a Python variable name"),
    ],
)
def test_bad_cell_flags(ip, spike, line, message):
    ip.user_ns.pop("ran", None)
    res, texts, _ = run(ip, f"{line}\nran = True")
    assert "ran" not in ip.user_ns
    assert type(res.error_in_exec).__name__ == "UsageError"
    assert message in str(res.error_in_exec)
    assert texts == []


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("%gpumem frobnicate", "invalid choice: 'frobnicate'"),
        ("%gpumem limit 12XB", "not a size: '12XB'"),
        ("%gpumem limit 1.5", "a plain number is a fraction of the device, in (0, 1]"),
        ("%gpumem limit", "the following arguments are required: 24GiB|0.3|off"),
        ("%gpumem auto maybe", "invalid choice: 'maybe'"),
        ("%gpumem history -n -1", "must not be negative"),
        ("%gpumem -d 3", "no device 3"),
        ("%gpumem panel --interval 10", "at least 100 ms"),
    ],
)
def test_bad_line_commands(ip, spike, line, message):
    res, _, _ = run(ip, line)
    assert type(res.error_in_exec).__name__ == "UsageError"
    assert message in str(res.error_in_exec)


def test_help_is_real(ip):
    doc = ip.find_line_magic("gpumem").__doc__
    for text in (
        "%%gpumem [-d N] [-q] [-o VAR] [--keep-peak]",
        "max_memory_allocated",
        "%gpumem limit [-d N] 24GiB|0.3|off",
        "%gpumem caching on|off",
    ):
        assert text in doc
    assert ip.find_cell_magic("gpumem").__doc__ == doc
    # the planning options, in the usage line and each with its own entry
    usage = doc[doc.index("%%gpumem [") :].split("\n\n", 1)[0]
    for option in ("--breakdown", "--scan NAME=V1,V2,V3", "--fit-in SIZE|GPU", "--no-verify"):
        assert option in " ".join(usage.split()), option
    entries = {line.split()[0] for line in doc.splitlines() if line.startswith("    --")}
    assert {"--breakdown", "--scan", "--fit-in", "--no-verify"} <= entries


def test_cell_help_through_the_question_mark(ip):
    # what `%%gpumem?` shows: IPython's own inspector on the cell magic
    from IPython.utils.capture import capture_output

    with capture_output() as cap:
        ip.run_line_magic("pinfo", "%%gpumem")
    shown = cap.stdout + "".join(o.data.get("text/plain", "") for o in cap.outputs)
    for option in ("--scan", "--breakdown", "--fit-in", "--no-verify"):
        assert option in shown, option
    assert "card's whole memory" in " ".join(shown.split())


def test_breakdown_and_scan_cells_that_import_torch_themselves_say_to_import_it_before():
    # A fresh kernel, torch not imported: the cell imports it. The breakdown's hooks and
    # the scan's readings come before the cell, so each says, in one line, to import torch
    # first; the tool imports nothing itself (the scan's cell does not run: no torch).
    script = textwrap.dedent(
        """
        import json, sys
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.utils.capture import capture_output
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "jupyter_gpumem")
        out = {"torch_at_start": "torch" in sys.modules}
        with capture_output() as cap:
            done = ip.run_cell("%%gpumem --scan batch=16,32\\nimport torch\\nran = batch")
        out["scan"] = cap.stderr
        out["scan_failed"] = type(done.error_in_exec).__name__
        out["scan_ran"] = "ran" in ip.user_ns
        out["torch_after_scan"] = "torch" in sys.modules
        with capture_output() as cap:
            ip.run_cell("%%gpumem --breakdown\\nimport torch\\nx = torch.ones(3)")
        out["breakdown"] = [o.data.get("text/plain", "") for o in cap.outputs]
        out["breakdown_ran"] = "x" in ip.user_ns
        print(json.dumps(out))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["torch_at_start"] is False
    assert out["scan"] == (
        "UsageError: --scan needs torch and a CUDA GPU: torch was not imported when the cell "
        "began: import torch before the cell, as the scan measures the GPU before each run "
        "of it (the tool never imports it itself); the cell did not run\n"
    )
    assert out["scan_failed"] == "UsageError"
    assert not out["scan_ran"] and not out["torch_after_scan"]  # nothing imported torch
    assert out["breakdown_ran"]  # the cell ran as usual and imported torch itself
    (report,) = out["breakdown"]
    said = [line.strip() for line in report.splitlines() if "breakdown" in line]
    assert said == [
        (
            "breakdown: --breakdown needs torch and a CUDA GPU: torch was not imported when "
            "the cell began: import torch before the cell, as the breakdown's hooks are set "
            "before it runs (the tool never imports it itself)"
        )
    ]


# -- the tool's own failures never break the cell ----------------------------------------
def test_tool_failure_is_a_warning(ip, capsys):
    current().collector.backend = ScriptedBackend(scenario("keep_n_bytes")[0], fail=True)
    res, texts, cap = run(ip, "%%gpumem\nz = 41 + 1\nz")
    assert res.success and res.result == 42
    assert texts == ["42"] or texts == []
    assert "gpumem: warning: could not take the reading before the cell" in cap.stderr
    assert len(cap.stderr.strip().splitlines()) == 1


# -- line commands ---------------------------------------------------------------------
def test_auto_mode_compact_line(ip, spike):
    _, _, cap = run(ip, "%gpumem auto on")
    assert "auto mode on" in cap.stdout
    _res, texts, _ = run(ip, "k = 1")
    assert len(texts) == 1 and texts[0].startswith("gpumem [")
    assert "cuda:0 alloc +64.00 MiB (320.00 MiB)" in texts[0]
    _, texts, _ = run(ip, "%gpumem history")  # own commands are not reported
    assert not any(t.startswith("gpumem [") for t in texts)
    run(ip, "%gpumem auto off")
    _, texts, _ = run(ip, "k = 2")
    assert texts == []


def test_auto_mode_with_breakdown_gives_every_cell_the_breakdown_s_options(ip, spike):
    from jupyter_gpumem._ipython import session as session_module

    _, _, cap = run(ip, "%gpumem auto on --breakdown")
    assert "auto mode on, each cell's peak broken down" in cap.stdout
    s = current()
    assert s.auto and s.auto_breakdown
    begun = []
    real_begin = s.begin
    s.begin = lambda opts: (begun.append(opts), real_begin(opts))[1]
    try:
        run(ip, "k = 1")
        first = s.last_report
        run(ip, "%gpumem history")  # own commands are not measured
        run(ip, "%gpumem auto on")  # plain auto mode: no breakdown
        run(ip, "k = 2")
    finally:
        s.begin = real_begin
    assert [o.breakdown for o in begun] == [True, False]
    assert begun[0] is session_module._AUTO_BREAKDOWN and begun[0].compact
    assert begun[0].entries == session_module.BREAKDOWN_ENTRIES
    # this scripted device has no torch: the cell ran and its report says why no breakdown
    assert first.first_line == "k = 1" and "torch" in first.breakdown_note, first.breakdown_note
    res, _, _ = run(ip, "%gpumem auto off --breakdown")
    assert "--breakdown goes with `on`" in str(res.error_in_exec)
    assert s.auto  # a refused command changes nothing
    run(ip, "%gpumem auto off")
    assert not s.auto and not s.auto_breakdown


def test_history_commands(ip, spike, tmp_path):
    for i in range(3):
        run(ip, f"%%gpumem -q\nh{i} = {i}")
    _, texts, _ = run(ip, "%gpumem history -n 2")
    table = texts[0].splitlines()
    assert len(table) == 4  # header, rule, 2 rows
    assert "h1 = 1" in table[2] and "h2 = 2" in table[3]
    path = tmp_path / "hist.csv"
    res, _, cap = run(ip, f"%gpumem history --csv {path}")
    assert res.success and "wrote 3 rows" in cap.stdout
    res, _, _ = run(ip, f"%gpumem history --csv {path}")
    assert "exists: choose a new file name" in str(res.error_in_exec)
    import jupyter_gpumem

    df = jupyter_gpumem.history()
    assert list(df["first_line"]) == ["h0 = 0", "h1 = 1", "h2 = 2"]
    run(ip, "%gpumem history --clear")
    assert len(current().history) == 0


def test_history_table_counts_a_cells_out_of_memory_errors(ip):
    """Recorded on an H200: one OOM under a 1 GiB cap in the cell; `%gpumem history` says
    1 in its OOMs column, and nothing there for a cell without one."""
    before, after, _ = scenario("oom_at_cap")
    current().collector.backend = ScriptedBackend(before, after)
    run(ip, "%%gpumem -q\nfailed = 1")
    current().collector.backend = ScriptedBackend(after, after)
    run(ip, "%%gpumem -q\nfine = 1")
    _, texts, _ = run(ip, "%gpumem history -n 2")
    header, _rule, *rows = texts[0].splitlines()
    column = header.index("OOMs")
    assert header[column:].split()[:2] == ["OOMs", "time"]
    assert rows[0][column:].split()[0] == "1" and "failed = 1" in rows[0]
    # no OOM in the second cell: its OOMs column is blank, only the time follows
    assert "fine = 1" in rows[1] and rows[1][column:].split()[1:] == ["s"]


def test_history_size_from_config(ip):
    assert current().history.maxlen == 1000


def test_now_without_torch_reports_state(ip):
    from jupyter_gpumem.collectors.allocator import TorchBackend

    current().collector.backend = TorchBackend()
    res, texts, _ = run(ip, "%gpumem")
    assert res.success
    # on CI there is no GPU/NVML: a statement, not a traceback
    assert texts and ("no GPU devices" in texts[0] or "cuda:" in texts[0])


def test_actions_refused_without_torch(ip, monkeypatch):
    from jupyter_gpumem.collectors.allocator import TorchBackend

    current().collector.backend = TorchBackend()
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    for cmd in (
        "%gpumem empty-cache",
        "%gpumem caching off",
        "%gpumem limit 0.5",
        "%gpumem reset-peak",
    ):
        res, _, _ = run(ip, cmd)
        assert "torch is not imported in this kernel" in str(res.error_in_exec), cmd


@pytest.mark.parametrize(
    "raw",
    [
        "%%gpumem\nx = 1",
        "%%gpumem -q\nx = 1",
        "%%gpumem\t-o r\n\n  y = 2  \n",
        "\n\n%%gpumem --breakdown\n# note\nz = 3",
        "%%gpumemx = 1\nw = 2",  # not the magic: a line of code
        "%%gpumem   \nv = 4",
        "  %%gpumem -c  \n\n",
        "a = 1",
        "",
    ],
)
def test_first_code_line_skips_the_magic_line_only(raw):
    """The report names a cell by its first line of code: the ``%%gpumem`` line (the
    CELL_LINE pattern) and blank lines are skipped, anything else is the line."""
    from jupyter_gpumem._ipython.session import CELL_LINE, first_code_line

    expected = next(
        (s for s in (line.strip() for line in raw.split("\n")) if s and not CELL_LINE.match(s)),
        "",
    )
    assert first_code_line(raw) == expected
