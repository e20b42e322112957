"""``%%gpumem --dry-run [--fit-in CARD|SIZE] [--check] [--world-size N]``: the cell planned
without running on the GPU (with ``--world-size``, as rank 0 of a job of N processes), and
with ``--check`` run for real afterwards, when it fits here, to put the measured peaks
beside the predicted ones."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from ..model import DryRun, DryRunCheck, DryScan
from .cell_source import CellSource

if TYPE_CHECKING:
    from .session import CellOptions, Session


def here(session: Session, device: int) -> tuple[int, str] | None:
    """What this process holds beside PyTorch on ``device``, measured, when it has a
    context there (a dry run never creates one)."""
    d = session.collector.measure().device(device)
    if d is None or not d.initialized or d.outside_torch is None:
        return None
    return d.outside_torch, d.name


def why_not(opts: CellOptions) -> str | None:
    from ..collectors.torch_build import why_no_gpu

    why = why_no_gpu("--dry-run", before_cell="the dry run sets torch's fake tensors up first")
    if why is not None:
        return why
    if opts.world_size > 1:
        from ..collectors.dry_run import refusal

        return refusal(opts.world_size)
    return None


def check(session: Session, shell: Any, result: DryRun, body: str, device: int) -> DryRun:
    """Run the cell for real when the prediction fits this GPU now, and measure its peaks
    above the cell's start."""
    if result.stopped is not None:
        return replace(result, checks=(DryRunCheck(device, 0, 0, False, "the dry run stopped"),))
    m = session.collector.measure()
    d = m.device(device)
    # the real run here needs what the cell adds: the kernel already holds what it uses
    need = result.need - result.held if result.need is not None else None
    if d is None or d.total is None or d.device_used is None or need is None:
        note = "no figures for this GPU"
        return replace(result, checks=(DryRunCheck(device, 0, 0, False, note),))
    a = d.allocator
    cached = (a.reserved - a.allocated) if a is not None else 0
    room = d.total - d.device_used + cached
    if need > room:
        from ..units import format_bytes

        note = f"it needs {format_bytes(need)}, this GPU has {format_bytes(room)} for it now"
        return replace(result, checks=(DryRunCheck(device, 0, 0, False, note),))
    return measured(session, shell, result, body, device)


def measured(session: Session, shell: Any, result: DryRun, body: str, device: int) -> DryRun:
    """Run the cell for real as ``%%gpumem --breakdown`` measures it (quietly; the run goes
    into the history like any measured cell): its peaks above the cell's start and what
    the peak was made of, beside the prediction."""
    from .session import CellOptions

    opts = CellOptions(device=device, quiet=True, breakdown=True)
    outcome, report = session.run_nested(opts, body)
    failed = outcome.error_in_exec or outcome.error_before_exec
    d = None
    if report is not None:
        d = next((x for x in report.devices if x.index == device), None)
    if report is None or d is None or d.peak_allocated is None or d.peak_reserved is None:
        return replace(result, checks=(DryRunCheck(device, 0, 0, False, "no figures"),))
    b = d.before.allocator
    breakdown = next((x for x in report.breakdowns if x.device == device), None)
    c = DryRunCheck(
        device,
        d.peak_allocated - (b.allocated if b is not None else 0),
        d.peak_reserved - (b.reserved if b is not None else 0),
        failed is None,
        "" if failed is None else f"the real run raised {type(failed).__name__}",
        breakdown,
    )
    return replace(result, checks=(c,))


class Progress:
    """A dry run that runs long shows how it goes in one line that it updates (IPython's
    display with an id): seconds, ops seen, the line it is at; at the end, how long it took.
    Nothing is shown for a run under 2 s."""

    def __init__(self) -> None:
        self.handle: Any = None

    def show(self, ops: int, where: str | None, seconds: float, label: str = "") -> None:
        at = f", at {where}" if where else ""
        what = f" {label}" if label else ""
        self._put(f"gpumem: dry run{what}: {seconds:.0f} s, {ops:,} ops so far{at}")

    def scan(self, label: str, ops: int, where: str | None, seconds: float) -> None:
        self.show(ops, where, seconds, label)

    def _put(self, text: str) -> None:
        from IPython.display import display

        bundle = {"text/plain": text}
        if self.handle is None:
            self.handle = display(bundle, raw=True, display_id=True)
        else:
            self.handle.update(bundle, raw=True)

    def done(self, seconds: float) -> None:
        if self.handle is not None:
            self._put(f"gpumem: dry run done in {seconds:.1f} s")


def run(session: Session, shell: Any, opts: CellOptions, body: str) -> DryRun | None:
    """The magic's body; a UsageError with the reason when it cannot start."""
    from ..core.dry_run import dry_run

    why = why_not(opts)
    if why is not None:
        # a usage error, as a scan's: the cell fails (Run All and `jupyter-gpumem run`
        # stop there) with this one line, no traceback
        raise UsageError(f"{why}; the cell did not run")
    device = opts.device or 0
    progress = Progress()
    result = dry_run(
        cell=CellSource(shell, body, first_line=2),
        target=opts.fit_in,
        here=here(session, device),
        world_size=opts.world_size,
        count_untouched=opts.count_untouched,
        progress=progress.show,
    )
    progress.done(result.seconds)
    if opts.check:
        result = check(session, shell, result, body, device)
    return result


def scan(session: Session, shell: Any, opts: CellOptions, body: str) -> DryScan | None:
    """``--scan NAME=... --dry-run --fit-in TARGET``: None when it could not start."""
    from ..core.dry_scan import dry_scan

    why = why_not(opts)
    if why is not None:
        # a usage error, as a scan's: the cell fails (Run All and `jupyter-gpumem run`
        # stop there) with this one line, no traceback
        raise UsageError(f"{why}; the cell did not run")
    assert opts.scan is not None
    name, values, integer = opts.scan
    progress = Progress()
    result = dry_scan(
        CellSource(shell, body, first_line=2),
        name,
        values,
        integer,
        opts.fit_in,
        here(session, opts.device or 0),
        world_size=opts.world_size,
        count_untouched=opts.count_untouched,
        progress=progress.scan,
    )
    progress.done(result.seconds)
    return result
