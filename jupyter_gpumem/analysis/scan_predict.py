"""A scan's prediction from its probe runs, and its answer in words: plain records in
(a scan's runs, or runs recorded on a GPU), a :class:`~jupyter_gpumem.model.ScanResult`
out.

For :class:`~jupyter_gpumem.core.scanner.Scanner` (``%%gpumem --scan`` and
``jupyter_gpumem.scan()``), which makes the runs: :func:`predict` fits the probes' peaks
(each phase of the step on its own when the probes know their phases) and finds the
largest value within the cap; :func:`local_fit` redoes the fit where the answer is, from
the values whose peaks are known; :func:`answer` says what the scan found. Where
verification looks next is ``scan_verify.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..model import DeviceSample, Fit, ScanResult, ScanRun, Target
from ..units import format_bytes
from .fit import bind, fit_peaks, fit_phases, grows, largest_within, smaller_values


def show_value(v: float, integer: bool) -> str:
    """A scanned value as the user wrote it: ``32``, or ``0.25`` for a float scan."""
    return str(int(v)) if integer else f"{v:g}"


def fit_probes(runs: Sequence[ScanRun]) -> list[ScanRun]:
    """The probe runs the fit uses: the first one replaced by its repeat when there is one
    (the first run built state that stays, which the others started with)."""
    probes = [r for r in runs if r.kind == "probe"]
    repeats = [r for r in runs if r.kind == "repeat"]
    return [repeats[-1], *probes[1:]] if repeats and probes else probes


def phase_peaks(probes: Sequence[ScanRun]) -> dict[str, list[int]] | None:
    """Each phase's peak at every probe, when every probe knows the same two or more
    phases (else None: the whole peak is fitted)."""
    if not probes or any(not p.phases for p in probes):
        return None
    names = [ph.phase for ph in probes[0].phases]
    if len(names) < 2 or any({ph.phase for ph in p.phases} != set(names) for p in probes):
        return None
    return {n: [p.phase_peak(n) or 0 for p in probes] for n in names}


def local_fit(r: ScanResult, measured: Sequence[ScanRun]) -> Fit | None:
    """The fit redone where the answer is: through the three largest values whose peaks
    are known (the probes and the verification runs that ran under the cap; allocated
    does not depend on the cap), each phase on its own when they all know the same
    phases, two regimes read as such (:func:`~jupyter_gpumem.analysis.fit.fit_peaks`).
    A step up from a value that ran goes by it: the probes' fit can rise too fast where
    a part of the step that does not grow made the small values' peaks."""
    known: dict[float, ScanRun] = {}
    for m in measured:
        if m.ok and m.peak_allocated is not None:
            known[m.value] = m  # a later run at the same value replaces it
    near = sorted(known.values(), key=lambda m: m.value)[-3:]
    if len(near) < 2:
        return r.fit
    xs = [m.value for m in near]
    ys = [m.peak_allocated or 0 for m in near]
    phases = phase_peaks(near)
    if phases is not None:
        return fit_phases(xs, ys, phases, regimes=True)
    return fit_peaks(xs, ys, regimes=True)


def predict(
    name: str,
    device: int,
    probes: Sequence[ScanRun],
    runs: Sequence[ScanRun],
    target: Target,
    cap: int,
    outside: int,
    integer: bool,
) -> ScanResult:
    """The fit of the probes' peaks and the largest value whose fitted peak, with the
    probes' fragmentation margin, stays within ``cap`` (what PyTorch may reserve).
    When the probes know their phases, each phase's peak is fitted on its own and the
    peak is the largest of them. Unverified: plain records in (a scan's, or runs recorded
    on a GPU), a result out."""
    margin = max((r.margin or 0) for r in probes)
    budget = cap - margin
    xs = [r.value for r in probes]
    ys = [r.peak_allocated or 0 for r in probes]
    phases = phase_peaks(probes)
    fit = None
    if len(set(xs)) >= 2:
        fit = fit_phases(xs, ys, phases) if phases is not None else fit_peaks(xs, ys)
    predicted = largest_within(fit, budget, integer) if fit is not None else None
    if fit is not None:
        fit = bind(fit, budget, integer)
    notes = []
    base = max(r.base for r in probes)
    # how much the peak grows over the values: the binding phase's, when phases are fitted
    grown = ys
    if phases is not None and fit is not None and fit.phase in phases:
        grown = phases[fit.phase]
    above = max(ys) - base
    if above > 0 and max(grown) - min(grown) < 0.1 * above:
        where = f"the {fit.phase}'s peak" if phases is not None and fit is not None else "the peak"
        notes.append(
            f"{where} grows little over these values ({format_bytes(max(grown) - min(grown))} from "
            f"{show_value(min(xs), integer)} to {show_value(max(xs), integer)}, of "
            f"{format_bytes(above)} above the start): another part of the step (often the "
            f"optimizer step) peaks there, and larger {name} peak elsewhere; scan values "
            "where the peak grows"
        )
    if phases is not None and fit is not None and predicted is not None:
        seen = sorted({p.peak_phase for p in probes if p.peak_phase is not None})
        if seen and seen != [fit.phase]:
            at = ", ".join(
                f"{show_value(p.value, integer)}: {p.peak_phase}"
                for p in sorted(probes, key=lambda p: p.value)
            )
            notes.append(
                f"the phase that makes the peak changes with {name} (the probes peaked in "
                f"{at}); at the prediction the {fit.phase}'s peak binds: each phase's peak "
                "is fitted on its own"
            )
    if predicted is not None and predicted > 8 * max(xs):
        notes.append(
            f"the prediction is {predicted / max(xs):.0f}x the largest value run: scan "
            "values closer to it for a better fit"
        )
    return ScanResult(
        name=name,
        device=device,
        runs=tuple(runs),
        target=target,
        outside_torch=outside,
        cap=cap,
        margin=margin,
        budget=budget,
        fit=fit,
        predicted=predicted,
        verified=None,
        verify_note="not verified (--no-verify)" if fit is not None else "",
        answer="",
        integer=integer,
        notes=tuple(notes),
    )


def available_to_torch(d: DeviceSample) -> int:
    """What PyTorch could hold on this device now: free memory plus its own reservation."""
    total = d.total or 0
    used = d.device_used or 0
    reserved = d.allocator.reserved if d.allocator is not None else 0
    return total - used + reserved


def answer(r: ScanResult, integer: bool) -> str:
    """What the scan found, in one sentence: the largest value that fits (verified or
    predicted), or why there is none."""
    where = r.target.label
    if r.fit is None:
        return f"no fit: {r.name} needs two different values"
    if r.predicted is None:
        if not grows(r.fit):
            return f"the peak does not grow with {r.name}: any {r.name} the probes used fits"
        return (
            f"no {r.name} fits in {where}: even the smallest needs more than "
            f"{format_bytes(r.budget)}"
        )
    p = show_value(r.predicted, integer)
    failed = r.smallest_failed
    if r.verify_failed and failed is not None:
        # Every value tried ran out of memory under the cap: nothing is called a fit.
        said = (
            f"no {r.name} found that fits in {where}: every value tried ran out of memory "
            f"under the {format_bytes(r.cap)} cap, down to {show_value(failed, integer)} (the "
            f"prediction was {p})"
        )
        smaller = smaller_values(failed, integer)
        if len(smaller) >= 2:
            values = ",".join(show_value(x, integer) for x in smaller)
            return said + f"; scan smaller values, e.g. --scan {r.name}={values}"
        if smaller:
            return said + f"; {r.name} = 1 is the only smaller value left to try"
        return said + f"; not even {r.name} = 1 fits there"
    if r.verified is not None and r.verified == r.predicted:
        return f"largest {r.name} that fits in {where}: {p} (verified)"
    if r.verified is not None:
        v = show_value(r.verified, integer)
        return f"largest {r.name} that fits in {where}: {v} (verified; predicted {p})"
    return f"largest {r.name} that fits in {where}: {p} (predicted; {r.verify_note})"
