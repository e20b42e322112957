"""The largest value that fits: run a step at a few values, fit its peak, predict, verify.

Front-end free: the caller gives ``run(value)`` (runs the cell or the function once with
the value bound; returns the exception it raised, or None) and ``cleanup()`` (drops what
the run bound, so that runs do not stack). Each run is measured as ``%%gpumem`` measures a
cell (:class:`~jupyter_gpumem.core.tracker.CellTracker`: exact peak allocated and reserved);
between runs the garbage collector runs and the cache is emptied, because a run must start
from what the program holds, not from what the last run left cached. With torch, each run
also records the peak of each phase of the step (forward, backward, optimizer step, other:
``collectors/step.py``'s :class:`PhasePeaks`), and each phase's peak is fitted on its own:
the phase that makes the peak can change with the value.

The target is a size or a card (``analysis/targets.py``), from which this process's memory
outside PyTorch (CUDA context, libraries; measured here) is taken, or by default what this
GPU has for PyTorch now. The prediction keeps the fragmentation margin the probes needed
(peak reserved beyond peak allocated). Verification runs at most three times with PyTorch
capped at the target (``set_per_process_memory_fraction``): at the prediction; after a run
that ran, at a larger value when the fit, corrected by that run, leaves room for one (the
probes' margin can overstate what the allocator needs near the cap, where it frees cached
blocks and retries before it gives up); after a run out of memory, lower, from the fit
corrected by what the failed run showed; between a value that ran and one that did not, by
bisection aimed by the runs at both ends. The answer is the largest value that ran. A
value is called a fit only when a run showed it: when every value tried ran out of memory,
the answer says that none was found (and ``largest`` is None).
"""

from __future__ import annotations

import gc
import math
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..analysis.fit import bind, fit_peaks, fit_phases, grows, largest_within, smaller_values
from ..collectors import Collector, TorchBackend
from ..errors import ScanStopped
from ..model import DeviceCellReport, DeviceSample, Fit, ScanResult, ScanRun, Target
from ..model.planning import ScanPhase
from ..units import format_bytes as fb
from .actions import fraction_for
from .tracker import CellTracker

MAX_VERIFY_RUNS = 3  # the run at the prediction and at most two more, up or down
KEPT_NOISE = 1 << 20  # a first run that keeps more changed what the others start from
CLOSE_ENOUGH = 0.02  # stop stepping down when the bracket is this narrow (share of hi)
# After a run that ran, a larger value is tried only when the fit leaves room for one this
# much larger (share of the value that ran): below it, that value is already that close
# to the largest one.
STEP_UP = 0.02
HEDGE = 0.01  # aim this much below where the runs place the answer, after a step up failed

PhasePeaksByDevice = dict[int, dict[str, tuple[int, int, int]]]


class PhaseMeter(Protocol):
    """Reads the allocator's peaks in each phase of a run (``collectors/step.py``)."""

    def start(self) -> None: ...
    def stop(self) -> PhasePeaksByDevice: ...


def default_meter(collector: Collector) -> PhaseMeter | None:
    """The phase meter for this collector's backend: its own (``phase_meter()``: test and
    recorded backends), torch's hooks for a CUDA or ROCm build of torch, else None."""
    backend = collector.backend
    make = getattr(backend, "phase_meter", None)
    if callable(make):
        meter: PhaseMeter | None = make()
        return meter
    if isinstance(backend, TorchBackend):
        t = backend.torch()
        version = getattr(t, "version", None)
        if t is not None and (getattr(version, "cuda", None) or getattr(version, "hip", None)):
            from ..collectors.step import PhasePeaks

            return PhasePeaks(t)
    return None


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
        meter: PhaseMeter | str | None = "auto",
    ) -> None:
        self.collector = collector
        self.tracker = CellTracker(collector)
        self._run = run
        self._cleanup = cleanup
        self.device = device
        self._start: dict[int, int] = {}  # device -> allocated before the scan
        # the peaks of each phase of a run ("auto": torch's hooks when torch is here)
        self.meter: PhaseMeter | None = (
            default_meter(collector) if isinstance(meter, str) else meter
        )

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
        meter = self._meter_start()
        try:
            error = self._run(value)
        finally:
            peaks = self._meter_stop(meter)
        report = self.tracker.end(error=error, with_process=False, hints=False)
        oom = is_oom(error)
        described = describe(error) if error is not None else None
        if oom:
            release(error)  # its frames hold the run's activations: free them now
            error = None if kind == "verify" else error
        self._clean()

        # The meter resets the peaks at each phase mark: a run's peaks are the largest of
        # its phases' and of what the tracker read after the last mark.
        def largest(device: int, i: int, counter: int | None) -> int | None:
            seen = [v[i] for v in peaks.get(device, {}).values()]
            if counter is None:
                return None
            return max([counter, *seen])

        def rise(d: DeviceCellReport) -> int:
            start = d.before.allocator.allocated if d.before.allocator is not None else 0
            return (largest(d.index, 0, d.peak_allocated) or 0) - start

        if state.device is None:
            grown = [d for d in report.devices if d.after.allocator is not None]
            grown.sort(key=lambda d: -rise(d))
            state.device = grown[0].index if grown else None
        d = report.device(state.device) if state.device is not None else None
        before = d.before.allocator if d is not None else None
        mine = peaks.get(state.device, {}) if state.device is not None else {}
        run = ScanRun(
            value=value,
            kind=kind,  # type: ignore[arg-type]
            ok=described is None,
            error=described,
            oom=oom,
            base=before.allocated if before is not None else 0,
            peak_allocated=largest(d.index, 0, d.peak_allocated) if d is not None else None,
            peak_reserved=largest(d.index, 1, d.peak_reserved) if d is not None else None,
            kept=self._kept(state.device),
            cap=cap,
            wall_time=report.wall_time,
            request=report.ooms[-1].requested if oom and report.ooms else None,
            fragmentation=(
                largest(d.index, 2, d.after.allocator.peak_inactive_split)
                if d is not None and d.after.allocator is not None
                else None
            ),
            phases=tuple(ScanPhase(name, a, r, f) for name, (a, r, f) in mine.items()),
            held=(
                d.after.allocator.reserved
                if d is not None and d.after.allocator is not None
                else None
            ),
        )
        state.runs.append(run)
        return run, error

    def _meter_start(self) -> PhaseMeter | None:
        meter = self.meter
        if meter is None:
            return None
        try:
            meter.start()
        except Exception:  # no phases then, for this scan: the whole peak is fitted
            self.meter = None
            return None
        return meter

    def _meter_stop(self, meter: PhaseMeter | None) -> PhasePeaksByDevice:
        if meter is None:
            return {}
        try:
            return meter.stop()
        except Exception:
            self.meter = None
            return {}

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
        fits = [p for p in r.probes if p.ok and (p.peak_reserved or 0) <= r.cap]
        best = max(fits, key=lambda p: p.value) if fits else None
        lo = best.value if best is not None else None
        at_lo: ScanRun | None = best  # the run that showed lo fits (a probe or a verification)
        ran: ScanRun | None = None  # the verification run at lo
        hi: float | None = None
        failed: ScanRun | None = None  # the run at hi
        measured = [p for p in fit_probes(r.runs) if p.ok]  # the values whose peaks are known
        if lo is None or r.predicted > lo:
            candidate: float | None = r.predicted
        else:  # a probe already ran at or above the prediction: look above it
            candidate = _step_up(r, local_fit(r, measured), at_lo, lo, integer)
        made = 0  # verification runs so far
        try:
            backend.set_limit(device, fraction_for(min(r.cap, total), total))
            while candidate is not None and made < MAX_VERIFY_RUNS:
                run, error = self._one(candidate, "verify", r.cap, state)
                made += 1
                if error is not None:  # not an OOM: the user's code broke
                    raise ScanStopped(state.runs, error, f"the verification run raised {run.error}")
                if run.ok:
                    measured.append(run)
                    if lo is None or candidate > lo:
                        lo, at_lo, ran = candidate, run, run
                elif hi is None or candidate < hi:
                    hi, failed = candidate, run
                if made >= MAX_VERIFY_RUNS:
                    break
                local = local_fit(r, measured)
                candidate = _next_candidate(
                    r, local, failed, ran, at_lo, lo, hi, integer, made, run.ok
                )
        finally:
            backend.set_limit(device, previous)
            gc.collect()
            backend.empty_cache()
        runs = tuple(state.runs)
        checks = [x for x in runs if x.kind == "verify"]
        return _with(
            r, runs=runs, verified=lo, verify_note=_verify_note(r, checks, lo, hi, integer)
        )


def _verify_note(
    r: ScanResult, checks: list[ScanRun], lo: float | None, hi: float | None, integer: bool
) -> str:
    """How verification went, in words."""
    assert r.predicted is not None
    v, cap = r.predicted, fb(r.cap)
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
            f"{where} grows little over these values ({fb(max(grown) - min(grown))} from "
            f"{show_value(min(xs), integer)} to {show_value(max(xs), integer)}, of "
            f"{fb(above)} above the start): another part of the step (often the "
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


def _step_up(
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


def _next_candidate(
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
    """The next value to try. While every run ran: larger (:func:`_step_up`). After a
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
        return _step_up(r, local, at_lo, lo, integer) if lo is not None else None
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


def _with(r: ScanResult, **changes: object) -> ScanResult:
    from dataclasses import replace

    return replace(r, **changes)  # type: ignore[arg-type]


def _answer(r: ScanResult, integer: bool) -> str:
    where = r.target.label
    if r.fit is None:
        return f"no fit: {r.name} needs two different values"
    if r.predicted is None:
        if not grows(r.fit):
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
