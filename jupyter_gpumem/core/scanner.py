"""The largest value that fits: run a step at a few values, fit its peak, predict, verify.

Front-end free: the caller gives ``run(value)`` (runs the cell or the function once with
the value bound; returns the exception it raised, or None) and ``cleanup()`` (drops what
the run bound, so that runs do not stack). Each run is measured as ``%%gpumem`` measures a
cell (:class:`~jupyter_gpumem.core.tracker.CellTracker`: exact peak allocated and reserved);
between runs the garbage collector runs and the cache is emptied, because a run must start
from what the program holds, not from what the last run left cached. With torch, each run
also records the peak of each phase of the step (forward, backward, optimizer step, other:
``collectors/phase_peaks.py``'s :class:`PhasePeaks`), and each phase's peak is fitted on its own:
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

This module makes the runs (measured, capped, cleaned up between them); the arithmetic on
their records is in the analysis layer, testable on runs recorded on a GPU: the fit, the
prediction and the answer in words in ``analysis/scan_predict.py``, the value each
verification run tries and how verification went in words in ``analysis/scan_verify.py``.
"""

from __future__ import annotations

import gc
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..analysis.scan_predict import (
    answer,
    available_to_torch,
    fit_probes,
    local_fit,
    predict,
    show_value,
)
from ..analysis.scan_verify import next_candidate, step_up, verify_note
from ..collectors import Collector, TorchBackend
from ..collectors.torch_build import gpu_build
from ..errors import ScanStopped, is_out_of_memory
from ..model import DeviceCellReport, DeviceSample, ScanResult, ScanRun, Target
from ..model.planning import ScanPhase
from ..units import cuda_label, format_bytes
from .actions import fraction_for
from .tracker import CellTracker

MAX_VERIFY_RUNS = 3  # the run at the prediction and at most two more, up or down
KEPT_NOISE = 1 << 20  # a first run that keeps more changed what the others start from

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
        if t is not None and gpu_build(t):
            from ..collectors.phase_peaks import PhasePeaks

            return PhasePeaks(t)
    return None


@dataclass
class _State:
    runs: list[ScanRun]
    device: int | None


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
        oom = is_out_of_memory(error)
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
        available = available_to_torch(sample)
        if verify and result.predicted is not None and result.cap <= available:
            result = self._verify(result, state, integer)
        elif verify and result.predicted is not None:
            note = (
                f"not verified: this GPU has {format_bytes(available)} for PyTorch now, less "
                f"than the {format_bytes(result.cap)} the target allows"
            )
            result = _with(result, verify_note=note, runs=tuple(state.runs))
        else:
            result = _with(result, runs=tuple(state.runs))
        return _with(result, answer=answer(result, integer))

    def _sample(self, device: int) -> DeviceSample:
        m = self.collector.measure(with_process=True, full=False)
        d = m.device(device)
        if d is None or d.allocator is None or d.total is None:
            raise ScanStopped((), None, f"no allocator figures for {cuda_label(device)}")
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
        available = available_to_torch(sample)
        if target is None:
            source = "this GPU before verifying: free memory plus what PyTorch holds"
            target = Target(available, f"what {cuda_label(device)} has free now", source, False)
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
            candidate = step_up(r, local_fit(r, measured), at_lo, lo, integer)
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
                candidate = next_candidate(
                    r, local, failed, ran, at_lo, lo, hi, integer, made, run.ok
                )
        finally:
            backend.set_limit(device, previous)
            gc.collect()
            backend.empty_cache()
        runs = tuple(state.runs)
        checks = [x for x in runs if x.kind == "verify"]
        return _with(r, runs=runs, verified=lo, verify_note=verify_note(r, checks, lo, hi, integer))


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
        f"--fit-in {target.label} is no more than the {format_bytes(outside)} this process already "
        f"holds on {cuda_label(index)} outside PyTorch (CUDA context, libraries), which the scan "
        "takes from it: nothing would be left for PyTorch. --fit-in is a card's whole "
        "memory, e.g. 24GiB, 24GB or a card name (T4, A100-80GB)"
    )


def _with(r: ScanResult, **changes: object) -> ScanResult:
    from dataclasses import replace

    return replace(r, **changes)  # type: ignore[arg-type]
