"""``%%gpumem --scan NAME=V1,V2,... [--fit-in SIZE|GPU] [--no-verify]``: the cell's body run
once per value (``scan_runs.py``), each run measured, and the largest value that fits the
target predicted and run under a cap (``core/scanner.py``)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

if TYPE_CHECKING:
    from ..model import ScanResult
    from .parsers import CellOptions
    from .session import Session


def run(session: Session, shell: Any, opts: CellOptions, body: str) -> ScanResult | None:
    """The scan's result, kept in the session (what a failed cell needs); None when it
    stopped (the reason printed, the run's error raised). A scan that cannot start here
    raises :class:`UsageError`."""
    from ..core.scanner import Scanner, target_refusal
    from ..errors import ScanStopped
    from ..reporters.scan import stopped_text
    from .scan_runs import CellRuns

    assert opts.scan is not None
    name, values, integer = opts.scan
    why = _no_gpu_for_scan()
    if why is not None:
        # a usage error, as the other refusals below: the cell fails (Run All and
        # `jupyter-gpumem run` stop there) with this one line, no traceback
        raise UsageError(f"{why}; the cell did not run")
    refused = target_refusal(session.collector, opts.fit_in, opts.device)
    if refused is not None:
        raise UsageError(refused)
    try:
        runs = CellRuns(shell, name, body, integer)
    except SyntaxError as e:
        raise UsageError(f"--scan: the cell does not compile: {e}") from None
    scanner = Scanner(session.collector, runs.run, runs.cleanup, opts.device)
    try:
        result = scanner.scan(name, values, opts.fit_in, opts.verify, integer)
    except ScanStopped as stop:
        if not opts.quiet:
            print(stopped_text(stop.runs, str(stop), integer))
        if stop.error is not None:
            raise stop.error from None
        return None
    finally:
        runs.finish()
    result = replace(result, execution_count=shell.execution_count, code=body)
    session.scans = [*session.scans[-19:], result]
    return result


def _no_gpu_for_scan() -> str | None:
    """Why a scan can't run here (it runs the user's GPU code: CUDA may start), or None."""
    from ..collectors.torch_build import why_no_gpu

    return why_no_gpu(
        "--scan", needs="gpu", before_cell="the scan measures the GPU before each run of it"
    )
