"""Where a scan's verification looks next, and how it went in words.

For :class:`~jupyter_gpumem.core.scanner.Scanner`, which runs each value under the cap:
plain records in (the scan's result so far, the runs at both ends of the bracket), a
value or a sentence out. After a run that ran, :func:`step_up` looks for a larger value
the fit leaves room for; :func:`next_candidate` chooses every later value (from the fit
again after a failure, else by bisection aimed by the runs at both ends);
:func:`verify_note` says how verification went.
"""

from __future__ import annotations

import math

from ..model import Fit, ScanResult, ScanRun
from ..units import format_bytes
from .fit import fit_peaks, largest_within
from .scan_predict import fit_probes, show_value

CLOSE_ENOUGH = 0.02  # stop stepping down when the bracket is this narrow (share of hi)
# After a run that ran, a larger value is tried only when the fit leaves room for one this
# much larger (share of the value that ran): below it, that value is already that close
# to the largest one.
STEP_UP = 0.02
HEDGE = 0.01  # aim this much below where the runs place the answer, after a step up failed


def _wasted(r: ScanResult, failed: ScanRun) -> int:
    """The part of the cap a run that ran out of memory could not use: the cap minus what
    it had allocated and the request that failed."""
    if failed.peak_allocated is None:
        return 0
    return r.cap - failed.peak_allocated - (failed.request or 0)


def _demand(r: ScanResult, failed: ScanRun) -> int | None:
    """What a run that ran out of memory asked of the cap when it failed: what the
    allocator held then (it frees its cache and retries before it gives up: what stays
    is in use or in pieces of segments in use; read before the failed run's tensors are
    freed) plus the request that failed. None when that does not exceed the cap (the
    figures do not show the failure)."""
    if failed.held is None or not failed.request:
        return None
    demand = min(failed.held, r.cap) + failed.request
    return demand if demand > r.cap else None


def _scaled_down(r: ScanResult, failed: ScanRun, integer: bool) -> float | None:
    """A run can fail before its peak, at a large request that the cached pieces can't
    hold (inference: a few activations the size of the batch): its waste at the cap then
    says little about the peak. What it held and asked for then grows with the value, as
    the rest of the step: the failed value scaled by the cap over that demand (both above
    the run's base) is where the same moment fits."""
    demand = _demand(r, failed)
    if demand is None or demand <= failed.base or r.cap <= failed.base:
        return None
    v = failed.value * (r.cap - failed.base) / (demand - failed.base)
    return float(math.floor(v)) if integer else v


def _crossing(
    r: ScanResult, ran: ScanRun | None, failed: ScanRun, lo: float, hi: float
) -> float | None:
    """Where, between a run that ran under the cap and one that failed, the excess over
    the cap (the run at lo: its peak reserved minus the cap; the failed run: its demand
    minus the cap) crosses zero, interpolated. None without the figures."""
    demand = _demand(r, failed)
    if ran is None or ran.peak_reserved is None or demand is None or hi <= lo:
        return None
    below, above = ran.peak_reserved - r.cap, demand - r.cap
    if below >= 0 or above <= 0:
        return None
    return lo + (hi - lo) * -below / (above - below)


def _between(
    r: ScanResult,
    fit: Fit | None,
    ran: ScanRun,
    failed: ScanRun,
    lo: float,
    hi: float,
    integer: bool,
) -> float | None:
    """Where the bracket's answer likely is: the largest v in (lo, hi) whose peak (the fit,
    corrected by what the run at lo measured) plus a margin stays under the cap. The margin
    goes from what the run at lo needed to what the failed run at hi could not use (the
    allocator's waste measured at the cap; the run at lo's margin, when the cap did not
    press it, can overstate it). None when the runs lack the figures. ``fit``: :func:`local_fit`."""
    if fit is None or ran.peak_allocated is None or ran.margin is None:
        return None
    error = ran.peak_allocated - fit(lo)
    wasted = _wasted(r, failed)
    m_hi = wasted if wasted > 0 else ran.margin
    m_lo = min(ran.margin, m_hi)

    def fits(v: float) -> bool:
        margin = m_lo + (m_hi - m_lo) * (v - lo) / (hi - lo)
        return fit(v) + error + margin <= r.cap

    a, b = lo, hi  # fits(a) is taken as known (it ran); look for the last v that fits
    for _ in range(60):
        if (integer and b - a <= 1) or (not integer and b - a <= 1e-6 * hi):
            break
        mid = (a + b) / 2
        mid = float(math.floor(mid)) if integer else mid
        a, b = (mid, b) if fits(mid) else (a, mid)
    return a if a > lo else None


def _reserved_within(r: ScanResult, level: float, integer: bool) -> float | None:
    """The largest value whose peak reserved, fitted over the probes (no cap: what the
    allocator took when nothing pressed it), stays within ``level``."""
    probes = fit_probes(r.runs)
    xs = [p.value for p in probes if p.ok and p.peak_reserved is not None]
    ys = [p.peak_reserved or 0 for p in probes if p.ok and p.peak_reserved is not None]
    if len(set(xs)) < 2:
        return None
    return largest_within(fit_peaks(xs, ys), level, integer)


def step_up(
    r: ScanResult, fit: Fit | None, at_lo: ScanRun | None, lo: float, integer: bool
) -> float | None:
    """After a run that ran at ``lo``: the largest value whose fitted peak, corrected by
    what that run measured, reaches the cap with no margin at all: nothing larger can fit
    (as far as the fit knows), and the probes' margin may have overstated what the
    allocator needs near the cap. None when that leaves no room worth a run (less than
    :data:`STEP_UP` above ``lo``: ``lo`` is then that close to the largest value).
    ``fit``: :func:`local_fit`."""
    if fit is None or at_lo is None or at_lo.peak_allocated is None:
        return None
    error = at_lo.peak_allocated - fit(lo)
    up = largest_within(fit, r.cap - error, integer)
    if up is None or up <= lo or up < lo * (1 + STEP_UP):
        return None
    return up


def next_candidate(
    r: ScanResult,
    local: Fit | None,
    failed: ScanRun | None,
    ran: ScanRun | None,
    at_lo: ScanRun | None,
    lo: float | None,
    hi: float | None,
    integer: bool,
    step: int,
    last_ok: bool,
) -> float | None:
    """The next value to try. While every run ran: larger (:func:`step_up`). After a
    failure, before any verification run ran: from the fit again, with the margin the
    failed run showed (:func:`_wasted`) and a cut that grows (2, 6 % of the budget), no
    higher than the failed value scaled down by what it asked of the cap
    (:func:`_scaled_down`), and after two failures no higher than where the probes' peak
    reserved stays under the cap (:func:`_reserved_within`). With a value that ran under
    the cap and one that did not: bisection, the point moved toward where the runs at both
    ends place the answer (:func:`_between`) but kept within the bracket's middle half, so
    that each run still narrows it by a quarter at least, and below a prediction that
    failed no higher than where the runs' excess over the cap crosses it
    (:func:`_crossing`); above a prediction that ran, aimed a little below the estimate.
    Steps up and aims go by ``local`` (:func:`local_fit`), steps down by the probes' fit."""
    if hi is None:
        return step_up(r, local, at_lo, lo, integer) if lo is not None else None
    assert failed is not None
    low = lo if lo is not None else 0.0
    if integer and hi - low <= 1:
        return None
    if hi > 0 and (hi - low) / hi <= CLOSE_ENOUGH and lo is not None:
        return None
    if not last_ok and ran is None and r.fit is not None:
        margin = max(r.margin, _wasted(r, failed))
        cut = 0.02 * 3 ** (step - 1) * r.budget
        candidate = largest_within(r.fit, r.cap - margin - cut, integer)
        scaled = _scaled_down(r, failed, integer)
        if scaled is not None and low < scaled < hi:
            candidate = scaled if candidate is None else min(candidate, scaled)
        if step >= 2:
            # Twice out of memory: the allocator wastes more near the cap than the runs
            # showed (a few large blocks that the cached pieces can't hold: inference).
            # Where the probes' peak reserved, fitted, stays under the cap (less a cut),
            # the allocator never had to reach the cap at all.
            safe = _reserved_within(r, r.cap - 0.02 * r.budget, integer)
            if safe is not None and low < safe < hi:
                candidate = safe
        if candidate is not None and low < candidate < hi:
            return candidate
    middle = (low + hi) / 2
    if ran is not None and lo is not None:
        estimate = _between(r, local, ran, failed, lo, hi, integer)
        if estimate is not None and r.predicted is not None and lo >= r.predicted:
            # Above a prediction that ran, below the value where the fit leaves no margin
            # at all, which ran out of memory: its waste at the cap is the margin the
            # allocator needs there, the best figure there is. Aim a little below where
            # it places the answer (HEDGE), so that a small error still lands on a value
            # that runs; nothing when that gains little over lo.
            aim = max(estimate * (1 - HEDGE), lo * (1 + STEP_UP))
            if estimate < lo * (1 + STEP_UP):
                return None
            middle = aim
        elif estimate is not None:
            quarter = (hi - lo) / 4
            middle = min(max(estimate, lo + quarter), hi - quarter)
        if r.predicted is not None and lo < r.predicted:
            # below a prediction that failed: no higher than where the two runs' excess
            # over the cap, interpolated, crosses it (a little below)
            crossing = _crossing(r, ran, failed, lo, hi)
            if crossing is not None:
                middle = min(middle, crossing * (1 - HEDGE))
    middle = float(math.floor(middle)) if integer else middle
    return middle if low < middle < hi else None


def verify_note(
    r: ScanResult, checks: list[ScanRun], lo: float | None, hi: float | None, integer: bool
) -> str:
    """How verification went, in words."""
    assert r.predicted is not None
    v, cap = r.predicted, format_bytes(r.cap)
    shown = show_value(v, integer)
    if lo is None:
        tried = sorted({x.value for x in checks}, reverse=True)
        return (
            f"verification found no value that fits: "
            f"{', '.join(show_value(x, integer) for x in tried)} ran out of memory under "
            f"the {cap} cap, and no probe stayed under it"
        )
    ran_lo = any(x.ok and x.value == lo for x in checks)
    how = "ran under the cap" if ran_lo else "its probe run stayed under the cap"
    low = show_value(lo, integer)
    predicted_ran = any(x.ok and x.value == v for x in checks)
    if hi is None:
        if lo == v:
            return f"verified: {shown} ran under the {cap} cap"
        miss = (lo - v) / lo * 100
        said = f"verified: {low} " + (
            f"ran under the {cap} cap" if ran_lo else f"(its probe run stayed under the {cap} cap)"
        )
        if predicted_ran:
            said += f"; the prediction {shown} ran too, {miss:.1f} % below it"
        elif not any(x.value == v for x in checks):
            said += f"; the prediction was {shown}, {miss:.1f} % below it"
        return said
    big = show_value(hi, integer)
    if lo >= v:
        said = f"the prediction {shown} ran under the {cap} cap"
        if lo > v:
            miss = (lo - v) / lo * 100
            said += f"; so did {low}, and {big} ran out of memory (the prediction was "
            said += f"{miss:.1f} % low)"
        else:
            said += f"; a larger value, {big}, ran out of memory"
        return said
    miss = (v - lo) / lo * 100 if lo else 0.0
    return (
        f"the prediction {shown} ran out of memory under the cap; "
        f"{low} {how} (the prediction was {miss:.1f} % too high)"
    )
