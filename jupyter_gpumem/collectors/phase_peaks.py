"""The allocator's peaks in each phase of a training step, for ``%%gpumem --scan``'s runs.

:class:`PhasePeaks` marks the phases of a step (forward, backward, optimizer step, other)
from torch's global module and optimizer hooks and reads the allocator's peaks at each
mark; ``--breakdown``'s far heavier recorder is ``step.py``. The hooks and the phases are
``phases.py``'s :class:`~jupyter_gpumem.collectors.phases.PhaseTracker`, shared with that
recorder and the dry run's breakdown; reading and resetting the peaks is here. torch is
never imported here: the caller passes the module the user imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .allocator import cuda_counters
from .phases import Phase, PhaseTracker


class PhasePeaks:
    """The allocator's peaks in each phase of a step, for ``%%gpumem --scan``'s runs (the
    phase that makes a step's peak can change with the scanned value: the optimizer step
    at small batches, the backward pass at larger ones).

    Far cheaper than ``--breakdown``: no saved-tensor hooks, no allocator trace. The phase
    marks come from global module forward hooks (the outermost module call: forward), a
    pre-hook on the autograd nodes of that call's outputs (the backward pass reaches them:
    backward; a callback queued on the engine marks its end) and the global optimizer step
    hooks (optimizer step); everything else is "other". At each mark the peaks of the
    phase that ends are read (``_cuda_memoryStats``, ~12 us a device) and reset, so that
    each phase's peak is its own; a phase's peak is the largest over its stretches, and
    the run's peaks are the largest of its phases'. Installed for a scan's runs only: a
    ``%%gpumem`` cell without ``--scan`` pays nothing. Tests pass ``devices``, ``read``
    (device -> peak allocated, peak reserved, peak inactive split) and ``reset``.
    """

    def __init__(
        self,
        t: Any,
        devices: Callable[[], list[int]] | None = None,
        read: Callable[[int], tuple[int, int, int]] | None = None,
        reset: Callable[[int], None] | None = None,
    ) -> None:
        self.t = t
        if devices is None:
            devices = cuda_counters(t)[0]
        if read is None:
            stats = t._C._cuda_memoryStats

            def read(device: int) -> tuple[int, int, int]:
                s = stats(device)
                return (
                    int(s["allocated_bytes"]["all"]["peak"]),
                    int(s["reserved_bytes"]["all"]["peak"]),
                    int(s["inactive_split_bytes"]["all"]["peak"]),
                )

        if reset is None:
            reset = t._C._cuda_resetPeakMemoryStats
        self._devices = devices
        self._read = read
        self._reset = reset
        self._phase = "other"  # the phase running
        self._phases = PhaseTracker(t, self._begins, outputs=True)
        # device -> phase -> (peak allocated, peak reserved, peak inactive split)
        self.peaks: dict[int, dict[str, tuple[int, int, int]]] = {}

    @property
    def active(self) -> bool:
        return self._phases.active

    def _mark(self, phase: str, reset: bool = True) -> None:
        """The phase that was running ends here: keep its peaks, reset them, go on."""
        ended = self._phase
        for d in self._devices():
            try:
                a, r, f = self._read(d)
                if reset:
                    self._reset(d)
            except Exception:  # a reading must never break the user's step
                continue
            seen = self.peaks.setdefault(d, {})
            old = seen.get(ended)
            if old is not None:
                a, r, f = max(old[0], a), max(old[1], r), max(old[2], f)
            seen[ended] = (a, r, f)
        self._phase = phase

    def _begins(self, phase: Phase) -> None:
        self._mark("other" if phase == "backward done" else phase)

    def start(self) -> None:
        self.peaks = {}
        self._phase = "other"
        self._phases.start()

    def stop(self) -> dict[int, dict[str, tuple[int, int, int]]]:
        """Remove the hooks; the peaks of each phase, by device. Safe to call twice."""
        if self.active:
            try:
                self._mark("other", reset=False)  # the last stretch
            finally:
                self._phases.stop()
        return self.peaks
