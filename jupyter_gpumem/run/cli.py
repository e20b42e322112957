"""``jupyter-gpumem run NOTEBOOK``: run a notebook headless and check GPU memory budgets,
or compare it with a saved run (``--baseline``); ``jupyter-gpumem diff`` (``diff_cli``)
and ``jupyter-gpumem demo`` (``demo``).

Exit codes: 0 every budget held; 1 a budget failed (or, with ``--fits``, a cell ran out of
memory; or, with ``--baseline``, a figure grew past the tolerance); 2 usage errors and
notebooks that fail to run. Details: ``docs/run.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from .._version import __version__
from ..errors import CliUsageError
from .diff_cli import DESCRIPTION as DIFF_DESCRIPTION
from .diff_cli import EPILOG as DIFF_EPILOG
from .diff_cli import add_arguments as add_diff_arguments
from .diff_cli import add_tolerance

PROG = "jupyter-gpumem"
USAGE_ERROR = 2

DESCRIPTION = """\
Run a notebook headless (through nbclient, with jupyter-gpumem in auto mode) and check
what each cell does to PyTorch GPU memory.

Exit codes: 0 every budget held (or none was given); 1 a budget failed, or with --fits a
cell ran out of GPU memory, or with --baseline a figure grew past the tolerance; 2 usage
errors, a notebook that fails to run (a cell raised, the kernel died) and budgets given
where the kernel has no GPU figures.
"""

RUN_EPILOG = """\
budgets:
  METRIC<=SIZE or METRIC<SIZE, METRIC one of
    peak       the cell's exact peak of allocated memory
    kept       allocated after the cell minus before (negative when it freed)
    allocated  allocated after the cell
    reserved   reserved (cached by PyTorch) after the cell
  SIZE: 20GiB, 512MiB (powers of 1024), 24GB, 500MB (powers of 1000), 0.
  --budget applies to every measured cell, on every device (so peak<=20GiB is also the
  whole run's peak). A cell's own budgets go in its tags: 'gpumem: peak<=4GiB' (several
  tags, or ';' between budgets); a tag's metric replaces --budget's for that cell.

comparing runs:
  --save FILE writes the run document with what a comparison needs (each cell's code, peak
  reserved, the lines that allocated what it kept, its --breakdown); --baseline FILE
  compares this run with a saved one, cell by cell, and fails (exit 1) when a figure grew
  past --tolerance; `jupyter-gpumem diff A.json B.json` compares two saved runs.

examples:
  jupyter-gpumem run train.ipynb --budget 'peak<=20GiB' --budget 'kept<=1GiB'
  jupyter-gpumem run train.ipynb --fits 23GiB --json gpumem.json --html gpumem.html
  jupyter-gpumem run train.ipynb --save base.json --repeat 3
  jupyter-gpumem run train.ipynb --baseline base.json --tolerance 1% --markdown diff.md
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    run = sub.add_parser(
        "run",
        help="run a notebook and check its GPU memory budgets",
        description=DESCRIPTION,
        epilog=RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("notebook", metavar="NOTEBOOK.ipynb", help="the notebook to run")
    run.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="EXPR",
        help="a budget every measured cell must hold, e.g. 'peak<=20GiB' (repeatable)",
    )
    run.add_argument(
        "--fits",
        metavar="SIZE",
        help="cap what PyTorch may reserve on cuda:0 at SIZE before the first cell; a cell "
        "that runs out of memory under the cap fails the run (exit 1)",
    )
    run.add_argument("--json", metavar="PATH", help="write the results as JSON (docs/run.md)")
    run.add_argument("--html", metavar="PATH", help="write a self-contained HTML report")
    run.add_argument(
        "--output",
        metavar="PATH",
        help="write the executed notebook, with each cell's report and figures",
    )
    run.add_argument("--force", action="store_true", help="overwrite existing output files")
    run.add_argument(
        "--kernel", metavar="NAME", help="kernel to run it with (default: the notebook's)"
    )
    run.add_argument(
        "--timeout",
        type=_positive_int,
        metavar="SECONDS",
        help="fail (exit 2) when one cell runs longer (default: no limit)",
    )
    run.add_argument(
        "--allow-errors",
        action="store_true",
        help="keep going after a cell raises; report it instead of exit 2",
    )
    run.add_argument("-q", "--quiet", action="store_true", help="no progress lines and no table")
    compare = run.add_argument_group("comparing runs (docs/run.md)")
    compare.add_argument(
        "--save",
        metavar="PATH",
        help="write the run document (as --json) with what a comparison needs: each cell's "
        "code, peak reserved, the lines that allocated what it kept (tracking on) and its "
        "--breakdown",
    )
    compare.add_argument(
        "--baseline",
        metavar="PATH",
        help="compare this run with a saved one (--save), cell by cell; a figure that grew "
        "past the tolerance fails the run (exit 1)",
    )
    add_tolerance(compare)
    compare.add_argument(
        "--markdown",
        metavar="PATH",
        help="with --baseline: write the comparison as Markdown (a pull request comment)",
    )
    compare.add_argument(
        "--repeat",
        type=_positive_count,
        metavar="N",
        help="with --save: run the notebook N times, each in a fresh kernel, and record how "
        "far reserved figures move between runs (their spread)",
    )
    compare.add_argument(
        "--breakdown-all",
        action="store_true",
        help="with --save or --baseline: every cell gets --breakdown, so that a regression "
        "is explained by category and module in every cell, not only in cells with "
        "%%%%gpumem --breakdown (costs what --breakdown costs, in each cell)",
    )
    compare.add_argument(
        "--no-track",
        action="store_true",
        help="with --save or --baseline: leave allocation tracking off (no kept lines; "
        "tracking costs about 1 us per allocation)",
    )
    diff = sub.add_parser(
        "diff",
        help="compare two saved runs of a notebook, cell by cell",
        description=DIFF_DESCRIPTION,
        epilog=DIFF_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_diff_arguments(diff)
    demo = sub.add_parser(
        "demo",
        help="open JupyterLab on GPU memory readings recorded on an H200, replayed (no GPU needed)",
        description="Open JupyterLab with a notebook that walks through each feature, its "
        "kernel replaying GPU memory readings recorded on an NVIDIA H200: the panel, "
        "%gpumem, who holds the memory, the segment map and an out-of-memory post-mortem "
        "show themselves without a GPU, each marked as a replay.",
    )
    from ..demo import add_arguments

    add_arguments(demo)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1 second: {text!r}")
    return value


def _positive_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of runs: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 run: {text!r}")
    return value


def say(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command not in ("run", "demo", "diff"):
        parser.print_help(sys.stderr)
        return USAGE_ERROR
    try:
        if args.command == "demo":
            from ..demo import run as demo

            return demo(args, say)
        if args.command == "diff":
            from .diff_cli import run as diff

            return diff(args, say)
        return run(args)
    except CliUsageError as e:
        say(f"error: {e}")
        return USAGE_ERROR
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except Exception as e:  # the tool itself failed: a message, never a traceback
        say(f"error: {type(e).__name__}: {e}")
        return USAGE_ERROR


# -- run ----------------------------------------------------------------------------------
# The largest notebook read (outputs included); a device like /dev/zero never ends.
MAX_NOTEBOOK_BYTES = 1 << 30


def _read_notebook(path: Path) -> Any:
    import nbformat

    if not path.exists():
        raise CliUsageError(f"no such notebook: {path}")
    if path.is_dir():
        raise CliUsageError(f"{path} is a folder, not a notebook")
    if not path.is_file():
        raise CliUsageError(
            f"{path} is not a regular file (a device, FIFO or socket): give a .ipynb file"
        )
    from ..units import format_bytes

    try:
        size = path.stat().st_size
        if size > MAX_NOTEBOOK_BYTES:
            raise CliUsageError(
                f"{path} is {format_bytes(size)}: notebooks up to "
                f"{format_bytes(MAX_NOTEBOOK_BYTES)} are read (clear its outputs first)"
            )
        with open(path, "rb") as f:
            data = f.read(MAX_NOTEBOOK_BYTES + 1)  # the file may grow after the check
        if len(data) > MAX_NOTEBOOK_BYTES:
            raise CliUsageError(f"{path} grew past {format_bytes(MAX_NOTEBOOK_BYTES)} while read")
        nb = nbformat.reads(data.decode("utf-8"), as_version=4)
    except CliUsageError:
        raise
    except Exception as e:  # NotJSONError, ValidationError, OSError, UnicodeDecodeError...
        raise CliUsageError(f"cannot read {path} as a notebook: {_short(e)}") from None
    return nb


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return (text[:300] + "…") if len(text) > 300 else text or type(e).__name__


def _comparing(args: argparse.Namespace) -> tuple[Any, Any]:
    """--baseline's document and --tolerance, read before anything runs; the options that
    only go with --save or --baseline refused without them."""
    from ..analysis.run_documents import DEFAULT_TOLERANCE, parse_tolerance
    from ..core.saved_runs import load_document
    from ..errors import DiffInputError

    for option, value, needs in (
        ("--tolerance", args.tolerance, args.baseline),
        ("--markdown", args.markdown, args.baseline),
        ("--repeat", args.repeat, args.save),
        ("--no-track", args.no_track, args.save or args.baseline),
        ("--breakdown-all", args.breakdown_all, args.save or args.baseline),
    ):
        if value and not needs:
            wanted = "--save" if option == "--repeat" else "--baseline"
            if option in ("--no-track", "--breakdown-all"):
                wanted = "--save or --baseline"
            raise CliUsageError(f"{option} goes with {wanted}")
    if args.baseline is None:
        return None, None
    try:
        return load_document(args.baseline, "--baseline"), parse_tolerance(
            args.tolerance or DEFAULT_TOLERANCE
        )
    except DiffInputError as e:
        raise CliUsageError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    from ..errors import BudgetError, RunError
    from ..units import format_bytes, parse_size
    from .budgets import effective, parse_budget, tag_budgets
    from .execute import CellRun, RunResult, first_code_line, run_notebook
    from .files import check_outputs, write
    from .report import (
        annotate_notebook,
        html_report,
        json_document,
        progress_line,
        table_text,
    )
    from .verdict import apply_budgets, judge

    try:
        budgets = [parse_budget(b) for b in args.budget]
    except BudgetError as e:
        raise CliUsageError(f"--budget: {e}") from None
    fits = None
    if args.fits is not None:
        try:
            fits = parse_size(args.fits)
        except ValueError as e:
            raise CliUsageError(f"--fits: {e}") from None
    notebook = Path(args.notebook).expanduser()
    nb = _read_notebook(notebook)
    baseline, tolerance = _comparing(args)
    inputs = [notebook, *([Path(args.baseline)] if args.baseline else [])]
    kinds = ("json", "save", "html", "markdown", "output")
    outs = check_outputs(args, kinds, inputs)
    details = bool(args.save or args.baseline)
    track = details and not args.no_track

    cells: list[CellRun] = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        first = first_code_line(cell.source)
        try:
            own = tag_budgets(cell.metadata.get("tags", []))
        except BudgetError as e:
            raise CliUsageError(f"cell {i + 1} `{first[:60]}`: bad budget tag: {e}") from None
        cells.append(CellRun(i, first, effective(budgets, own), source=cell.source))

    def progress(cell: CellRun, k: int, total: int) -> None:
        if not args.quiet:
            apply_budgets([cell])
            print(progress_line(cell, k, total), file=sys.stderr, flush=True)

    setup = (
        "%load_ext jupyter_gpumem; "
        + (f"import torch; cap cuda:0 at {format_bytes(fits)} (set_limit); " if fits else "")
        + ("%gpumem track on; " if track else "")
        + "%gpumem auto on"
        + (" --breakdown" if args.breakdown_all else "")
    )
    if not args.quiet:
        kernel = args.kernel or nb.metadata.get("kernelspec", {}).get("name") or "python3"
        say(f"running {notebook} ({len(cells)} code cells) with kernel {kernel}")
    options: dict[str, Any] = {
        "kernel": args.kernel,
        "fits": fits,
        "allow_errors": args.allow_errors,
        "timeout": args.timeout,
        "detail": details,
        "track": track,
        "breakdown_all": bool(args.breakdown_all),
    }
    try:
        result = run_notebook(nb, notebook, cells, progress=progress, **options)
        again: list[RunResult] = []
        if (args.repeat or 1) > 1 and result.stopped is None:
            from .repeat import record_spreads, repeat

            again, failed = repeat(
                args.repeat,
                lambda: _read_notebook(notebook),
                notebook,
                cells,
                run_notebook,
                (lambda _: None) if args.quiet else say,
                **options,
            )
            result.notes += failed + record_spreads(result, again)
    except RunError as e:
        say(f"error: {e}")
        return USAGE_ERROR

    verdict = judge(result, budgets, fits)
    extra = (details, track, 1 + len(again) if again else 1, bool(args.breakdown_all))
    document = json_document(result, verdict, str(notebook), budgets, fits, *extra)
    diff = None
    if baseline is not None:
        from .baseline import baseline_summary, with_baseline

        diff = _compare(baseline, document, tolerance, Path(args.baseline).name)
        verdict = with_baseline(verdict, diff)
        document = json_document(result, verdict, str(notebook), budgets, fits, *extra)
        document["summary"]["baseline"] = baseline_summary(diff, str(args.baseline))
    if not args.quiet and cells:
        print(table_text(result.cells), flush=True)
    if diff is not None and not args.quiet:
        from ..reporters.run_diff import diff_text

        print("\n" + diff_text(diff, verdict=False), flush=True)
    if document.get("replay"):
        say(document["replay"]["description"])
    for w in verdict.warnings:
        say(f"warning: {w}")
    for p in verdict.problems:
        say(f"FAILED: {p}")
    failed_write = None
    try:
        for kind, path in outs.items():
            if kind in ("json", "save"):
                text = json.dumps(document, indent=2) + "\n"
            elif kind == "html":
                text = html_report(
                    result, verdict, document, _side_by_side(diff, baseline, document)
                )
            elif kind == "markdown":
                from ..reporters.run_diff import diff_markdown

                assert diff is not None
                text = diff_markdown(diff, f"GPU memory: {notebook.name}")
            else:
                import nbformat

                text = nbformat.writes(annotate_notebook(result, document, setup))
            write(path, text, args.force)
            if not args.quiet:
                say(f"wrote {path} (--{kind})")
    except OSError as e:
        failed_write = f"could not write {path} (--{kind}): {e.strerror or e}"
    word = {"pass": "OK", "fail": "FAIL", "error": "ERROR"}[verdict.result]
    say(f"{word} (exit {verdict.exit_code}): {verdict.headline}")
    if failed_write is not None:
        say(f"error: {failed_write} (exit 2)")
        return USAGE_ERROR
    return verdict.exit_code


def _compare(baseline: Any, document: dict[str, Any], tolerance: Any, name: str) -> Any:
    from ..analysis.run_diff import compare

    return compare(baseline, document, tolerance, (name, "this run"))


def _side_by_side(diff: Any, baseline: Any, document: dict[str, Any]) -> str | None:
    """The HTML report's comparison with the baseline, the runs side by side."""
    if diff is None:
        return None
    from ..reporters.run_diff_html import comparison_html

    return comparison_html(diff, baseline["cells"], document["cells"])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
