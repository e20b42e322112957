"""What a ``%%gpumem --breakdown`` cell does, recorded from torch's own hooks.

While the cell runs, and only then:

- ``saved_tensors_hooks`` (autograd's default hooks for this thread) see every tensor
  autograd saves for backward: those are the activations. The pack hook keeps a detached
  alias (returning the tensor itself would make a reference cycle for saved outputs, which
  only the garbage collector frees) and its version; the unpack hook raises autograd's own
  error when the tensor was modified in place since, because hooks switch off autograd's
  check (checked with torch 2.13). The first unpack of a backward pass marks where it
  began, and a callback queued on the engine marks where it ended.
- global module forward hooks give each module call and its qualified name
  (``model.layers.3``) and where the forward pass began and ended;
- global optimizer step hooks mark each optimizer step and see the gradients and the
  optimizer state.

The module and optimizer hooks, the stack of running calls, the phases and the thread
tracked are ``phases.py``'s :class:`~jupyter_gpumem.collectors.phases.PhaseTracker`, shared
with the dry run's breakdown and ``--scan``'s phase peaks; what is this recorder's own is
here: the saved-tensor hooks, the positions, the names and what is observed.

Records of persistent tensors and the phase marks are stamped with the device's
*position*: how many allocations and frees its allocator has made since the cell began,
from the allocator's own counters (one ``_cuda_memoryStats`` call, ~12 us on an H100 host,
a few per step). Module calls and saved tensors, hundreds per step, are stamped with
``time.time_ns()`` instead (50 ns), which the allocator's trace clock places among its
events (measured on an H100: an allocation's ``time_us`` fell between the Python clock
readings around it). ``analysis/breakdown.py`` turns the records and the allocator's trace
into what the peak was made of. torch is never imported here: the caller
passes the module the user imported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from threading import get_ident
from time import time_ns
from typing import Any

from ..model import Mark, ModuleCall, Observed, StepRecord
from .allocator import cuda_counters
from .phases import Phase, PhaseTracker, qualified_names

INPLACE_ERROR = (
    "one of the variables needed for gradient computation has been modified by an inplace "
    "operation: saved at version {saved}, now at version {now}. (%%gpumem --breakdown "
    "watches saved tensors with saved_tensors_hooks, which switch off autograd's own check; "
    "this is that check.)"
)


def _cuda_device(x: Any) -> int | None:
    d = x.get_device()  # -1 on the CPU
    return d if d >= 0 and x.is_cuda else None


class StepRecorder:
    """Installs the hooks for one cell (``start``) and removes them (``stop``).

    ``namespace``: the user's variables, looked through (one level) for modules and
    optimizers, which name the module calls and give the parameters, buffers, gradients
    and optimizer state alive at the start and end of the cell. Tests pass ``devices`` and
    ``count`` to run on the CPU, and ``device_of`` to count CPU tensors as device 0.
    """

    def __init__(
        self,
        t: Any,
        namespace: Callable[[], Iterable[tuple[str, Any]]] = lambda: (),
        devices: Callable[[], list[int]] | None = None,
        count: Callable[[int], int] | None = None,
        device_of: Callable[[Any], int | None] = _cuda_device,
    ) -> None:
        self.t = t
        self.namespace = namespace
        if devices is None or count is None:
            devices, count = cuda_counters(t)
        self._devices = devices
        self._count = count
        self._device_of = device_of
        self.record = StepRecord()
        self.active = False
        self._zero: dict[int, int] = {}
        self._devs: list[int] = []
        # the phases and the running calls (their stack: [name, start, end, saved])
        self._phases = PhaseTracker(
            t, self._phase, self._enter, self._exit, self._optimizer, recompute=True
        )
        self._stack = self._phases.stack  # the tracker's, for the pack hook
        self._calls: list[list[Any]] = []  # every call, in order (ModuleCall at stop)
        self._add_call = self._calls.append  # bound once: called at every module call
        # saved tensors: (device, address, nbytes, module, time_ns), Observed at stop
        self._saved: list[tuple[int, int, int, str, int]] = []
        self._names: dict[int, str] = {}  # id(module) -> qualified name
        self._name_of = self._names.get  # the same
        self._roots: dict[int, Any] = {}  # modules whose parameters are watched
        self._optimizers: dict[int, Any] = {}
        self._state_sizes: dict[int, int] = {}  # optimizer -> state tensors before its step
        self._first_param: dict[int, int] = {}  # module -> where its first parameter was
        self._reading: dict[int, int] | None = None  # positions read after an optimizer step
        self._hooks: Any = None

    # -- positions ------------------------------------------------------------------
    def _position(self, device: int) -> int:
        if device not in self._zero and device not in self._devs:
            self._devs = self._devices()  # a device whose context started in the cell
        return self._count(device) - self._zero.get(device, 0)

    def _positions(self) -> dict[int, int]:
        return {d: self._count(d) - self._zero.get(d, 0) for d in self._devs}

    def _mark(self, phase: str) -> None:
        self._devs = self._devices()
        self.record.marks.append(Mark(self._positions(), phase))

    def _phase(self, phase: Phase) -> None:
        """A phase begins: marked at the positions now (after an optimizer step, at those
        its state was observed at)."""
        positions, self._reading = self._reading, None
        if positions is None:
            self._mark(phase)
        else:
            self.record.marks.append(Mark(positions, phase))

    # -- observations ---------------------------------------------------------------
    def _observe(
        self, x: Any, category: str, positions: dict[int, int], seen: set[int] | None = None
    ) -> None:
        """One persistent tensor (parameter, buffer, gradient, optimizer state): where its
        storage is at these positions. ``seen`` skips tensors already observed this round."""
        if x is None:
            return
        if seen is not None:
            if id(x) in seen:
                return
            seen.add(id(x))
        try:
            device = self._device_of(x)
            if device is None:
                return
            if x._base is None and not x.storage_offset():
                address, nbytes = x.data_ptr(), x.untyped_storage().nbytes()
            else:  # a view: the block is its storage's
                st = x.untyped_storage()
                address, nbytes = st.data_ptr(), st.nbytes()
        except Exception:  # tensor subclasses without storage, meta tensors
            return
        if address and nbytes:
            position = positions.get(device)
            if position is None:
                position = self._position(device)
            self.record.observations.append(Observed(position, device, address, nbytes, category))

    def _observe_module(self, m: Any, positions: dict[int, int], seen: set[int]) -> None:
        for p in m.parameters():
            self._observe(p, "parameters", positions, seen)
            self._observe(p.grad, "gradients", positions, seen)
        for b in m.buffers():
            self._observe(b, "buffers", positions, seen)

    def _observe_optimizer(
        self, opt: Any, positions: dict[int, int], seen: set[int], state: bool = True
    ) -> None:
        for group in opt.param_groups:
            for p in group["params"]:
                self._observe(p, "parameters", positions, seen)
                self._observe(p.grad, "gradients", positions, seen)
        if state:
            Tensor = self.t.Tensor
            for st in opt.state.values():
                if isinstance(st, dict):
                    for v in st.values():
                        if isinstance(v, Tensor):
                            self._observe(v, "optimizer state", positions, seen)

    def _see_roots(self, positions: dict[int, int]) -> None:
        """The modules and optimizers bound to the user's names: name them, watch them."""
        Module, Optimizer = self.t.nn.Module, self.t.optim.Optimizer
        seen: set[int] = set()
        for name, obj in self.namespace():
            if isinstance(obj, Module):
                self._add_root(obj, name)
                self._observe_module(obj, positions, seen)
            elif isinstance(obj, Optimizer):
                self._optimizers[id(obj)] = obj
                self._observe_optimizer(obj, positions, seen)

    def _see_new_roots(self, end: dict[int, int], seen: set[int]) -> None:
        """At the cell's end: the modules and optimizers it made (a cell that builds a
        model, or loads one), and the roots it moved (``model.cuda()``): their parameters,
        buffers and optimizer state as they are now, so that what the cell made is named
        by what it is."""
        Module, Optimizer = self.t.nn.Module, self.t.optim.Optimizer
        for name, obj in self.namespace():
            if isinstance(obj, Module):
                if id(obj) not in self._roots:
                    self._add_root(obj, name)
                    self._observe_module(obj, end, seen)
                elif self._moved(obj):
                    self._observe_module(obj, end, seen)
            elif isinstance(obj, Optimizer) and id(obj) not in self._optimizers:
                self._optimizers[id(obj)] = obj
                self._observe_optimizer(obj, end, seen)

    def _moved(self, module: Any) -> bool:
        """Whether the module's first parameter lives elsewhere than when last seen."""
        try:
            first = next(module.parameters(), None)
            where = first.data_ptr() if first is not None else 0
        except Exception:
            return False
        if self._first_param.get(id(module)) == where:
            return False
        self._first_param[id(module)] = where
        return True

    def _add_root(self, module: Any, name: str) -> None:
        if id(module) in self._roots:
            return
        self._roots[id(module)] = module
        try:
            first = next(module.parameters(), None)
            self._first_param[id(module)] = first.data_ptr() if first is not None else 0
        except Exception:
            pass
        for _, child, qualified in qualified_names(module, name):
            self._names.setdefault(id(child), qualified)

    # -- the tracker's callbacks (module calls in the tracked thread) ---------------------
    def _enter(self, module: Any, outermost: bool) -> list[Any]:
        if outermost:
            if id(module) not in self._names:
                self._add_root(module, type(module).__name__)
                self._observe_module(module, self._positions(), set())
            elif self._moved(module):  # .to(), .half(): new storages since they were seen
                self._observe_module(module, self._positions(), set())
        name = self._name_of(id(module)) or type(module).__name__
        # [name, start, end, the activations it saved (observed at its end; None: none)]
        call: list[Any] = [name, time_ns(), None, None]
        self._add_call(call)
        return call

    def _exit(self, call: list[Any]) -> None:
        end = call[2] = time_ns()
        # What this module saved for backward, stamped with its end: the saved tensors are
        # still alive then, so the block at each address is theirs.
        saved = call[3]
        if saved:
            name = call[0]
            self._saved += [(d, a, n, name, end) for d, a, n in saved]

    def _optimizer(self, opt: Any, before: bool) -> None:
        if before:  # marked "optimizer step" just now
            positions = self.record.marks[-1].positions
            states = sum(len(v) for v in opt.state.values() if isinstance(v, dict))
            self._state_sizes[id(opt)] = states
            if id(opt) not in self._optimizers:
                self._optimizers[id(opt)] = opt
                self._observe_optimizer(opt, dict(positions), set())
                return
            seen: set[int] = set()
            for group in opt.param_groups:  # gradients, made by the backward pass
                for p in group["params"]:
                    self._observe(p.grad, "gradients", dict(positions), seen)
            return
        positions = self._positions()
        states = sum(len(v) for v in opt.state.values() if isinstance(v, dict))
        if states != self._state_sizes.get(id(opt)):  # state made by this step (the first)
            self._observe_optimizer(opt, positions, set())
        self._reading = positions  # the "other" that follows is marked there

    def _pack(self, x: Any) -> Any:
        if self.active:
            self.record.saved += 1
            try:
                device = self._device_of(x)
                if device is not None:
                    if x._base is None and not x.storage_offset():
                        found = (device, x.data_ptr(), x.nbytes)  # no storage object: cheaper
                    else:  # a view: the block is its storage's
                        st = x.untyped_storage()
                        found = (device, st.data_ptr(), st.nbytes())
                    stack = self._stack
                    if stack and get_ident() == self._phases.thread:
                        call = stack[-1]
                        if call[3] is None:
                            call[3] = [found]
                        else:
                            call[3].append(found)
                    else:  # outside any module: stamped now
                        self._saved.append((*found, "", time_ns()))
            except Exception:
                pass
        return (x.detach(), x._version)

    def _unpack(self, packed: Any) -> Any:
        alias, version = packed
        if alias._version != version:
            raise RuntimeError(INPLACE_ERROR.format(saved=version, now=alias._version))
        if self.active and not self._phases.in_backward:
            self._phases.backward_begins()  # the first unpack of a backward pass
        return alias

    # -- start / stop ---------------------------------------------------------------
    def start(self) -> None:
        t = self.t
        self._devs = self._devices()
        self._zero = {d: self._count(d) for d in self._devs}
        self.active = True
        self._see_roots(self._positions())
        self._phases.start()
        self._hooks = t.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()

    def stop(self) -> StepRecord:
        """Remove every hook; take the end observations. Safe to call twice."""
        if not self.active:
            return self.record
        try:
            self._devs = self._devices()
            end = self._positions()
            # Parameters, buffers and optimizer state were seen when the cell began (or
            # when their module first ran, or their optimizer first stepped); gradients
            # come and go (zero_grad(set_to_none=True)): those as they are now.
            seen: set[int] = set()
            self._see_new_roots(end, seen)
            for m in list(self._roots.values()):
                for p in m.parameters():
                    self._observe(p.grad, "gradients", end, seen)
            for opt in list(self._optimizers.values()):
                for group in opt.param_groups:
                    for p in group["params"]:
                        self._observe(p.grad, "gradients", end, seen)
            self.record.end_positions = end
            now = time_ns()
            for call in self._phases.stack:  # never returned: their saved tensors now
                self._saved.extend((d, a, n, call[0], now) for d, a, n in call[3] or ())
            add = self.record.observations.append
            for device, address, nbytes, module, t in self._saved:
                add(Observed(-1, device, address, nbytes, "activations", module, t))
            self._saved = []
        finally:
            self.active = False
            if self._hooks is not None:
                self._hooks.__exit__(None, None, None)
                self._hooks = None
            self._phases.stop()
            self.record.calls = [ModuleCall(c[0], c[1], c[2]) for c in self._calls]
            self._calls.clear()
            self._roots.clear()  # hold no user objects past the cell
            self._optimizers.clear()
            self._first_param.clear()
        return self.record


__all__ = ["INPLACE_ERROR", "StepRecorder", "cuda_counters"]
