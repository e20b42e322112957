"""The allocator's peaks in each phase of a training step, for ``%%gpumem --scan``'s runs.

:class:`PhasePeaks` marks the phases of a step (forward, backward, optimizer step, other)
from torch's global module and optimizer hooks and reads the allocator's peaks at each
mark; ``--breakdown``'s far heavier recorder is ``step.py``. torch is never imported here:
the caller passes the module the user imported.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .allocator import cuda_counters


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
        self._phase = "other"
        self._depth = 0
        self._in_backward = False
        self._thread = 0
        self._handles: list[Any] = []
        # device -> phase -> (peak allocated, peak reserved, peak inactive split)
        self.peaks: dict[int, dict[str, tuple[int, int, int]]] = {}
        self.active = False

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

    def _pre(self, module: Any, args: Any) -> None:
        if threading.get_ident() != self._thread:
            return  # recomputation in backward threads, DataParallel replicas
        if self._depth == 0 and not self._in_backward:
            self._mark("forward")
        self._depth += 1

    def _post(self, module: Any, args: Any, output: Any) -> None:
        if threading.get_ident() != self._thread or self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0 and not self._in_backward:
            self._mark("other")
            self._watch_backward(output)

    def _watch_backward(self, output: Any) -> None:
        """A pre-hook on the autograd nodes of the outermost call's outputs: the backward
        pass that reaches one of them begins the backward phase."""
        t = self.t
        if not t.is_grad_enabled():
            return
        nodes: dict[int, Any] = {}
        stack, looked = [output], 0
        while stack and looked < 64:
            x = stack.pop()
            looked += 1
            if isinstance(x, t.Tensor):
                fn = x.grad_fn
                if fn is not None:
                    nodes.setdefault(id(fn), fn)
            elif isinstance(x, dict):
                stack.extend(x.values())
            elif isinstance(x, (list, tuple)):
                stack.extend(x)
        for fn in nodes.values():
            try:
                fn.register_prehook(self._backward_begins)
            except Exception:
                pass

    def _backward_begins(self, grad_outputs: Any) -> None:
        if not self.active or self._in_backward:
            return
        self._in_backward = True
        self._mark("backward")
        try:
            self.t.autograd.Variable._execution_engine.queue_callback(self._backward_done)
        except Exception:
            self._in_backward = False

    def _backward_done(self) -> None:
        self._in_backward = False
        if self.active:
            self._mark("other")

    def _opt_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self.active:
            self._mark("optimizer step")

    def _opt_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self.active:
            self._mark("other")

    def start(self) -> None:
        import importlib

        self.peaks = {}
        self._phase, self._depth, self._in_backward = "other", 0, False
        self._thread = threading.get_ident()
        self.active = True
        modules = importlib.import_module("torch.nn.modules.module")
        optim = importlib.import_module("torch.optim.optimizer")
        self._handles = [
            modules.register_module_forward_pre_hook(self._pre),
            modules.register_module_forward_hook(self._post, always_call=True),
            optim.register_optimizer_step_pre_hook(self._opt_pre),
            optim.register_optimizer_step_post_hook(self._opt_post),
        ]

    def stop(self) -> dict[int, dict[str, tuple[int, int, int]]]:
        """Remove the hooks; the peaks of each phase, by device. Safe to call twice."""
        if self.active:
            try:
                self._mark("other", reset=False)  # the last stretch
            finally:
                self.active = False
                for h in self._handles:
                    h.remove()
                self._handles = []
        return self.peaks
