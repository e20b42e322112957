"""``jupyter-gpumem diff BEFORE.json AFTER.json``: two saved runs of a notebook compared
cell by cell (docs/run.md). Exit codes: 0 no figure grew past what is allowed; 1 one did;
2 usage errors (a file that is not a run document, a bad tolerance) and a second run that
did not complete."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from ..analysis.run_documents import DEFAULT_TOLERANCE

DESCRIPTION = """\
Compare two runs of a notebook saved by `jupyter-gpumem run NOTEBOOK --save FILE`: cells
are matched by their code (a moved or edited cell by its content, not its place), each
figure's change is judged, and each regression comes with why (the --breakdown categories
and modules whose bytes changed, the lines that now keep more, the code that changed).

Exact figures (peak, kept, allocated: PyTorch's counters) may grow by the tolerance.
Reserved figures (reserved, peak reserved) depend on the caching allocator's history: they
may grow by their spread (measured by `run --save FILE --repeat N`, else a default) plus
the tolerance.

Exit codes: 0 no figure grew past what is allowed; 1 one did; 2 usage errors, and a second
run that did not complete.
"""

EPILOG = """\
examples:
  jupyter-gpumem diff main.json branch.json
  jupyter-gpumem diff main.json branch.json --tolerance 1%,16MiB --markdown comment.md
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("before", metavar="BEFORE.json", help="the first run (the baseline)")
    p.add_argument("after", metavar="AFTER.json", help="the second run")
    add_tolerance(p)
    p.add_argument("--markdown", metavar="PATH", help="write the comparison as Markdown")
    p.add_argument("--html", metavar="PATH", help="write the two runs side by side as HTML")
    p.add_argument("--force", action="store_true", help="overwrite existing output files")
    p.add_argument("-q", "--quiet", action="store_true", help="only the verdict line")


def add_tolerance(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--tolerance",
        metavar="TOL",
        help="how much an exact figure may grow: a share of the first run's figure (1%%), a "
        "size (64MiB), or the larger of both (1%%,64MiB); reserved figures get it on top of "
        f"their spread (default {DEFAULT_TOLERANCE.replace('%', '%%')})",
    )


def run(args: argparse.Namespace, say: Callable[[str], None]) -> int:
    from ..analysis.run_diff import compare
    from ..analysis.run_documents import parse_tolerance
    from ..core.saved_runs import load_document
    from ..errors import CliUsageError, DiffInputError
    from ..reporters.run_diff import diff_markdown, diff_text, verdict_line
    from ..reporters.run_diff_html import diff_page
    from .files import check_outputs, write

    try:
        tolerance = parse_tolerance(args.tolerance or DEFAULT_TOLERANCE)
        before = load_document(args.before)
        after = load_document(args.after)
    except DiffInputError as e:
        raise CliUsageError(str(e)) from None
    outs = check_outputs(args, ("markdown", "html"), [Path(args.before), Path(args.after)])
    names = (Path(args.before).name, Path(args.after).name)
    if names[0] == names[1]:
        names = (str(args.before), str(args.after))
    diff = compare(before, after, tolerance, names)
    if not args.quiet:
        print(diff_text(diff, verdict=False), flush=True)
    notebook = after.get("notebook") or before.get("notebook")
    title = f"GPU memory: {Path(str(notebook)).name}" if notebook else "GPU memory"
    for kind, path in outs.items():
        if kind == "markdown":
            text = diff_markdown(diff, title)
        else:
            text = diff_page(diff, before["cells"], after["cells"], title)
        try:
            write(path, text, args.force)
        except OSError as e:
            say(f"error: could not write {path} (--{kind}): {e.strerror or e}")
            return 2
        if not args.quiet:
            say(f"wrote {path} (--{kind})")
    say(verdict_line(diff))
    return diff.exit_code
