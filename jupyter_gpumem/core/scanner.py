"""The largest value that fits: run a step at a few values, fit its peak, predict, verify.

Front-end free: the caller gives ``run(value)`` (runs the cell or the function once with
the value bound; returns the exception it raised, or None) and ``cleanup()`` (drops what
the run bound, so that runs do not stack). Each run is measured as ``%%gpumem`` measures a
cell (:class:`~jupyter_gpumem.core.tracker.CellTracker`: exact peak allocated and reserved);
between runs the garbage collector runs and the cache is emptied, because a run must start
from what the program holds, not from what the last run left cached.

The target is a size or a card (``analysis/targets.py``), from which this process's memory
outside PyTorch (CUDA context, libraries; measured here) is taken, or by default what this
GPU has for PyTorch now. The prediction keeps the fragmentation margin the probes needed
(peak reserved beyond peak allocated). Verification runs once at the prediction with
PyTorch capped at the target (``set_per_process_memory_fraction``) and, when that runs out
of memory, steps down (at most two more runs: three verification runs in all) from the fit
corrected by what the failed run showed, then by bisection aimed by the runs at both ends
of the bracket. A value is called a fit only when a run showed it: when every value tried
ran out of memory, the answer says that none was found (and ``largest`` is None).
"""

from __future__ import annotations

import gc
import math
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..analysis.fit import fit_peaks, largest_within, smaller_values
from ..collectors import Collector
from ..errors import ScanStopped
from ..model import DeviceSample, ScanResult, ScanRun, Target
from ..units import format_bytes as fb
from .actions import fraction_for
from .tracker import CellTracker

MAX_VERIFY_RUNS = 3  # the run at the prediction and at most two step-downs
KEPT_NOISE = 1 << 20  # a first run that keeps more changed what the others start from
CLOSE_ENOUGH = 0.02  # stop stepping down when the bracket is this narrow (share of hi)


@dataclass
class _State:
    runs: list[ScanRun]
    device: int | None


def is_oom(e: BaseException | None) -> bool:
    if e is None:
        return False
    if type(e).__name__ == "OutOfMemoryError":
        return True
    return isinstance(e, RuntimeError) and "out of memory" in str(e).lower()


def release(e: BaseException | None) -> None:
    """Free the frames a caught exception keeps (and the tensors in their locals)."""
    seen = 0
    while e is not None and seen < 16:
        if e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)
            e.__traceback__ = None
        e = e.__cause__ or e.__context__
        seen += 1


def describe(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def show_value(v: float, integer: bool) -> str:
    return str(int(v)) if integer else f"{v:g}"


class Scanner:
    def __init__(
        self,
        collector: Collector,
        run: Callable[[float], BaseException | None],
        cleanup: Callable[[], None],
        device: int | None = None,
    ) -> None:
        self.collector = collector
        self.tracker = CellTracker(collector)
        self._run = run
        self._cleanup = cleanup
        self.device = device
        self._start: dict[int, int] = {}  # device -> allocated before the scan

    # -- one run --------------------------------------------------------------------
    def _clean(self) -> None:
        self._cleanup()
        gc.collect()
        self.collector.backend.empty_cache()

    def _allocated(self) -> dict[int, int]:
        m = self.collector.measure(with_process=False, full=False)
        return {d.index: d.allocator.allocated for d in m.devices if d.allocator is not None}

    def _one(
        self, value: float, kind: str, cap: int | None, state: _State
    ) -> tuple[ScanRun, BaseException | None]:
        self.tracker.begin(keep_peak=False, with_process=False)
        error = self._run(value)
        report = self.tracker.end(error=error, with_process=False, hints=False)
        oom = is_oom(error)
        described = describe(error) if error is not None else None
        if oom:
            release(error)  # its frames hold the run's activations: free them now
            error = None if kind == "verify" else error
        self._clean()
        if state.device is None:
            grown = [d for d in report.devices if d.after.allocator is not None]
            grown.sort(key=lambda d: -(d.peak_above_start or 0))
            state.device = grown[0].index if grown else None
        d = report.device(state.device) if state.device is not None else None
        before = d.before.allocator if d is not None else None
        run = ScanRun(
            value=value,
            kind=kind,  # type: ignore[arg-type]
            ok=described is None,
            error=described,
            oom=oom,
            base=before.allocated if before is not None else 0,
            peak_allocated=d.peak_allocated if d is not None else None,
            peak_reserved=d.peak_reserved if d is not None else None,
            kept=self._kept(state.device),
            cap=cap,
            wall_time=report.wall_time,
            request=report.ooms[-1].requested if oom and report.ooms else None,
            fragmentation=(
                d.after.allocator.peak_inactive_split
                if d is not None and d.after.allocator is not None
                else None
            ),
        )
        state.runs.append(run)
        return run, error

    def _kept(self, device: int | None) -> int:
        """What stays allocated after a run, beyond what was there before the scan."""
        if device is None:
            return 0
        return self._allocated().get(device, 0) - self._start.get(device, 0)

    # -- the scan -------------------------------------------------------------------
    def scan(
        self,
        name: str,
        values: Sequence[float],
        target: Target | None,
        verify: bool = True,
        integer: bool = True,
    ) -> ScanResult:
        """Raises :class:`ScanStopped` when a probe run fails (it carries the result so
        far and the run's exception) or nothing can be predicted."""
        refused = target_refusal(self.collector, target, self.device)
        if refused is not None:
            raise ScanStopped((), None, refused)
        gc.collect()
        self.collector.backend.empty_cache()
        state = _State([], self.device)
        self._start = self._allocated()
        for v in values:
            run, error = self._one(v, "probe", None, state)
            if not run.ok:
                why = f"the run with {name} = {show_value(v, integer)} raised {run.error}"
                if run.oom:
                    why += ": it does not fit on this GPU even without a cap; scan smaller values"
                raise ScanStopped(state.runs, error, why)
        if state.device is None:
            raise ScanStopped(
                state.runs, None, "the runs allocated nothing on a GPU: nothing to fit"
            )
        device = state.device
        probes = list(state.runs)
        if probes[0].kept > KEPT_NOISE and len(values) > 1:
            # The first run built state that stays (optimizer state, library workspaces):
            # the others started with it. Measure the first value again, as they ran.
            run, error = self._one(values[0], "repeat", None, state)
            if not run.ok:
                raise ScanStopped(state.runs, error, f"the repeated run raised {run.error}")
            probes = fit_probes(state.runs)
        sample = self._sample(device)
        result = self._predict(name, device, probes, state.runs, target, sample, integer)
        if verify and result.predicted is not None and result.cap <= _available(sample):
            result = self._verify(result, state, integer)
        elif verify and result.predicted is not None:
            note = (
                f"not verified: this GPU has {fb(_available(sample))} for PyTorch now, less "
                f"than the {fb(result.cap)} the target allows"
            )
            result = _with(result, verify_note=note, runs=tuple(state.runs))
        else:
            result = _with(result, runs=tuple(state.runs))
        return _with(result, answer=_answer(result, integer))

    def _sample(self, device: int) -> DeviceSample:
        m = self.collector.measure(with_process=True, full=False)
        d = m.device(device)
        if d is None or d.allocator is None or d.total is None:
            raise ScanStopped((), None, f"no allocator figures for cuda:{device}")
        return d

    def _predict(
        self,
        name: str,
        device: int,
        probes: list[ScanRun],
        runs: list[ScanRun],
        target: Target | None,
        sample: DeviceSample,
        integer: bool,
    ) -> ScanResult:
        outside = sample.outside_torch or 0
        available = _available(sample)
        if target is None:
            source = "this GPU before verifying: free memory plus what PyTorch holds"
            target = Target(available, f"what cuda:{device} has free now", source, False)
            cap = available
        else:
            cap = target.bytes - outside
        return predict(name, device, probes, runs, target, cap, outside, integer)

    def _verify(self, r: ScanResult, state: _State, integer: bool) -> ScanResult:
        device = r.device
        backend = self.collector.backend
        before = self.collector.measure(with_process=False, full=False).device(device)
        previous = before.limit.fraction if before is not None and before.limit else 1.0
        total = before.total if before is not None and before.total else None
        if total is None or r.cap <= 0:
            return _with(r, verify_note="not verified: the device total is unknown")
        assert r.predicted is not None and r.fit is not None
        # Known to fit under the cap: a probe that never reserved more than it.
        fits = [p.value for p in r.probes if p.ok and (p.peak_reserved or 0) <= r.cap]
        lo = max(fits) if fits else None
        lo_run = False
        ran: ScanRun | None = None  # the verification run at lo
        hi: float | None = None
        candidate: float | None = r.predicted
        made = 0  # verification runs so far
        failed: ScanRun | None = None
        try:
            backend.set_limit(device, fraction_for(min(r.cap, total), total))
            while candidate is not None:
                run, error = self._one(candidate, "verify", r.cap, state)
                made += 1
                if error is not None:  # not an OOM: the user's code broke
                    raise ScanStopped(state.runs, error, f"the verification run raised {run.error}")
                if run.ok:
                    if lo is None or candidate > lo:
                        lo, lo_run, ran = candidate, True, run
                    if hi is None:
                        break  # the prediction itself runs
                else:
                    hi, failed = candidate, run
                if made >= MAX_VERIFY_RUNS or hi is None:
                    break
                assert failed is not None
                candidate = _next_candidate(r, failed, ran, lo, hi, integer, made, not run.ok)
        finally:
            backend.set_limit(device, previous)
            gc.collect()
            backend.empty_cache()
        runs = tuple(state.runs)
        v = r.predicted
        if hi is None:
            note = f"verified: {show_value(v, integer)} ran under the {fb(r.cap)} cap"
            return _with(r, runs=runs, verified=v, verify_note=note)
        if lo is None:
            tried = sorted({x.value for x in runs if x.kind == "verify"}, reverse=True)
            note = (
                f"verification found no value that fits: "
                f"{', '.join(show_value(x, integer) for x in tried)} ran out of memory under "
                f"the {fb(r.cap)} cap, and no probe stayed under it"
            )
            return _with(r, runs=runs, verify_note=note)
        how = "ran under the cap" if lo_run else "its probe run stayed under the cap"
        miss = (v - lo) / lo * 100 if lo else 0.0
        note = (
            f"the prediction {show_value(v, integer)} ran out of memory under the cap; "
            f"{show_value(lo, integer)} {how} (the prediction was {miss:.1f} % too high)"
        )
        return _with(r, runs=runs, verified=lo, verify_note=note)


def target_refusal(collector: Collector, target: Target | None, device: int | None) -> str | None:
    """Why a card-sized target can't be met before anything runs: it is no larger than
    what this process already holds outside PyTorch (CUDA context, libraries), which the
    scan takes from it. Known only once CUDA has started here (nothing is started to know
    it): None otherwise, and when the target leaves PyTorch something on some device."""
    if target is None or not target.whole_card or not collector.backend.cuda_ready():
        return None
    m = collector.measure(with_process=True, full=False)
    held = [
        (d.outside_torch, d.index)
        for d in m.devices
        if (device is None or d.index == device) and d.outside_torch is not None
    ]
    if not held or any(target.bytes > outside for outside, _ in held):
        return None
    outside, index = min(held)
    return (
        f"--fit-in {target.label} is no more than the {fb(outside)} this process already "
        f"holds on cuda:{index} outside PyTorch (CUDA context, libraries), which the scan "
        "takes from it: nothing would be left for PyTorch. --fit-in is a card's whole "
        "memory, e.g. 24GiB, 24GB or a card name (T4, A100-80GB)"
    )


def fit_probes(runs: Sequence[ScanRun]) -> list[ScanRun]:
    """The probe runs the fit uses: the first one replaced by its repeat when there is one
    (the first run built state that stays, which the others started with)."""
    probes = [r for r in runs if r.kind == "probe"]
    repeats = [r for r in runs if r.kind == "repeat"]
    return [repeats[-1], *probes[1:]] if repeats and probes else probes


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
    Unverified: plain records in (a scan's, or runs recorded on a GPU), a result out."""
    margin = max((r.margin or 0) for r in probes)
    budget = cap - margin
    xs = [r.value for r in probes]
    ys = [r.peak_allocated or 0 for r in probes]
    fit = fit_peaks(xs, ys) if len(set(xs)) >= 2 else None
    predicted = largest_within(fit, budget, integer) if fit is not None else None
    notes = []
    base = max(r.base for r in probes)
    above = max(ys) - base
    if above > 0 and max(ys) - min(ys) < 0.1 * above:
        notes.append(
            f"the peak grows little over these values ({fb(max(ys) - min(ys))} from "
            f"{show_value(min(xs), integer)} to {show_value(max(xs), integer)}, of "
            f"{fb(above)} above the start): another part of the step (often the "
            f"optimizer step) peaks there, and larger {name} peak elsewhere; scan values "
            "where the peak grows"
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


def _available(d: DeviceSample) -> int:
    """What PyTorch could hold on this device now: free memory plus its own reservation."""
    total = d.total or 0
    used = d.device_used or 0
    reserved = d.allocator.reserved if d.allocator is not None else 0
    return total - used + reserved


def _wasted(r: ScanResult, failed: ScanRun) -> int:
    """The part of the cap a run that ran out of memory could not use: the cap minus what
    it had allocated and the request that failed."""
    if failed.peak_allocated is None:
        return 0
    return r.cap - failed.peak_allocated - (failed.request or 0)


def _between(
    r: ScanResult, ran: ScanRun, failed: ScanRun, lo: float, hi: float, integer: bool
) -> float | None:
    """Where the bracket's answer likely is: the largest v in (lo, hi) whose peak (the fit,
    corrected by what the run at lo measured) plus a margin interpolated between the one
    the run at lo needed and the one the failed run at hi could not use stays under the
    cap. None when the runs lack the figures."""
    fit = r.fit
    if fit is None or ran.peak_allocated is None or ran.margin is None:
        return None
    error = ran.peak_allocated - fit(lo)
    m_lo, m_hi = ran.margin, max(ran.margin, _wasted(r, failed))

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


def _next_candidate(
    r: ScanResult,
    failed: ScanRun,
    ran: ScanRun | None,
    lo: float | None,
    hi: float,
    integer: bool,
    step: int,
    after_failure: bool,
) -> float | None:
    """The next value to try. After a failure: from the fit again, with the margin the
    failed run showed (:func:`_wasted`) and a cut that grows (2, 6 % of the budget). After
    a success (or when that lands outside the bracket): bisection, the point moved toward
    where the runs at both ends place the answer (:func:`_between`) but kept within the
    bracket's middle half, so that each run still narrows it by a quarter at least."""
    low = lo if lo is not None else 0.0
    if integer and hi - low <= 1:
        return None
    if hi > 0 and (hi - low) / hi <= CLOSE_ENOUGH and lo is not None:
        return None
    if after_failure and r.fit is not None:
        margin = max(r.margin, _wasted(r, failed))
        cut = 0.02 * 3 ** (step - 1) * r.budget
        candidate = largest_within(r.fit, r.cap - margin - cut, integer)
        if candidate is not None and low < candidate < hi:
            return candidate
    middle = (low + hi) / 2
    if not after_failure and ran is not None and lo is not None:
        estimate = _between(r, ran, failed, lo, hi, integer)
        if estimate is not None:
            quarter = (hi - lo) / 4
            middle = min(max(estimate, lo + quarter), hi - quarter)
    middle = float(math.floor(middle)) if integer else middle
    return middle if low < middle < hi else None


def _with(r: ScanResult, **changes: object) -> ScanResult:
    from dataclasses import replace

    return replace(r, **changes)  # type: ignore[arg-type]


def _answer(r: ScanResult, integer: bool) -> str:
    where = r.target.label
    if r.fit is None:
        return f"no fit: {r.name} needs two different values"
    if r.predicted is None:
        if r.fit.b <= 0 and r.fit.c <= 0:
            return f"the peak does not grow with {r.name}: any {r.name} the probes used fits"
        return f"no {r.name} fits in {where}: even the smallest needs more than {fb(r.budget)}"
    p = show_value(r.predicted, integer)
    failed = r.smallest_failed
    if r.verify_failed and failed is not None:
        # Every value tried ran out of memory under the cap: nothing is called a fit.
        said = (
            f"no {r.name} found that fits in {where}: every value tried ran out of memory "
            f"under the {fb(r.cap)} cap, down to {show_value(failed, integer)} (the "
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
