"""The phases of a training step and the modules running in it, from torch's own hooks:
:class:`PhaseTracker`, the one copy of this tracking, used by the three collectors that
need it, each for its own records:

- ``step.py``'s :class:`~jupyter_gpumem.collectors.step.StepRecorder`
  (``%%gpumem --breakdown``): phase marks at the allocator's positions, the module calls
  and what each saved for backward (its saved-tensor hooks);
- ``dry_run/watch.py``'s ``Watch`` (the dry run's breakdown): phase marks at indices into
  the run's events, the innermost module at each allocation, the claims of storages;
- ``phase_peaks.py``'s :class:`~jupyter_gpumem.collectors.phase_peaks.PhasePeaks`
  (``%%gpumem --scan``): the allocator's peaks in each phase.

While it is started, and only for the thread that started it (not DataParallel's replicas
nor, unless ``recompute``, recomputation in autograd's backward threads):

- global module forward pre-hooks and hooks (``always_call``) keep a stack of the running
  module calls. The outermost call begins the forward pass and its end ends it
  (``"other"``), unless the backward pass is running (recomputation in this thread);
- the backward pass begins at the first saved tensor it unpacks (the user's unpack hook
  calls :meth:`PhaseTracker.backward_begins`) or, for a user without saved-tensor hooks
  (``outputs=True``), at a pre-hook on the autograd nodes of the outermost call's outputs;
  a callback queued on autograd's execution engine ends it (``"backward done"``);
- global optimizer step hooks: each step is the ``"optimizer step"`` phase, ``"other"``
  after it.

It calls its user back: ``on_phase(phase)`` at each of these transitions,
``on_module_enter(module, outermost)`` at each call (what it returns is the call's entry
on :attr:`PhaseTracker.stack`) and ``on_module_exit(entry)`` after its entry is popped,
``on_optimizer_step(opt, before)`` after the optimizer step phase begins and before it
ends. What a module call is named (the user's variable bound to its root, else the root's
class) is the user's choice; :func:`qualified_names` names a root's submodules below it.
With ``recompute`` (the breakdown's), module calls in other threads while a backward pass
runs (activation checkpointing recomputes the forward in autograd's threads) are given to
``on_module_enter(module, False)`` and ``on_module_exit(entry)`` too, each thread with its
own stack; they begin no phase. The hooks do nothing else: a user pays only for its
callbacks. torch is never imported here: the caller passes the module the user imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from threading import get_ident
from typing import Any, Literal

Phase = Literal["forward", "backward", "backward done", "optimizer step", "other"]


def qualified_names(module: Any, name: str) -> Iterator[tuple[str, Any, str]]:
    """``module`` and its submodules: (the path below it, the submodule, its qualified name
    under ``name``: ``model``, ``model.layers.3``); where they can't all be listed, after
    those that could, ``module`` itself under ``name``."""
    try:
        for sub, child in module.named_modules():
            yield sub, child, f"{name}.{sub}" if sub else name
    except Exception:
        yield "", module, name


class PhaseTracker:
    """The hooks of one tracking (``start`` ... ``stop``, again as often as needed).

    ``on_phase(phase)``: each phase that begins ("forward" before the outermost call's
    ``on_module_enter``, "other" after its ``on_module_exit``). ``on_module_enter(module,
    outermost)`` returns the call's entry, ``on_module_exit(entry)`` is given it back at the
    call's end (both optional: without them each entry is None). ``on_optimizer_step(opt,
    before)`` (optional): after "optimizer step" begins (``before``) and before "other"
    does. ``outputs``: the backward pass begins where it reaches the outermost call's
    outputs (for a user without saved-tensor hooks). ``stack``: the running calls' entries,
    innermost last (one list for the tracker's life, emptied at start and stop);
    ``in_backward``: a backward pass is running; ``thread``: the tracked thread's ident."""

    def __init__(
        self,
        t: Any,
        on_phase: Callable[[Phase], None],
        on_module_enter: Callable[[Any, bool], Any] | None = None,
        on_module_exit: Callable[[Any], None] | None = None,
        on_optimizer_step: Callable[[Any, bool], None] | None = None,
        outputs: bool = False,
        recompute: bool = False,
    ) -> None:
        self.t = t
        self._on_phase = on_phase
        self._enter = on_module_enter
        self._exit = on_module_exit
        self._optimizer = on_optimizer_step
        self.outputs = outputs
        self.recompute = recompute and on_module_enter is not None
        self.others: dict[int, list[Any]] = {}  # recomputation's stacks, by thread
        self.active = False
        self.in_backward = False
        self.thread = 0
        self.stack: list[Any] = []
        self._handles: list[Any] = []

    # -- module calls (the hot hooks: hundreds a step) ---------------------------------
    def _module_hooks(self) -> tuple[Callable[..., None], Callable[..., None]]:
        """The forward pre-hook and hook. They run at every module call: closures over the
        tracked thread, the stack and the callbacks (no attribute lookups), one of each for
        a user with callbacks and one without, so that each hook does the thread check, the
        stack and at most one call of the user's."""
        thread, stack, enter, leave = self.thread, self.stack, self._enter, self._exit
        on_phase, outputs = self._on_phase, self.outputs
        recompute, others = self.recompute, self.others

        if enter is None:

            def pre(module: Any, args: Any) -> None:
                if get_ident() != thread:
                    return  # DataParallel's replicas, recomputation in backward threads
                if not stack and not self.in_backward:
                    on_phase("forward")
                stack.append(None)

        else:

            def pre(module: Any, args: Any) -> None:
                if get_ident() != thread:
                    # DataParallel's replicas; recomputation in backward threads, named
                    # with ``recompute``
                    if recompute and self.in_backward:
                        others.setdefault(get_ident(), []).append(enter(module, False))
                    return
                if stack:
                    stack.append(enter(module, False))
                    return
                if not self.in_backward:
                    on_phase("forward")
                stack.append(enter(module, True))

        if leave is None:

            def post(module: Any, args: Any, output: Any) -> None:
                if get_ident() != thread or not stack:
                    return
                stack.pop()
                if not stack and not self.in_backward:
                    on_phase("other")
                    if outputs:
                        self._watch_backward(output)

        else:

            def post(module: Any, args: Any, output: Any) -> None:
                if get_ident() != thread:
                    other = others.get(get_ident()) if recompute else None
                    if other:
                        leave(other.pop())
                    return
                if not stack:
                    return
                leave(stack.pop())
                if not stack and not self.in_backward:
                    on_phase("other")
                    if outputs:
                        self._watch_backward(output)

        return pre, post

    # -- the backward pass ------------------------------------------------------------
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
                fn.register_prehook(self.backward_begins)
            except Exception:
                pass

    def backward_begins(self, *grad_outputs: Any) -> None:
        """The backward pass begins, unless it has already: called by the user's unpack
        hook (the first saved tensor unpacked) or as a node's pre-hook. Its end is a callback
        queued on autograd's engine; outside a backward pass (a saved tensor read by the
        user's code) nothing begins."""
        if not self.active or self.in_backward:
            return
        try:
            self.t.autograd.Variable._execution_engine.queue_callback(self._backward_done)
        except Exception:  # not inside a backward pass after all
            return
        self.in_backward = True
        self._on_phase("backward")

    def _backward_done(self) -> None:
        self.in_backward = False
        if self.active:
            self._on_phase("backward done")

    # -- optimizer steps --------------------------------------------------------------
    def _opt_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self.active:
            self._on_phase("optimizer step")
            if self._optimizer is not None:
                self._optimizer(opt, True)

    def _opt_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self.active:
            if self._optimizer is not None:
                self._optimizer(opt, False)
            self._on_phase("other")

    # -- start / stop -----------------------------------------------------------------
    def start(self) -> None:
        """Install the hooks; the calling thread is the one tracked."""
        modules = importlib.import_module("torch.nn.modules.module")
        optim = importlib.import_module("torch.optim.optimizer")
        self.thread = get_ident()
        self.in_backward = False
        self.stack.clear()
        self.others.clear()
        self.active = True
        pre, post = self._module_hooks()
        add = self._handles.append
        add(modules.register_module_forward_pre_hook(pre))
        add(modules.register_module_forward_hook(post, always_call=True))
        add(optim.register_optimizer_step_pre_hook(self._opt_pre))
        add(optim.register_optimizer_step_post_hook(self._opt_post))

    def stop(self) -> None:
        """Remove the hooks (safe to call twice); the stack is emptied."""
        self.active = False
        self.in_backward = False
        self.stack.clear()
        self.others.clear()
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()


__all__ = ["Phase", "PhaseTracker", "qualified_names"]
