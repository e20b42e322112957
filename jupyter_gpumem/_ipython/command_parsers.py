"""The arguments of the ``%gpumem`` line commands: one parser with a sub-parser per command
(whose help is the documentation ``%%gpumem?`` shows, with the cell magic's), for the
magic (``magics.py``) and the commands (``commands/``)."""

from __future__ import annotations

import argparse

from IPython.core.error import UsageError
from IPython.core.magic_arguments import MagicArgumentParser

from ..units import shown
from .parsers import CELL_PARSER, HelpFormat, new_parser, nonneg_int, positive_int

# `%gpumem segments` draws this many of the largest segments (as the panel does): a map of
# thousands of 2 MiB segments is unreadable, and drawing them costs ~60 ms a thousand.
SEGMENTS_DRAWN = 200


MAX_RANK = 65535  # of a job of at most 65536 processes (as --world-size)


def _ranks(text: str) -> list[int]:
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and len(p) <= 5 and int(p) <= MAX_RANK for p in parts):
        raise UsageError(
            f"--ranks: expected ranks like 1,2,3 (each 0 to {MAX_RANK}), got {shown(text)}"
        )
    return [int(p) for p in parts]


def _line_parser() -> MagicArgumentParser:
    p = new_parser("%gpumem", "With no command: now, a table per device.")
    p.add_argument("-d", "--device", metavar="N", type=nonneg_int, help="only device N")
    sub = p.add_subparsers(dest="command", parser_class=MagicArgumentParser, metavar="COMMAND")
    _add_session_commands(sub)
    _add_holder_commands(sub)
    _add_process_commands(sub)
    return p


def _command(
    sub: argparse._SubParsersAction[MagicArgumentParser], name: str, text: str
) -> MagicArgumentParser:
    c: MagicArgumentParser = sub.add_parser(
        name, help=text.split(":")[0].split(".")[0], description=text, formatter_class=HelpFormat
    )
    return c


def _device(c: MagicArgumentParser) -> None:
    c.add_argument(
        "-d", "--device", metavar="N", dest="sub_device", type=nonneg_int, help="only device N"
    )


def _on_off(c: MagicArgumentParser) -> None:
    c.add_argument("state", choices=["on", "off"], metavar="on|off")


def _add_session_commands(sub: argparse._SubParsersAction[MagicArgumentParser]) -> None:
    """auto, history and the allocator's switches: empty-cache, caching, limit, reset-peak."""
    a = _command(sub, "auto", "a one-line report after every cell")
    _on_off(a)
    a.add_argument(
        "--breakdown",
        action="store_true",
        help="with on: every cell also gets --breakdown (what its peak is made of, by "
        "category and module), at the cost of --breakdown in each cell",
    )
    h = _command(
        sub,
        "history",
        "one row per measured cell (also jupyter_gpumem.history() -> pandas DataFrame)",
    )
    h.add_argument("-n", metavar="N", type=nonneg_int, help="only the last N cells")
    h.add_argument("--csv", metavar="PATH", help="write the rows to a new CSV file")
    h.add_argument("--clear", action="store_true", help="forget all rows")
    h.add_argument(
        "--plot", action="store_true", help="draw allocated, reserved and the peak after each cell"
    )
    h.add_argument(
        "--diff",
        metavar="FILE",
        help="compare the cells this kernel measured with a run saved by `jupyter-gpumem run "
        "--save FILE`, matched by their code (each cell's latest run): what grew past the "
        "tolerance, and why",
    )
    h.add_argument(
        "--tolerance",
        metavar="TOL",
        help="with --diff: how much an exact figure may grow, 1%% (of the saved figure), "
        "64MiB, or the larger of both, 1%%,64MiB (default 1%%)",
    )
    _device(h)
    _command(sub, "empty-cache", "gc.collect() + torch.cuda.empty_cache(); the bytes released")
    _on_off(_command(sub, "caching", "switch the caching allocator off and on (torch >= 2.6)"))
    lim = _command(
        sub,
        "limit",
        "cap PyTorch's memory on a device (set_per_process_memory_fraction), to try a smaller GPU",
    )
    lim.add_argument(
        "spec",
        metavar="24GiB|0.3|off",
        help="a size (24GiB, 24GB), a fraction of the device, or off",
    )
    _device(lim)
    _device(_command(sub, "reset-peak", "reset PyTorch's peak counters"))


def _add_holder_commands(sub: argparse._SubParsersAction[MagicArgumentParser]) -> None:
    """Who holds the memory: who, segments, track, release-traceback, free."""
    w = _command(
        sub,
        "who",
        "who holds the live GPU memory: the names in your namespace (tensors, "
        "modules, optimizers, containers, Out[N], autograd graphs, the kept traceback), "
        "the lines that allocated it, or the cells; rows add up to `allocated` (also "
        "jupyter_gpumem.who())",
    )
    _device(w)
    w.add_argument(
        "-n", metavar="N", type=positive_int, default=20, help="rows per device (default 20)"
    )
    w.add_argument(
        "--by",
        choices=["variable", "line", "cell"],
        default="variable",
        metavar="variable|line|cell",
        help="group by (default variable)",
    )
    sg = _command(
        sub,
        "segments",
        "every segment the allocator holds and its blocks, to scale: "
        "allocated, cached free, free pieces (fragmentation), the largest free block",
    )
    _device(sg)
    sg.add_argument(
        "--max",
        metavar="N",
        dest="max_segments",
        type=positive_int,
        default=SEGMENTS_DRAWN,
        help=f"draw the N largest segments (default {SEGMENTS_DRAWN}; the summary counts all)",
    )
    sg.add_argument("--all", action="store_true", help="draw every segment")
    sg.add_argument(
        "--rank",
        metavar="N",
        type=nonneg_int,
        help="the map of worker process rank N instead (asked for its snapshot; it has 2 s "
        "to answer); of several live ones, the most recently started",
    )
    sg.add_argument(
        "--pid",
        metavar="PID",
        type=positive_int,
        help="the map of the worker process PID instead (see `%%gpumem workers`)",
    )
    _on_off(
        _command(
            sub,
            "track",
            "record where each live block is allocated (PyTorch's allocator "
            "history, stacks of live blocks only)",
        )
    )
    _command(sub, "release-traceback", "drop the frames the last error's traceback keeps alive")
    fr = _command(
        sub,
        "free",
        "get the memory of the named objects back without a restart: everything that keeps "
        "it alive is let go (the names and their aliases, Out[N] and _, the kept traceback, "
        "optimizers over its parameters, autograd graphs hanging from other names, hooks, "
        "closures, accelerate's and vLLM's own references), then gc.collect() and "
        "empty_cache(); says what it let go, what should come back, what came back to the "
        "driver (cudaMemGetInfo) and what still holds the rest (also jupyter_gpumem.free())",
    )
    fr.add_argument("names", nargs="+", metavar="NAME", help="a variable, Out[N] or _")
    fr.add_argument("--dry", action="store_true", help="only show what it would let go")


def _add_process_commands(sub: argparse._SubParsersAction[MagicArgumentParser]) -> None:
    """Other processes and other front ends: workers, panel."""
    wk = _command(
        sub,
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
    pn = _command(sub, "panel", "live bars and buttons as an ipywidgets widget (any frontend)")
    pn.add_argument(
        "--interval",
        metavar="MS",
        type=nonneg_int,
        default=500,
        help="milliseconds between updates (>= 100; default 500)",
    )


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


def help_text() -> str:
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


def device_of(args: argparse.Namespace) -> int | None:
    """The device a command was given: its own ``-d N``, else the one before the command."""
    return args.sub_device if args.sub_device is not None else args.device
