"""The arguments of ``%%gpumem``: its parser (whose help is the documentation ``%%gpumem?``
shows), the rules on what goes together, and the options of a measured cell
(:class:`CellOptions`); the argument types the commands' parsers
(``command_parsers.py``) share.

For the magic (``magics.py``) and the session, which parses a cell's ``%%gpumem`` line
before the cell runs (:func:`parse_cell_line`).
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from IPython.core.error import UsageError
from IPython.core.magic_arguments import MagicArgumentParser

from ..core import actions
from ..errors import ActionRefused
from ..model import Target
from ..units import shown

if TYPE_CHECKING:
    from ..collectors import Collector


def nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise UsageError(f"not a whole number: {shown(text)}") from None
    if v < 0:
        raise UsageError(f"must not be negative: {shown(text)}")
    return v


def positive_int(text: str) -> int:
    v = nonneg_int(text)
    if v == 0:
        raise UsageError(f"must be at least 1: {shown(text)}")
    return v


class HelpFormat(argparse.HelpFormatter):
    """Help as ``%%gpumem?`` shows it: plain argparse, wide enough for the long options."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=24, width=90)


def new_parser(prog: str, description: str | None = None) -> MagicArgumentParser:
    return MagicArgumentParser(prog=prog, description=description, formatter_class=HelpFormat)


def _cell_parser() -> MagicArgumentParser:
    p = new_parser(
        "%%gpumem",
        "Runs the cell as a normal cell (Out, tracebacks and line numbers unchanged), then "
        "shows for each device it touched: allocated and reserved before -> after, the exact "
        "peak inside the cell (PyTorch's own counters, not sampling) and its height above the "
        "start, device memory used beyond PyTorch's reservation, cudaMalloc/cudaFree calls, "
        "retries, OOMs, non-releasable fragmentation, host RSS and wall time, plus hints.",
    )
    p.add_argument("-d", "--device", metavar="N", type=nonneg_int, help="report only device N")
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
    _add_planning_options(p)
    return p


def _add_planning_options(p: MagicArgumentParser) -> None:
    """The options of a cell planned before it runs: --scan, --dry-run and theirs."""
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
        help="plan without running: the cell's Python runs, its tensors are fake "
        "(PyTorch's FakeTensorMode: no device memory is used, no kernel runs; your real "
        "tensors are seen as fake copies and never changed, your names are left as they "
        "were), writes outside the process (files, torch.save, commands, `!` lines, "
        "connections) are refused with one line, and its storages are replayed through a "
        "model of PyTorch's caching allocator. The report predicts each device's peak "
        "allocated and reserved in a fresh process that ran the earlier cells: what the "
        "cell uses of the kernel's tensors (a model built before) is held from its start, "
        "with cuBLAS's workspaces and the CUDA context beside. With --fit-in: does it fit "
        "that card, by how much. Build the model inside the cell under `with "
        "torch.device('cuda')` to plan one that does not fit here. Also "
        "jupyter_gpumem.dry_run(fn, *args, fit_in=...)",
    )
    p.add_argument(
        "--count-untouched",
        action="store_true",
        help="with --dry-run: also count what the kernel holds on the device that the "
        "cell does not use (by default it is listed, not counted: a fresh process running "
        "the cell would not hold it)",
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


BREAKDOWN_ENTRIES = 1_000_000
LONG_WORD = 10_000  # characters of one argument (shlex splits it in quadratic time)


def _scan_spec(text: str) -> tuple[str, tuple[float, ...], bool]:
    from ..core.scan_values import scan_values
    from .scan_runs import check_name

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


def check_words(line: str) -> None:
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
    from ..collectors.dry_run import check_world_size
    from ..errors import GpuMemError

    try:
        return check_world_size(text)
    except GpuMemError as e:
        raise UsageError(f"--world-size: {e}") from None


def _entries(text: str) -> int:
    v = nonneg_int(text)
    if not 100 <= v <= 10_000_000:
        raise UsageError(f"--entries must be between 100 and 10000000, got {shown(v)}")
    return v


CELL_PARSER = _cell_parser()


def _identifier(name: str) -> str:
    if not name.isidentifier():
        raise UsageError(f"-o needs a Python variable name, got {name!r}")
    return name


# The paths a %%gpumem cell can take; CellOptions.mode is the one place that decides it.
CellMode = Literal["measured", "scan", "dry_run", "dry_scan"]


@dataclass(frozen=True, slots=True)
class CellOptions:
    """The options of a measured cell, parsed from its ``%%gpumem`` line (auto mode's are
    made once, in ``session.py``)."""

    device: int | None = None
    quiet: bool = False
    output: str | None = None
    keep_peak: bool = False
    compact: bool = False  # auto mode
    trace: bool = False  # record the allocator's full history for this cell
    entries: int = 20_000  # trace entries kept per device (a ring buffer)
    save: str | None = None  # write the trace as a memory_viz snapshot file
    breakdown: bool = False  # what the peak is made of
    # --scan NAME=V1,V2: (name, values, all whole numbers); the magic runs the body itself
    scan: tuple[str, tuple[float, ...], bool] | None = None
    fit_in: Target | None = None
    verify: bool = True
    dry_run: bool = False  # the magic runs the body under FakeTensorMode itself
    check: bool = False  # with dry_run: then run it for real and compare
    world_size: int = 1  # with dry_run: as rank 0 of a job of this many processes
    count_untouched: bool = False  # with dry_run: count the kernel's tensors it never used

    # The cell's path: measured (the session brackets the cell), or run by the magic
    # itself: a scan (once per value), a dry run (under FakeTensorMode), or both. Set once
    # from the options (read per cell as an attribute: no call on the cell's path).
    mode: CellMode = field(init=False, default="measured")

    def __post_init__(self) -> None:
        if self.scan is not None:
            mode: CellMode = "dry_scan" if self.dry_run else "scan"
        else:
            mode = "dry_run" if self.dry_run else "measured"
        object.__setattr__(self, "mode", mode)


def check_device(collector: Collector, device: int | None) -> None:
    """A UsageError with the reason when ``device`` is not one this kernel sees."""
    if device is None:
        return
    try:
        actions.check_device(collector, device)
    except ActionRefused as e:
        raise UsageError(str(e)) from None


# "--fit-in -1GiB": argparse takes "-1GiB" for an option ("expected one argument");
# joined as "--fit-in=-1GiB" it is the value, which parse_target refuses in words.
_NEGATIVE_SIZE = re.compile(r"--fit-in\s+(['\"]?)(-[0-9.][^\s'\"]*)\1(?=\s|$)")


def _negative_sizes_joined(line: str) -> str:
    return _NEGATIVE_SIZE.sub(r"--fit-in=\2", line)


def parse_cell_line(line: str, collector: Collector) -> CellOptions:
    """The options of a ``%%gpumem`` line (without ``%%gpumem``); a UsageError with the
    reason for a bad one, before the cell runs."""
    check_words(line)
    args = CELL_PARSER.parse_argstring(_negative_sizes_joined(line))
    check_device(collector, args.device)
    save = None
    if args.save:
        save = os.path.abspath(os.path.expanduser(args.save))
        if os.path.exists(save):
            raise UsageError(f"--save: {save} exists: choose a new file name")
        if not os.path.isdir(os.path.dirname(save)):
            raise UsageError(f"--save: no folder {os.path.dirname(save)}")
    trace = args.trace or save is not None
    _refuse_what_does_not_go_together(args, trace)
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
        count_untouched=args.count_untouched,
    )


def _refuse_what_does_not_go_together(args: argparse.Namespace, trace: bool) -> None:
    """A UsageError naming the options of a cell line that do not go together."""
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
    if args.count_untouched and not args.dry_run:
        raise UsageError("--count-untouched goes with --dry-run")
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
