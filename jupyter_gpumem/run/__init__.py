"""``jupyter-gpumem run``: run a notebook headless and check GPU memory budgets (for CI).

Layers: ``budgets`` (parse and check budget expressions, plain records), ``execute`` (run
the notebook through nbclient and ask the kernel for each cell's figures), ``verdict``
(budgets -> exit code), ``report`` (progress line, table, JSON, HTML, notebook metadata)
and ``cli`` (arguments, files, exit codes). The kernel side stays the source of the
numbers. See ``docs/run.md``.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from .cli import main as _main

    return _main(argv)


__all__ = ["main"]
