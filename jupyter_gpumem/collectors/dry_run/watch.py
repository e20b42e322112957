"""What the peak of a dry run is made of, watched while the run runs (:class:`Watch`).

While the run runs, and only then, the hooks ``%%gpumem --breakdown`` uses
(``collectors/step.py``) watch it, with positions that are indices into the run's events
instead of the allocator's counters: global module forward hooks (the innermost module
running at each allocation, ``Alloc.module``; where the forward pass begins and ends),
optimizer step hooks (the parameters' gradients before each step, the optimizer state after
it) and autograd's saved-tensor hooks (the storages saved for backward: activations; the
first unpack marks the backward pass, a callback queued on the engine its end). The module
and optimizer hooks, the stack of running modules, the phases and the thread watched are
``collectors/phases.py``'s ``PhaseTracker``, shared with ``--breakdown``'s recorder and
``--scan``'s phase peaks; the claims, the saved-tensor hooks and the names are here. Each claim
names a storage by its allocation's key, so a storage is never confused with another. The
pack hook keeps a saved output as a detached alias (the tensor itself would make a
reference cycle, which would delay its free to the garbage collector and change the
events), a saved input as it is, and its version; the unpack hook raises autograd's own
error for a tensor modified in place since, as the hooks switch that check off. Modules are
named by the variable the cell (or the namespace before it) binds their root to, else by
the root's class. A cell that switches saved-tensor hooks off
(``torch.autograd.graph.disable_saved_tensors_hooks``) is run again without them by
``collectors/fake_run.record``: its activations are then temporaries.

What it sees is a :class:`~jupyter_gpumem.collectors.dry_run.events.Seen`, read by
``analysis/dry_breakdown.py``."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable
from functools import partial
from threading import get_ident
from typing import Any

from ..phases import PhaseTracker, qualified_names
from .events import CLAIMS, PhaseMark, PhaseName, Saved, Seen
from .state import State

_RANK: dict[str, int] = {c: i for i, c in enumerate(CLAIMS)}

INPLACE_ERROR = (
    "one of the variables needed for gradient computation has been modified by an inplace "
    "operation: saved at version {saved}, now at version {now}. (a dry run watches saved "
    "tensors with saved_tensors_hooks, which switch off autograd's own check; this is that "
    "check.)"
)


class Watch:
    """The breakdown's hooks for one run (``start`` ... ``stop``, then ``finish`` before the
    user's objects are put back): claims, phase marks and module names into a :class:`Seen`.

    Modules and optimizers are held by weak references only: holding one would keep its
    storages alive past the point where the cell drops it, and change the events.
    ``names``: the namespace's (name, object) pairs, where roots get their names."""

    def __init__(
        self, state: State, t: Any, names: Callable[[], Iterable[tuple[str, Any]]] | None
    ) -> None:
        self.state = state
        self.t = t
        self.names = names
        self.seen = Seen()
        self.active = False
        # The phases and the running modules: each entry on the tracker's stack is the
        # module that ran before the call (``state.module_now``, -1 for none), put back at
        # its end (by setattr itself: no Python call in the hook).
        back = partial(setattr, state, "module_now")
        self.phases = PhaseTracker(t, self.mark, self._enter, back, self._optimizer)
        self.index: dict[int, tuple[int, Any]] = {}  # id(module) -> (index, weak ref)
        self.looked: set[int] = set()  # ids of the namespace's modules already named
        # roots named by their class: (weak ref, [(index, path below the root)])
        self.unnamed: list[tuple[Any, list[tuple[int, str]]]] = []
        self.roots: dict[int, Any] = {}  # id -> weak ref: modules run at the top
        self.optimizers: dict[int, Any] = {}  # id -> weak ref
        self.disabled: list[str] = []  # messages of disable_saved_tensors_hooks in the run
        self._hooks: Any = None
        self._disable: Any = None  # torch's _saved_tensors_hooks_disable, while wrapped
        self._sequence_nr: Callable[[], int] = getattr(
            t._C._autograd, "_get_sequence_nr", lambda: 1 << 62
        )  # the next autograd node's number in this thread (without it: detach always)

    # -- claims ---------------------------------------------------------------------
    def claim(self, x: Any, category: str) -> None:
        if x is None:
            return
        try:
            st = x.untyped_storage()
        except Exception:  # no storage (sparse, nested, subclasses)
            return
        entry = self.state.live.get(id(st))
        if entry is None or entry[0] is None:
            return  # a storage from before the run (the user's real tensors)
        key = entry[0]
        old = self.seen.claims.get(key)
        if old is None or _RANK[category] < _RANK[old]:
            self.seen.claims[key] = category

    def claim_module(self, m: Any) -> None:
        try:
            for p in m.parameters():
                self.claim(p, "parameters")
                self.claim(p.grad, "gradients")
            for b in m.buffers():
                self.claim(b, "buffers")
        except Exception:
            pass

    def claim_optimizer(self, opt: Any, state: bool = True) -> None:
        try:
            for group in opt.param_groups:
                for p in group["params"]:
                    self.claim(p, "parameters")
                    self.claim(p.grad, "gradients")
            if state:
                Tensor = self.t.Tensor
                for per_param in opt.state.values():
                    if isinstance(per_param, dict):
                        for v in per_param.values():
                            if isinstance(v, Tensor):
                                self.claim(v, "optimizer state")
        except Exception:
            pass

    def mark(self, phase: PhaseName) -> None:
        self.seen.marks.append(PhaseMark(len(self.state.events), phase))

    # -- module names -----------------------------------------------------------------
    def _register(self, module: Any, name: str) -> list[tuple[int, str]]:
        """Index ``module`` and its submodules not yet indexed, under ``name``."""
        added: list[tuple[int, str]] = []
        modules, index = self.seen.modules, self.index
        for sub, child, qualified in qualified_names(module, name):
            entry = index.get(id(child))
            if entry is not None and entry[1]() is child:
                continue
            i = len(modules)
            modules.append(qualified)
            index[id(child)] = (i, weakref.ref(child))
            added.append((i, sub))
        return added

    def _from_namespace(self) -> None:
        """Name the namespace's modules not named yet (their submodules with them)."""
        if self.names is None:
            return
        Module = self.t.nn.Module
        try:
            pairs = list(self.names())
        except Exception:
            return
        for name, obj in pairs:
            if id(obj) not in self.looked and isinstance(obj, Module):
                self.looked.add(id(obj))
                self._register(obj, name)

    def _new(self, module: Any, outermost: bool) -> int:
        self._from_namespace()
        entry = self.index.get(id(module))
        if entry is not None and entry[1]() is module:
            return entry[0]
        added = self._register(module, type(module).__name__)
        if outermost and added:
            self.unnamed.append((weakref.ref(module), added))
        return self.index[id(module)][0]

    # -- the tracker's callbacks (module calls in the run's thread) -----------------------
    def _enter(self, module: Any, outermost: bool) -> int:
        entry = self.index.get(id(module))
        if entry is not None and entry[1]() is module:
            i = entry[0]
        else:
            try:
                i = self._new(module, outermost)
            except Exception:  # a module that can't be named (no weak references): none
                i = -1
        if outermost:
            ref = self.roots.get(id(module))
            if ref is None or ref() is not module:
                with contextlib.suppress(TypeError):
                    self.roots[id(module)] = weakref.ref(module)
            self.claim_module(module)  # its parameters now (also after .to(), .half())
        state = self.state
        before, state.module_now = state.module_now, i
        return before

    def _optimizer(self, opt: Any, before: bool) -> None:
        if before:  # marked "optimizer step" just now
            ref = self.optimizers.get(id(opt))
            if ref is None or ref() is not opt:
                with contextlib.suppress(TypeError):
                    self.optimizers[id(opt)] = weakref.ref(opt)
            self.claim_optimizer(opt, state=False)  # the gradients the backward pass made
        else:  # "other" is marked next
            self.claim_optimizer(opt)  # and the state the step made

    # -- saved-tensor hooks -----------------------------------------------------------
    def pack(self, x: Any) -> Any:
        if self.active:
            try:
                entry = self.state.live.get(id(x.untyped_storage()))
                if entry is not None and entry[0] is not None:
                    here = get_ident() == self.phases.thread
                    module = self.state.module_now if here else -1
                    self.seen.saved.append(Saved(entry[0], len(self.state.events), module))
            except Exception:
                pass
        # A saved output (its grad_fn is the node saving it, the newest one of this thread)
        # would make a reference cycle: keep a detached alias of it. A saved input can be
        # kept as it is (a detach costs ~70 us under the fake mode; most saved are inputs).
        fn = x.grad_fn
        if fn is not None and fn._sequence_nr() >= self._sequence_nr() - 1:
            return (x.detach(), x._version)
        return (x, x._version)

    def unpack(self, packed: Any) -> Any:
        alias, version = packed
        if alias._version != version:
            raise RuntimeError(INPLACE_ERROR.format(saved=version, now=alias._version))
        if self.active and not self.phases.in_backward:
            self.phases.backward_begins()  # the first unpack of a backward pass
        return alias

    def _disable_wrapper(self, message: Any, *args: Any, **kwargs: Any) -> Any:
        self.disabled.append(str(message))
        return self._disable(message, *args, **kwargs)

    def refused(self, e: BaseException) -> bool:
        """Whether ``e`` is the run switching saved-tensor hooks off while these were on."""
        text = str(e)
        return bool(self.disabled) and any(m and m in text for m in self.disabled)

    # -- start / stop -------------------------------------------------------------------
    def start(self) -> None:
        t = self.t
        self.active = True
        try:
            self.phases.start()
            autograd_c = t._C._autograd
            self._disable = getattr(autograd_c, "_saved_tensors_hooks_disable", None)
            if self._disable is not None:
                autograd_c._saved_tensors_hooks_disable = self._disable_wrapper
            hooks = t.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
            hooks.__enter__()
            self._hooks = hooks
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Remove every hook (safe to call twice)."""
        self.active = False
        self.state.module_now = -1
        try:
            if self._hooks is not None:
                self._hooks.__exit__(None, None, None)
                self._hooks = None
        finally:
            self.phases.stop()
            if self._disable is not None:
                self.t._C._autograd._saved_tensors_hooks_disable = self._disable
                self._disable = None

    def finish(self) -> Seen:
        """The claims at the end (what the run leaves: gradients, parameters and state of
        the modules and optimizers it ran or bound), the names roots were bound to."""
        for ref in list(self.roots.values()):
            m = ref()
            if m is not None:
                self.claim_module(m)
        for ref in list(self.optimizers.values()):
            opt = ref()
            if opt is not None:
                self.claim_optimizer(opt)
        bound: dict[int, str] = {}
        if self.names is not None:
            Module, Optimizer = self.t.nn.Module, self.t.optim.Optimizer
            try:
                pairs = list(self.names())
            except Exception:
                pairs = []
            for name, obj in pairs:
                if isinstance(obj, Module):
                    bound.setdefault(id(obj), name)
                    self.claim_module(obj)
                elif isinstance(obj, Optimizer):
                    self.claim_optimizer(obj)
        modules = self.seen.modules
        for ref, added in self.unnamed:
            m = ref()
            root = bound.get(id(m)) if m is not None else None
            if root:
                for i, sub in added:
                    modules[i] = f"{root}.{sub}" if sub else root
        self.roots.clear()
        self.optimizers.clear()
        self.index.clear()
        self.unnamed.clear()
        return self.seen
