"""``%%gpumem`` and the ``%gpumem`` commands: the IPython magic, which reads its line with
the parsers (``parsers.py``) and hands it on: a line command to its module in
``commands/``, a cell to the session (measured), or to ``scan_cell.py`` and
``dry_run_cell.py`` (run by the magic itself)."""

from __future__ import annotations

import sys
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, no_var_expand

from ..errors import ActionRefused
from . import dry_run_cell, scan_cell
from .command_parsers import LINE_PARSER, help_text
from .commands import COMMANDS
from .parsers import CellOptions, check_words
from .session import Session

EXPAND_CHARS = 1000  # a %gpumem line whose $name and {expr} are expanded
_RUN_MAGIC = ("run_line_magic", "run_cell_magic")
# The cells the magic runs itself, by CellOptions.mode (a measured cell is the session's)
_RUNNERS = {
    "scan": scan_cell.run,
    "dry_run": dry_run_cell.run,
    "dry_scan": dry_run_cell.scan,
}


@magics_class
class GpuMemMagics(Magics):
    def __init__(self, shell: Any, session: Session) -> None:
        super().__init__(shell)
        self.session = session

    @line_cell_magic
    @no_var_expand  # expanded by _expand: IPython's expansion is quadratic in the line
    def gpumem(self, line: str = "", cell: str | None = None) -> Any:
        line = self._expand(line)
        if cell is not None:
            return self._cell(line, cell)
        check_words(line)
        args = LINE_PARSER.parse_argstring(line)
        try:
            return COMMANDS[args.command or "now"].run(self.session, args)
        except ActionRefused as e:
            raise UsageError(str(e)) from None

    gpumem.__doc__ = help_text()

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
        opts = self.session.parse_cell_line(line)
        shell = self.shell
        assert shell is not None
        run = _RUNNERS.get(opts.mode)
        if run is not None:
            return self._show(opts, run(self.session, shell, opts, cell))
        self.session.run_nested(opts, cell)
        return None

    def _show(self, opts: CellOptions, result: Any) -> None:
        """A scan's or a dry run's result: kept in ``-o``'s name, shown unless ``-q``."""
        from IPython.display import display

        if result is None:
            return
        assert self.shell is not None
        if opts.output:
            self.shell.user_ns[opts.output] = result
        if not opts.quiet:
            display(result)  # the result shows itself
