"""``%%gpumem`` and the ``%gpumem`` commands."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import MagicArgumentParser

from ..core import actions
from ..errors import ActionRefused
from ..reporters import bundles
from ..units import format_bytes as fb
from ..units import parse_size, shown
from .session import CellOptions, Session

# `%gpumem segments` draws this many of the largest segments (as the panel does): a map of
# thousands of 2 MiB segments is unreadable, and drawing them costs ~60 ms a thousand.
SEGMENTS_DRAWN = 200


def _nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise UsageError(f"not a whole number: {shown(text)}") from None
    if v < 0:
        raise UsageError(f"must not be negative: {shown(text)}")
    return v


def _positive_int(text: str) -> int:
    v = _nonneg_int(text)
    if v == 0:
        raise UsageError(f"must be at least 1: {shown(text)}")
    return v


def _ranks(text: str) -> list[int]:
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise UsageError(f"--ranks: expected ranks like 1,2,3, got {shown(text)}")
    return [int(p) for p in parts]


class _Help(argparse.HelpFormatter):
    """Help as ``%%gpumem?`` shows it: plain argparse, wide enough for the long options."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=24, width=90)


def _parser(prog: str, description: str | None = None) -> MagicArgumentParser:
    return MagicArgumentParser(prog=prog, description=description, formatter_class=_Help)


def _cell_parser() -> MagicArgumentParser:
    p = _parser(
        "%%gpumem",
        "Runs the cell as a normal cell (Out, tracebacks and line numbers unchanged), then "
        "shows for each device it touched: allocated and reserved before -> after, the exact "
        "peak inside the cell (PyTorch's own counters, not sampling) and its height above the "
        "start, device memory used beyond PyTorch's reservation, cudaMalloc/cudaFree calls, "
        "retries, OOMs, non-releasable fragmentation, host RSS and wall time, plus hints.",
    )
    p.add_argument("-d", "--device", metavar="N", type=_nonneg_int, help="report only device N")
    p.add_argument("-q", "--quiet", action="store_true", help="record in the history, show nothing")
    p.add_argument("-o", "--output", metavar="VAR", help="store the CellReport object in VAR")
    p.add_argument(
        "--keep-peak",
        action="store_true",
        help="don't reset PyTorch's peak counters (the peak is then exact only when "
        "the cell sets a new process-wide peak)",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="record every allocation of this cell (the allocator's full history, "
        "this cell only) and draw them over time: stacked allocations, the peak, "
        "what was alive at the peak and which line made it",
    )
    p.add_argument(
        "--entries",
        metavar="N",
        type=_entries,
        default=None,
        help="trace entries kept per device, a ring buffer (100..10000000; default "
        "20000, and 1000000 for --breakdown without --trace)",
    )
    p.add_argument(
        "--save",
        metavar="PATH",
        help="also write the trace as a snapshot that PyTorch's memory_viz opens "
        "(implies --trace; never overwrites)",
    )
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="what the peak is made of, per device, in bytes that add up exactly to "
        "the allocator's peak: parameters, buffers, gradients, optimizer state, "
        "activations (saved for backward), temporaries, kept from before, block "
        "slack; the phase the peak fell in (forward, backward, optimizer step) and "
        "the modules that made most of it. The step runs with autograd's "
        "saved-tensor hooks and module hooks on (about 1.3-2x slower, this cell "
        "only). Also jupyter_gpumem.breakdown().",
    )
    p.add_argument(
        "--scan",
        metavar="NAME=V1,V2,V3",
        type=_scan_spec,
        help="before you run: the largest value that fits. Runs the cell once per "
        "value with NAME bound to it (the cell reads NAME: batch, seq_len), each run "
        "measured as %%%%gpumem measures; between runs the names a run bound are "
        "dropped, gc runs and the cache is emptied. Fits peak(NAME) (affine; "
        "quadratic when 3+ values show curvature), predicts the largest value within "
        "the target and runs it under a cap equal to the target (stepping down if it "
        "runs out). What a run changes inside existing objects is not undone (an "
        "optimizer step on a model that already existed, its state). Also "
        "jupyter_gpumem.scan(fn, values, fit_in=...) for a function fn(value).",
    )
    p.add_argument(
        "--fit-in",
        metavar="SIZE|GPU",
        type=_target,
        help="with --scan or --dry-run, the target: a card's whole memory, as a size "
        "(24GiB, 16GB) or a card (T4, L4, A10G, RTX3090, RTX4090, A100-40GB, A100-80GB, "
        "H100, H200). It takes from it what this process holds outside PyTorch (CUDA context, "
        "libraries), which leaves PyTorch's cap: to scan under a `%%gpumem limit` cap, "
        "give the cap plus that. Default: what this GPU has free now",
    )
    p.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="with --scan: predict only, no run under the cap",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="plan without running: the cell runs under PyTorch's FakeTensorMode (no "
        "device memory is used, no kernel runs, your names are left as they were), its "
        "storages are replayed through a model of PyTorch's caching allocator, and the "
        "report predicts each device's peak allocated and reserved, with cuBLAS's "
        "workspaces and the CUDA context beside them. With --fit-in: does it fit that "
        "card, by how much. Build the model inside the cell under `with "
        "torch.device('cuda')` to plan one that does not fit here. Also "
        "jupyter_gpumem.dry_run(fn, *args, fit_in=...)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="with --dry-run: then run the cell for real, when it fits here, and show the "
        "measured peaks beside the predicted ones",
    )
    p.add_argument(
        "--world-size",
        metavar="N",
        type=_world_size,
        help="with --dry-run: as rank 0 of a job of N processes (one GPU each), with "
        "PyTorch's fake process group as the job's group: the cell's own sharding "
        "(fully_shard, DistributedDataParallel, ZeroRedundancyOptimizer) runs as on "
        "rank 0, collectives move no data, and the report predicts one rank's peak, the "
        "buffers collectives take from PyTorch's allocator included (NCCL's own are not "
        "seen). Also jupyter_gpumem.dry_run(fn, world_size=N)",
    )
    return p


BREAKDOWN_ENTRIES = 1_000_000
EXPAND_CHARS = 1000  # a %gpumem line whose $name and {expr} are expanded
LONG_WORD = 10_000  # characters of one argument (shlex splits it in quadratic time)
_RUN_MAGIC = ("run_line_magic", "run_cell_magic")


def _scan_spec(text: str) -> tuple[str, tuple[float, ...], bool]:
    from .scan_runs import check_name, scan_values

    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep:
        raise UsageError(f"--scan needs NAME=V1,V2,V3 (e.g. batch=16,32,64), got {shown(text)}")
    why = check_name(name)
    if why is not None:
        raise UsageError(f"--scan: {why}")
    if not rest.strip():
        raise UsageError(f"--scan {name}=: no values; give two or more, e.g. {name}=16,32,64")
    try:
        values, whole = scan_values(rest.split(","))
    except ValueError as e:
        raise UsageError(f"--scan: {e}") from None
    return name, values, whole


def _check_words(line: str) -> None:
    """Refuse a word of the line too long to split, before IPython's argument parser
    splits it (shlex: time quadratic in a word's length, a minute for 500,000 characters).
    A ``--scan`` list is refused as the parser would refuse it: by its count first."""
    if len(line) <= LONG_WORD:
        return
    words = line.split()
    for i, word in enumerate(words):
        if len(word) <= LONG_WORD:
            continue
        if word.startswith("--scan="):
            _scan_spec(word[len("--scan=") :].strip("'\""))
        elif i and words[i - 1] == "--scan":
            _scan_spec(word.strip("'\""))
        raise UsageError(f"an argument of {len(word)} characters is too long: {shown(word)}")


def _target(text: str) -> Any:
    from ..analysis.targets import parse_target

    try:
        return parse_target(text)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _world_size(text: str) -> int:
    from ..collectors.fake_group import check_world_size
    from ..errors import GpuMemError

    try:
        return check_world_size(text)
    except GpuMemError as e:
        raise UsageError(f"--world-size: {e}") from None


def _entries(text: str) -> int:
    v = _nonneg_int(text)
    if not 100 <= v <= 10_000_000:
        raise UsageError(f"--entries must be between 100 and 10000000, got {shown(v)}")
    return v


def _line_parser() -> MagicArgumentParser:
    p = _parser("%gpumem", "With no command: now, a table per device.")
    p.add_argument("-d", "--device", metavar="N", type=_nonneg_int, help="only device N")
    sub = p.add_subparsers(dest="command", parser_class=MagicArgumentParser, metavar="COMMAND")

    def command(name: str, text: str) -> MagicArgumentParser:
        c: MagicArgumentParser = sub.add_parser(
            name, help=text.split(":")[0].split(".")[0], description=text, formatter_class=_Help
        )
        return c

    def device(c: MagicArgumentParser) -> None:
        c.add_argument(
            "-d", "--device", metavar="N", dest="sub_device", type=_nonneg_int, help="only device N"
        )

    def on_off(c: MagicArgumentParser) -> None:
        c.add_argument("state", choices=["on", "off"], metavar="on|off")

    on_off(command("auto", "a one-line report after every cell"))
    h = command(
        "history", "one row per measured cell (also jupyter_gpumem.history() -> pandas DataFrame)"
    )
    h.add_argument("-n", metavar="N", type=_nonneg_int, help="only the last N cells")
    h.add_argument("--csv", metavar="PATH", help="write the rows to a new CSV file")
    h.add_argument("--clear", action="store_true", help="forget all rows")
    h.add_argument(
        "--plot", action="store_true", help="draw allocated, reserved and the peak after each cell"
    )
    device(h)
    command("empty-cache", "gc.collect() + torch.cuda.empty_cache(); the bytes released")
    on_off(command("caching", "switch the caching allocator off and on (torch >= 2.6)"))
    lim = command(
        "limit",
        "cap PyTorch's memory on a device (set_per_process_memory_fraction), to try a smaller GPU",
    )
    lim.add_argument(
        "spec",
        metavar="24GiB|0.3|off",
        help="a size (24GiB, 24GB), a fraction of the device, or off",
    )
    device(lim)
    device(command("reset-peak", "reset PyTorch's peak counters"))
    w = command(
        "who",
        "who holds the live GPU memory: the names in your namespace (tensors, "
        "modules, optimizers, containers, Out[N], autograd graphs, the kept traceback), "
        "the lines that allocated it, or the cells; rows add up to `allocated` (also "
        "jupyter_gpumem.who())",
    )
    device(w)
    w.add_argument(
        "-n", metavar="N", type=_positive_int, default=20, help="rows per device (default 20)"
    )
    w.add_argument(
        "--by",
        choices=["variable", "line", "cell"],
        default="variable",
        metavar="variable|line|cell",
        help="group by (default variable)",
    )
    sg = command(
        "segments",
        "every segment the allocator holds and its blocks, to scale: "
        "allocated, cached free, free pieces (fragmentation), the largest free block",
    )
    device(sg)
    sg.add_argument(
        "--max",
        metavar="N",
        dest="max_segments",
        type=_positive_int,
        default=SEGMENTS_DRAWN,
        help=f"draw the N largest segments (default {SEGMENTS_DRAWN}; the summary counts all)",
    )
    sg.add_argument("--all", action="store_true", help="draw every segment")
    sg.add_argument(
        "--rank",
        metavar="N",
        type=_nonneg_int,
        help="the map of worker process rank N instead (asked for its snapshot; it has 2 s "
        "to answer); of several live ones, the most recently started",
    )
    sg.add_argument(
        "--pid",
        metavar="PID",
        type=_positive_int,
        help="the map of the worker process PID instead (see `%%gpumem workers`)",
    )
    on_off(
        command(
            "track",
            "record where each live block is allocated (PyTorch's allocator "
            "history, stacks of live blocks only)",
        )
    )
    command("release-traceback", "drop the frames the last error's traceback keeps alive")
    wk = command(
        "workers",
        "worker processes of this notebook and their own GPU memory (forked by a measured "
        "cell, spawned ones that call jupyter_gpumem.report_worker(), ranks that call "
        "jupyter_gpumem.report_to_store()); `watch`: read the other ranks of this kernel's "
        "torch.distributed group from its store",
    )
    wk.add_argument(
        "action",
        nargs="?",
        choices=["show", "watch", "unwatch"],
        default="show",
        metavar="watch|unwatch",
    )
    wk.add_argument(
        "--ranks", metavar="1,2,...", type=_ranks, help="the ranks to watch (default: all others)"
    )
    pn = command("panel", "live bars and buttons as an ipywidgets widget (any frontend)")
    pn.add_argument(
        "--interval",
        metavar="MS",
        type=_nonneg_int,
        default=500,
        help="milliseconds between updates (>= 100; default 500)",
    )
    return p


CELL_PARSER = _cell_parser()
LINE_PARSER = _line_parser()

_PEAKS = """Peaks: PyTorch keeps ONE peak counter per device for the whole process. By default
%%gpumem (and auto mode) reset it before the cell, so afterwards your own
torch.cuda.max_memory_allocated() returns the peak of the last measured cell. With
--keep-peak (or c.GpuMem.keep_peak = True) nothing is reset; the peak shown is then exact
when the cell set a new process-wide peak and an upper bound otherwise."""

_NOTES = """Nothing here imports torch or creates a CUDA context except `caching` and `limit`, which
need one and say so. Sizes: KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB of 1024."""


def _commands(parser: MagicArgumentParser) -> dict[str, MagicArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help() -> str:
    """``%%gpumem?``: built from the parsers that read the arguments (one source)."""
    parts = [
        "Measure GPU memory: what a cell did to PyTorch's allocator and the device.",
        "Cell magic::\n\n" + _indent(CELL_PARSER.format_help()),
        _PEAKS,
        "Line commands::\n\n"
        + _indent(LINE_PARSER.format_usage() + "\n  " + str(LINE_PARSER.description)),
    ]
    parts += [_indent(c.format_help()) for c in _commands(LINE_PARSER).values()]
    parts.append(_NOTES)
    return "\n\n".join(p.rstrip() for p in parts) + "\n"


def _indent(text: str) -> str:
    return "\n".join("  " + line if line.strip() else "" for line in text.splitlines())


_DOC = _help()


def _identifier(name: str) -> str:
    if not name.isidentifier():
        raise UsageError(f"-o needs a Python variable name, got {name!r}")
    return name


@magics_class
class GpuMemMagics(Magics):
    def __init__(self, shell: Any, session: Session) -> None:
        super().__init__(shell)
        self.session = session
        session.parse_cell_line = self.parse_cell_line

    # -- parsing ---------------------------------------------------------------------
    def _check_device(self, device: int | None) -> None:
        if device is None:
            return
        try:
            actions.check_device(self.session.collector, device)
        except ActionRefused as e:
            raise UsageError(str(e)) from None

    def parse_cell_line(self, line: str) -> CellOptions:
        _check_words(line)
        args = CELL_PARSER.parse_argstring(line)
        self._check_device(args.device)
        save = None
        if args.save:
            save = os.path.abspath(os.path.expanduser(args.save))
            if os.path.exists(save):
                raise UsageError(f"--save: {save} exists: choose a new file name")
            if not os.path.isdir(os.path.dirname(save)):
                raise UsageError(f"--save: no folder {os.path.dirname(save)}")
        trace = args.trace or save is not None
        if args.scan is not None:
            for flag, given in (
                ("--trace", trace),
                ("--breakdown", args.breakdown),
                ("--keep-peak", args.keep_peak),
            ):
                if given:
                    raise UsageError(f"--scan runs the cell several times; {flag} measures one run")
            if args.dry_run and args.fit_in is None:
                raise UsageError(
                    "--scan with --dry-run needs a target: --fit-in 24GiB or a card (T4, "
                    "RTX4090, A100-80GB, ...)"
                )
            if args.check:
                raise UsageError("--check goes with --dry-run of one run, not with --scan")
        elif args.dry_run:
            for flag, given in (
                ("--trace", trace),
                ("--breakdown", args.breakdown),
                ("--no-verify", not args.verify),
            ):
                if given:
                    raise UsageError(f"--dry-run runs nothing on the GPU; {flag} measures a run")
        elif args.fit_in is not None or not args.verify:
            raise UsageError(
                "--fit-in goes with --scan NAME=V1,V2,V3 or --dry-run; --no-verify with --scan"
            )
        if args.check and not args.dry_run:
            raise UsageError("--check goes with --dry-run")
        if args.world_size is not None and not args.dry_run:
            raise UsageError(
                "--world-size goes with --dry-run: a cell that runs is one process (run the "
                "job with torchrun to measure its ranks)"
            )
        if args.check and (args.world_size or 1) > 1:
            raise UsageError(
                "--check runs the cell here as one process: with --world-size it would not "
                "run the job that was predicted"
            )
        entries = args.entries
        if entries is None:
            entries = BREAKDOWN_ENTRIES if args.breakdown and not trace else 20_000
        return CellOptions(
            device=args.device,
            quiet=args.quiet,
            output=_identifier(args.output) if args.output else None,
            keep_peak=args.keep_peak,
            trace=trace,
            entries=entries,
            save=save,
            breakdown=args.breakdown,
            scan=args.scan,
            fit_in=args.fit_in,
            verify=args.verify,
            dry_run=args.dry_run,
            check=args.check,
            world_size=args.world_size or 1,
        )

    # -- the magic -------------------------------------------------------------------
    @line_cell_magic
    @no_var_expand  # expanded by _expand: IPython's expansion is quadratic in the line
    def gpumem(self, line: str = "", cell: str | None = None) -> Any:
        line = self._expand(line)
        if cell is not None:
            return self._cell(line, cell)
        _check_words(line)
        args = LINE_PARSER.parse_argstring(line)
        command = args.command or "now"
        try:
            return getattr(self, "_cmd_" + command.replace("-", "_"))(args)
        except ActionRefused as e:
            raise UsageError(str(e)) from None

    gpumem.__doc__ = _DOC

    def _expand(self, line: str) -> str:
        """``$name`` and ``{expr}`` in the line, as IPython expands a magic's line, from the
        user's namespace and the locals of the frame that called the magic. IPython's own
        expansion takes time quadratic in the line's length (20,000 values of --scan: a
        minute): a line without ``$``, ``{`` or ``}`` is left as it is, and so is a line
        longer than EXPAND_CHARS (the parser then says what is wrong with it)."""
        if len(line) > EXPAND_CHARS or not ("$" in line or "{" in line or "}" in line):
            return line
        # var_expand(line, depth) reads the locals of the frame depth + 1 above it: the
        # caller of IPython's run_line_magic / run_cell_magic, as IPython's expansion does.
        # Called otherwise: a depth beyond the stack, and only the user's namespace is read.
        assert self.shell is not None
        frame: Any = sys._getframe()
        depth = 0
        while frame is not None and frame.f_code.co_name not in _RUN_MAGIC:
            frame, depth = frame.f_back, depth + 1
        return str(self.shell.var_expand(line, depth + 1 if frame is not None else 1 << 20))

    def _cell(self, line: str, cell: str) -> None:
        # Reached only when the input transformer did not take the cell: bad arguments
        # (parse_cell_line raises UsageError before the body runs), or a direct
        # run_cell_magic() call. Then the body runs as a nested cell, still measured.
        opts = self.parse_cell_line(line)
        assert self.shell is not None
        if opts.scan is not None and opts.dry_run:
            return self._dry_scan(opts, cell)
        if opts.scan is not None:
            return self._scan(opts, cell)
        if opts.dry_run:
            return self._dry_run(opts, cell)
        s = self.session
        s.tracker.cancel()
        s.begin(opts)
        s.nested = True
        try:
            result = self.shell.run_cell(cell, store_history=False)
        finally:
            s.nested = False
        error = result.error_in_exec or result.error_before_exec
        s.finish(opts, self.shell.execution_count, cell, error)
        return None

    def _dry_run(self, opts: CellOptions, body: str) -> None:
        from IPython.display import display

        from . import dry_run_cell

        assert self.shell is not None
        result = dry_run_cell.run(self.session, self.shell, opts, body)
        if result is None:
            return
        if opts.output:
            self.shell.user_ns[opts.output] = result
        if not opts.quiet:
            display(result)  # the prediction shows itself

    def _dry_scan(self, opts: CellOptions, body: str) -> None:
        from IPython.display import display

        from . import dry_run_cell

        assert self.shell is not None
        result = dry_run_cell.scan(self.session, self.shell, opts, body)
        if result is None:
            return
        if opts.output:
            self.shell.user_ns[opts.output] = result
        if not opts.quiet:
            display(result)  # the scan shows itself

    def _scan(self, opts: CellOptions, body: str) -> None:
        from IPython.display import display

        from ..core.scanner import Scanner, target_refusal
        from ..errors import ScanStopped
        from ..reporters.scan import stopped_text
        from .scan_runs import CellRuns

        assert self.shell is not None and opts.scan is not None
        name, values, integer = opts.scan
        why = _no_gpu_for_scan()
        if why is not None:
            print(f"gpumem: {why}; the cell did not run")
            return
        s = self.session
        refused = target_refusal(s.collector, opts.fit_in, opts.device)
        if refused is not None:
            raise UsageError(refused)
        try:
            runs = CellRuns(self.shell, name, body, integer)
        except SyntaxError as e:
            raise UsageError(f"--scan: the cell does not compile: {e}") from None
        scanner = Scanner(s.collector, runs.run, runs.cleanup, opts.device)
        try:
            result = scanner.scan(name, values, opts.fit_in, opts.verify, integer)
        except ScanStopped as stop:
            if not opts.quiet:
                print(stopped_text(stop.runs, str(stop), integer))
            if stop.error is not None:
                raise stop.error from None
            return
        finally:
            runs.finish()
        from dataclasses import replace

        result = replace(result, execution_count=self.shell.execution_count, code=body)
        s.scans = [*s.scans[-19:], result]
        if opts.output:
            self.shell.user_ns[opts.output] = result
        if not opts.quiet:
            display(result)  # the scan shows itself

    # -- line commands ----------------------------------------------------------------
    def _cmd_now(self, args: Any) -> None:
        from IPython.display import display

        self._check_device(args.device)
        m = self.session.collector.measure()
        if args.device is not None:
            from dataclasses import replace

            m = replace(m, devices=tuple(d for d in m.devices if d.index == args.device))
        display(m)  # the measurement shows itself

    def _cmd_auto(self, args: Any) -> None:
        self.session.auto = args.state == "on"
        print(f"gpumem: auto mode {args.state}")

    def _cmd_history(self, args: Any) -> None:
        from IPython.display import display

        h = self.session.history
        if args.clear:
            h.clear()
            print("gpumem: history cleared")
            return
        if args.csv:
            path = os.path.expanduser(args.csv)
            try:
                n = h.write_csv(path, args.n)
            except FileExistsError:
                raise UsageError(f"{path} exists: choose a new file name") from None
            except OSError as e:
                raise UsageError(f"cannot write {path}: {e.strerror}") from None
            print(f"gpumem: wrote {n} rows to {path}")
            return
        rows = h.last(args.n)
        if not rows:
            print("gpumem: no measured cells yet (use %%gpumem or %gpumem auto on)")
            return
        device = args.sub_device if args.sub_device is not None else args.device
        header = (
            "cell",
            "first line",
            "device",
            "alloc Δ",
            "reserved Δ",
            "peak",
            "above start",
            "OOMs",
            "time",
        )
        body = []
        for r in rows:
            for d in r.devices or (None,):
                body.append(
                    (
                        "" if r.execution_count is None else str(r.execution_count),
                        r.first_line + (" (failed)" if r.failed else ""),
                        "-"
                        if d is None
                        else f"cuda:{d.device}" + (f" {d.worker}" if d.worker else ""),
                        "-" if d is None else _signed(d.allocated_delta),
                        "-" if d is None else _signed(d.reserved_delta),
                        "-" if d is None else fb(d.peak_allocated),
                        "-" if d is None else _signed(d.peak_above_start),
                        str(d.ooms) if d is not None and d.ooms else "",
                        f"{r.wall_time:.3f} s",
                    )
                )
        plot = None
        if args.plot:
            from ..reporters.history_plot import no_plot_reason

            if device is None:
                devices = [
                    d.device
                    for r in rows
                    for d in r.devices
                    if d.worker is None and d.allocated is not None
                ]
                device = devices[0] if devices else 0
            why = no_plot_reason(rows, device, self.session.collector.measure(False))
            if why is None:
                plot = rows
            else:
                print(f"gpumem: no plot: {why}")
        replay = self.session.collector.replay
        display(bundles.history(header, body, plot, device or 0, replay), raw=True)
        for r in rows:  # a worker's out-of-memory error, in one line (its post-mortem's)
            for d in r.devices:
                if d.oom:
                    cell = "" if r.execution_count is None else f"[{r.execution_count}] "
                    print(f"gpumem: {cell}cuda:{d.device} {d.worker or ''}: out of memory: {d.oom}")

    def _cmd_empty_cache(self, args: Any) -> None:
        r = actions.empty_cache(self.session.collector)
        if not r.released:
            print(
                f"gpumem: gc.collect() freed {r.gc_collected} objects; CUDA is not initialised,"
                " so there was no cache to empty"
            )
            return
        parts = [f"cuda:{i} {fb(b)}" for i, b in sorted(r.released.items())]
        print(
            f"gpumem: released to the driver: {', '.join(parts)} "
            f"(gc.collect() freed {r.gc_collected} objects)"
        )

    def _cmd_caching(self, args: Any) -> None:
        enable = args.state == "on"
        r = actions.set_caching(self.session.collector, enable)
        msg = f"gpumem: caching allocator is now {'on' if r.caching else 'off'}"
        if r.initialised_cuda:
            msg += " (this initialised CUDA: the switch needs a context)"
        print(msg)
        if not r.caching:
            print(
                "  Cached blocks stay reserved until `%gpumem empty-cache`. From now on every "
                "allocation is a direct cudaMalloc, invisible to PyTorch's counters and peaks: "
                "reports show it under 'outside PyTorch' and device figures."
            )

    def _cmd_limit(self, args: Any) -> None:
        spec = args.spec.strip()
        device = args.sub_device if args.sub_device is not None else args.device
        if device is None:
            device = 0
        fraction = nbytes = None
        if spec.lower() != "off":
            try:
                fraction = float(spec)
            except ValueError:
                try:
                    nbytes = parse_size(spec)
                except ValueError as e:
                    raise UsageError(f"limit: {e}; or a fraction like 0.3; or off") from None
            else:
                if not 0.0 < fraction <= 1.0:
                    raise UsageError(
                        f"limit: a plain number is a fraction of the device, in (0, 1]; got "
                        f"{spec}. For a size add a unit: {spec}B, 24GiB, 24GB"
                    )
        r = actions.set_limit(self.session.collector, device, fraction=fraction, nbytes=nbytes)
        if r.fraction is None:
            print(f"gpumem: cap removed on cuda:{device}")
        else:
            print(
                f"gpumem: PyTorch may reserve at most {fb(r.bytes)} on cuda:{device} "
                f"({r.fraction:.4g} of the device); a larger request raises OutOfMemoryError"
            )
        if r.initialised_cuda:
            print("  (this initialised CUDA on that device: a cap needs a context)")
        if r.reserved_over_cap:
            print(
                f"  {fb(r.reserved_over_cap)} is already reserved above the cap; it stays "
                "until freed and `%gpumem empty-cache`"
            )

    def _cmd_reset_peak(self, args: Any) -> None:
        device = args.sub_device if args.sub_device is not None else args.device
        actions.reset_peak(self.session.collector, device)
        print("gpumem: peak counters reset" + (f" on cuda:{device}" if device is not None else ""))

    def _cmd_who(self, args: Any) -> None:
        from IPython.display import display

        device = args.sub_device if args.sub_device is not None else args.device
        self._check_device(device)
        try:
            reports = self.session.attributor.who(device, args.by, args.n)
        except ActionRefused as e:
            print(f"gpumem: {e}")
            return
        display(bundles.marked(bundles.who(reports), self.session.collector.replay), raw=True)

    def _cmd_segments(self, args: Any) -> None:
        from IPython.display import display

        device = args.sub_device if args.sub_device is not None else args.device
        if args.rank is not None or args.pid is not None:
            self._worker_segments(args, device)
            return
        self._check_device(device)
        try:
            maps = self.session.attributor.segment_maps(
                device, None if args.all else args.max_segments
            )
        except ActionRefused as e:
            print(f"gpumem: {e}")
            return
        display(bundles.marked(bundles.segments(maps), self.session.collector.replay), raw=True)

    def _worker_segments(self, args: Any, device: int | None) -> None:
        """A worker's map: the same analysis and views as the kernel's own, titled with
        the worker (its devices are its own: not checked against the kernel's)."""
        from IPython.display import display

        from ..core.worker_segments import worker_segment_maps

        try:
            found, maps = worker_segment_maps(
                args.rank, args.pid, device, None if args.all else args.max_segments
            )
        except ActionRefused as e:
            print(f"gpumem: {e}")
            return
        if found.note:
            print(f"gpumem: {found.note}")
        if found.trimmed:
            print(
                f"gpumem: {found.worker.label}'s snapshot was trimmed to fit the hand-over: "
                "each run of adjacent live blocks is drawn as one block"
            )
        if not maps:
            print(f"gpumem: {found.title} holds no segment: its cache is empty")
            return
        display(bundles.segments(maps), raw=True)

    def _cmd_track(self, args: Any) -> None:
        print("gpumem: " + self.session.attributor.set_tracking(args.state == "on"))

    def _cmd_release_traceback(self, args: Any) -> None:
        if sys.modules.get("torch") is not None:
            held = self.session.attributor.traceback_holdings()
        else:
            held = None
        r = self.session.attributor.release_traceback()
        if not r.frames:
            print("gpumem: no kept traceback with frames of its own: nothing to release")
            return
        freed = {d: b for d, b in r.freed.items() if b}
        what = ", ".join(f"cuda:{d} {fb(b)}" for d, b in sorted(freed.items())) or "no GPU memory"
        expected = f" (it held {fb(held.bytes)})" if held is not None and held.bytes else ""
        print(
            f"gpumem: released the kept traceback ({r.frames} frame(s)): freed {what}{expected}."
            " %tb and %debug no longer show that error."
        )

    def _cmd_workers(self, args: Any) -> None:
        from IPython.display import display

        from ..collectors import distributed, workers

        if args.action == "watch":
            try:
                w = distributed.watch_store(ranks=args.ranks)
            except (RuntimeError, ValueError) as e:
                raise UsageError(f"%gpumem workers watch: {e}") from None
            print(f"gpumem: reading ranks {', '.join(map(str, w.ranks))} from the group's store")
            return
        if args.action == "unwatch":
            distributed.stop_watching()
            print("gpumem: no longer reading the group's store")
            return
        if "ray" in sys.modules:  # what Ray workers sent (collectors/ray_workers.py)
            from ..collectors import ray_workers

            ray_workers.poll(workers.channel(), ray_workers.WAIT)
        live = workers.live()
        error = workers.channel().error
        if error:
            print(f"gpumem: {error}: worker processes cannot report here")
            return
        if not live:
            print(
                "gpumem: no worker process has reported. Processes forked while a measured "
                "cell runs report by themselves; a spawned one, or a Ray task or actor, calls "
                "jupyter_gpumem.report_worker(), a rank of a torch.distributed job "
                "jupyter_gpumem.report_to_store() (then `%gpumem workers watch` here)."
            )
            return
        display(bundles.workers(live), raw=True)

    def _cmd_panel(self, args: Any) -> Any:
        if args.interval < 100:
            raise UsageError("--interval must be at least 100 ms")
        from ..widget import GpuMemWidget

        return GpuMemWidget.create(self.session, interval_ms=args.interval)


def _no_gpu_for_scan() -> str | None:
    """Why a scan can't run here (it runs the user's GPU code: CUDA may start), or None."""
    t = sys.modules.get("torch")
    if t is None:
        from ..collectors import no_torch_before

        return no_torch_before("--scan", "the scan measures the GPU before each run of it")
    v = getattr(t, "version", None)
    if not (getattr(v, "cuda", None) or getattr(v, "hip", None)):
        return f"--scan needs a CUDA GPU: torch {t.__version__} is a CPU-only build"
    if not t.cuda.is_initialized() and not t.cuda.is_available():
        return "--scan needs a CUDA GPU: torch sees none"
    return None


def _signed(n: int | None) -> str:
    from ..units import format_delta

    return format_delta(n)
