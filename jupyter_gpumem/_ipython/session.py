"""Per-shell state and the cell hooks behind ``%%gpumem`` and auto mode.

How a ``%%gpumem`` cell runs. The cell is not re-run from inside a magic, nor pasted into a
template. A pure input transformer replaces the ``%%gpumem ...`` line with an empty line
(so line numbers in tracebacks stay those the user sees), and the ``pre_run_cell`` /
``post_run_cell`` events, which see the raw cell, take the readings around it. The cell is
thus an ordinary top-level cell: ``Out``, display, tracebacks, ``await`` and
``from __future__`` behave exactly as without the magic, and ``post_run_cell`` fires also
after an exception, ``KeyboardInterrupt`` or ``torch.OutOfMemoryError``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from traitlets import Bool, Int
from traitlets.config import Configurable

from ..analysis.forecast import WINDOW, forecasts
from ..log import warn
from ..model import CellReport, Failed, ScanResult
from ..reporters import bundles
from .parsers import BREAKDOWN_ENTRIES, CellOptions, parse_cell_line

if TYPE_CHECKING:
    from collections.abc import Callable

    from IPython.core.interactiveshell import InteractiveShell

    from ..collectors import Collector
    from ..collectors.snapshot import Trace
    from ..collectors.step import StepRecorder
    from ..core.breakdown import Breakdowns
    from ..core.free import Frees
    from ..core.history import History
    from ..core.postmortem import PostMortems
    from ..core.trace import Traces
    from ..core.tracker import CellTracker
    from ..core.who import Who

CELL_LINE = re.compile(r"^%%gpumem(?:[ \t]+(?P<args>.*?))?[ \t]*\r?\n?$")


class GpuMem(Configurable):
    """Options, settable as ``c.GpuMem.<name>`` in an IPython/ipykernel config file."""

    history_size = Int(1000, help="Cells kept in %gpumem history (oldest dropped).").tag(
        config=True
    )
    auto = Bool(False, help="Start with auto mode on: a one-line report after every cell.").tag(
        config=True
    )
    keep_peak = Bool(
        False,
        help="Never reset PyTorch's global peak counters; peaks are then exact only when a "
        "cell sets a new process-wide peak.",
    ).tag(config=True)
    track = Bool(
        False,
        help="Record where each live GPU block was allocated (PyTorch's allocator history in "
        "its cheapest mode) from the moment torch is imported; same as `%gpumem track on`.",
    ).tag(config=True)


class Session:
    """Everything the extension holds for one shell; removed whole on unload."""

    def __init__(
        self,
        shell: InteractiveShell,
        config: GpuMem,
        collector: Collector,
        tracker: CellTracker,
        history: History,
        who: Who,
        postmortems: PostMortems,
        traces: Traces,
        breakdowns: Breakdowns,
        frees: Frees,
    ) -> None:
        """The session over services composed once, by ``_ipython.compose``."""
        self.shell = shell
        self.config = config
        self.collector = collector
        self.tracker = tracker
        self.history = history
        self.who = who
        self.postmortems = postmortems
        self.traces = traces
        self.breakdowns = breakdowns
        self.frees = frees
        self.auto: bool = config.auto
        self.auto_breakdown = False  # auto mode's cells also get --breakdown
        self._pending: CellOptions | None = None
        self._trace: Trace | Failed | None = None  # a running %%gpumem --trace
        self._step: StepRecorder | Failed | None = None  # a running --breakdown's hooks
        self.scans: list[ScanResult] = []  # this session's scans, newest last
        self.nested = False  # a cell run by the %%gpumem magic itself (fallback path)
        # a recorded cell played back (the demo's kernel, testing/player.py): not measured
        self.playing = False
        self.busy = False  # a cell is running (heartbeats tell the panel)
        self._parsed: dict[str, CellOptions] = {}
        self.report_listeners: list[Callable[[CellReport], None]] = []
        self.last_report: CellReport | None = None
        self.last_breakdown: CellReport | None = None  # the last cell with --breakdown

    def parse_cell_line(self, line: str) -> CellOptions:
        """The options of a ``%%gpumem`` line (without ``%%gpumem``); a UsageError with the
        reason for a bad one."""
        return parse_cell_line(line, self.collector)

    # -- input transformer ---------------------------------------------------------
    def cell_options(self, raw_cell: str) -> CellOptions | None:
        """Options of a ``%%gpumem`` first line, or None (not ours, or bad arguments: the
        real magic then runs and raises the UsageError, and the cell body does not run)."""
        # Only the first line matters: don't split (or copy) a long cell.
        start = len(raw_cell) - len(raw_cell.lstrip("\n")) if raw_cell[:1] == "\n" else 0
        if not raw_cell.startswith("%%gpumem", start):
            return None
        end = raw_cell.find("\n", start)
        first = raw_cell[start : None if end < 0 else end + 1]
        # Parsing costs tens of microseconds and this runs 2-3 times per cell (transform,
        # kernel pre-transform, pre_run_cell): remember the few distinct first lines.
        cached = self._parsed.get(first)
        if cached is not None:
            return cached
        m = CELL_LINE.match(first)
        if m is None:
            return None
        try:
            opts = self.parse_cell_line(m.group("args") or "")
        except Exception:
            return None
        if len(self._parsed) < 64:
            self._parsed[first] = opts
        return opts

    def transform(self, lines: list[str]) -> list[str]:
        """Blank the ``%%gpumem`` line. Pure: IPython also calls it for completeness checks.
        A ``--scan`` cell is left to the magic, which runs its body once per value, and so
        is a ``--dry-run`` cell, which it runs under FakeTensorMode."""
        if lines:
            opts = self.cell_options("".join(lines[:1]))
            if opts is not None and opts.mode == "measured":
                return ["\n", *lines[1:]]
        return lines

    # -- events --------------------------------------------------------------------
    def pre_run_cell(self, info: Any) -> None:
        self.busy = True
        if self.nested or self.playing:
            return
        rec = self.who.recording
        if rec.wanted and not rec.ours:
            try:
                self.who.before_cell()
            except Exception as e:
                rec.error = repr(e)
                warn(f"could not start allocation tracking: {e!r}")
        try:
            self.tracker.cancel()
            raw = getattr(info, "raw_cell", "") or ""
            opts = self.cell_options(raw)
            if opts is not None and opts.mode != "measured":
                self._pending = None  # the magic runs it (and measures each run) itself
                return
            if opts is None and self.auto and not _is_own_command(raw):
                if self.auto_breakdown:
                    opts = _AUTO_BREAKDOWN
                else:
                    opts = _AUTO_KEEP_PEAK if self.config.keep_peak else _AUTO
            self._pending = opts
            if opts is not None:
                self.begin(opts)
        except Exception as e:  # never break the user's cell
            self._pending = None
            self.tracker.cancel()
            self._stop_step()
            warn(f"could not take the reading before the cell: {e!r}")

    def run_nested(self, opts: CellOptions, body: str) -> tuple[Any, CellReport | None]:
        """Run ``body`` as a cell of its own inside the running one, measured with ``opts``
        (the magic's path: a direct ``run_cell_magic`` call, a dry run's check): IPython's
        result and the report."""
        shell = self.shell
        self.tracker.cancel()
        self.begin(opts)
        self.nested = True  # the cell's own run: not measured again as a cell of its own
        try:
            outcome = shell.run_cell(body, store_history=False)
        finally:
            self.nested = False
        error = outcome.error_in_exec or outcome.error_before_exec
        return outcome, self.finish(opts, shell.execution_count, body, error)

    def begin(self, opts: CellOptions) -> None:
        """The readings (and hooks) before a measured cell."""
        self.tracker.begin(
            keep_peak=opts.keep_peak or self.config.keep_peak,
            with_process=_shown(opts),
        )
        if opts.trace or opts.breakdown:
            self._trace = self.traces.start(opts.entries, stacks=opts.trace)
        if opts.breakdown:
            self._step = self.breakdowns.start()

    def _stop_step(self) -> StepRecorder | Failed | None:
        """Remove a breakdown's hooks (always, whatever else fails); returns its recorder."""
        step, self._step = self._step, None
        stop = getattr(step, "stop", None)
        if stop is not None:
            try:
                stop()
            except Exception as e:
                warn(f"could not remove the breakdown's hooks: {e!r}")
        return step

    def post_run_cell(self, result: Any) -> None:
        if not self.nested:
            self.busy = False
        if self.nested or self.playing or self._pending is None or not self.tracker.active:
            return
        opts, self._pending = self._pending, None
        raw = getattr(getattr(result, "info", None), "raw_cell", "") or ""
        error = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        self.finish(opts, getattr(result, "execution_count", None), raw, error)

    def finish(
        self, opts: CellOptions, execution_count: int | None, raw: str, error: Any
    ) -> CellReport | None:
        shown = _shown(opts)
        step = self._stop_step() if self._step is not None else None
        failure = error if isinstance(error, BaseException) else None
        try:
            # execution_count, first_line, error, device, with_process, hints
            report = self.tracker.end(
                execution_count, first_code_line(raw), failure, opts.device, shown, shown
            )
        except Exception as e:
            self.tracker.cancel()
            warn(f"could not take the reading after the cell: {e!r}")
            return None
        if opts.trace or opts.breakdown:
            report = self._traced(opts, step, report, failure, shown, raw)
        elif report.devices or report.failed:  # (enrich has nothing to add otherwise)
            report = self._enrich(report, failure, shown, raw)
        if self.history.add(report).devices:  # a cell that touched no device grew nothing
            self._forecast(report)
        self.last_report = report
        if report.breakdowns:
            self.last_breakdown = report
        if opts.output:
            self.shell.user_ns[opts.output] = report
        for listener in list(self.report_listeners):
            try:
                listener(report)
            except Exception as e:
                warn(f"report listener failed: {e!r}")
        if not opts.quiet:
            # In auto mode an out-of-memory error or a traceback that holds memory gets the
            # full report: its explanation is what the line can't say.
            explain = (
                bool(report.postmortems)
                or bool(report.traceback and report.traceback.bytes)
                or (bool(report.workers) and any(w.postmortem is not None for w in report.workers))
            )
            show_report(report, compact=opts.compact and not explain, shell=self.shell)
        return report

    def _forecast(self, report: CellReport) -> None:
        """Set the report's forecasts (``analysis/forecast.py``) from the history's last
        rows, the report's row last: microseconds, set in place while the report is made."""
        try:
            rows = self.history.tail(WINDOW)
            report.forecasts = forecasts(rows, report, _hostname(), self._device_room)
        except Exception as e:  # a forecast must never cost the user the report
            warn(f"could not forecast the cell's memory: {e!r}")

    def _device_room(self, index: int, name: str) -> tuple[int, int] | None:
        """(total, used) of device ``index`` from NVML, for a worker's forecast when the
        kernel has no reading of that device (no context there); None when unknown."""
        nvml: Any = getattr(self.collector.backend, "nvml", None)
        if nvml is None:
            return None
        try:
            i = nvml.nvml_index(index)
            d = nvml.read(i, False) if i is not None else None
        except Exception:
            return None
        if d is None or (name and d.name and name not in d.name and d.name not in name):
            return None  # (torch and NVML may spell one device's name apart)
        return int(d.total), int(d.used)

    def _enrich(
        self, report: CellReport, error: BaseException | None, shown: bool, raw: str
    ) -> CellReport:
        """The analyses every measured cell may get (attribution, post-mortem)."""
        try:
            return self.postmortems.enrich(report, error, shown, raw, self.scans)
        except Exception as e:  # attribution must never cost the user the report
            warn(f"could not attribute the cell's memory: {e!r}")
            return report

    def _traced(
        self,
        opts: CellOptions,
        step: StepRecorder | Failed | None,
        report: CellReport,
        error: BaseException | None,
        shown: bool,
        raw: str,
    ) -> CellReport:
        """A ``--trace`` or ``--breakdown`` cell: its trace stopped and read, then the
        analyses, the breakdown and the trace's report."""
        snapshot: dict[str, Any] | None = None
        ms, note = 0.0, "the trace did not start"
        trace, self._trace = self._trace, None

        def stop_trace() -> None:
            nonlocal snapshot, ms, note
            try:
                snapshot, ms, note = self.traces.stop(trace)
            except Exception as e:
                warn(f"could not read the cell's trace: {e!r}")

        if not opts.trace:
            # Stopped before the attribution below: a breakdown's trace has no stacks, and
            # the attribution must not take it for allocation tracking. (A --trace has
            # stacks: the attribution reads them first.)
            stop_trace()
        report = self._enrich(report, error, shown, raw)
        if opts.trace:
            stop_trace()
        if opts.breakdown:
            try:
                report = self.breakdowns.finish(step, snapshot, note, report)
            except Exception as e:
                warn(f"could not break the peak down: {e!r}")
        if opts.trace:
            try:
                report = self.traces.report(snapshot, ms, note, report, opts.save, trace)
            except Exception as e:
                warn(f"could not read the cell's trace: {e!r}")
        return report


# Auto mode's options, made once (a frozen dataclass of 13 fields costs microseconds).
_AUTO = CellOptions(compact=True)
_AUTO_KEEP_PEAK = CellOptions(compact=True, keep_peak=True)
# ``%gpumem auto on --breakdown``: the peak is reset before each cell (a breakdown is of
# the cell's own peak), and the trace keeps as many entries as a --breakdown cell's.
_AUTO_BREAKDOWN = CellOptions(compact=True, breakdown=True, entries=BREAKDOWN_ENTRIES)


_HOST: list[str] = []


def _hostname() -> str:
    """This machine's name, as workers report theirs (read once)."""
    if not _HOST:
        import socket

        _HOST.append(socket.gethostname())
    return _HOST[0]


def _shown(opts: CellOptions) -> bool:
    """What only a full report shows (NVML's per-process figure, hints) is read only for
    one, or when the report object is kept (-o)."""
    return opts.output is not None or not (opts.quiet or opts.compact)


_OWN_COMMAND = re.compile(r"\s*%(?:gpumem|load_ext|unload_ext|reload_ext)")


def _is_own_command(raw: str) -> bool:
    return _OWN_COMMAND.match(raw) is not None


def first_code_line(raw: str) -> str:
    start = 0
    n = len(raw)
    while start < n:  # line by line, without splitting a long cell whole
        end = raw.find("\n", start)
        if end < 0:
            end = n
        s = raw[start:end].strip()
        # the %%gpumem line (CELL_LINE on a stripped line: the name alone, or with blanks)
        if s and not (s.startswith("%%gpumem") and s[8:9] in ("", " ", "\t")):
            return s
        start = end + 1
    return ""


def show_report(report: CellReport, compact: bool = False, shell: Any = None) -> None:
    """The report as the record shows itself (``reporters/bundles.py``), published raw to
    the shell's display publisher: what ``display(bundle, raw=True)`` does, without asking
    IPython's nine other formatters (35 us a cell) or its argument handling."""
    bundle = bundles.cell_report(report, compact=compact)
    pub = getattr(shell, "display_pub", None)
    if pub is None:
        from IPython.display import display

        display(bundle, raw=True)
        return
    pub.publish(data=bundle, metadata={})
