"""The user's objects and torch's switches, left as a dry run found them.

The fake mode never writes real tensors; what the run binds in the objects it was given
(gradients of real parameters aside, which ``collectors/dry_run/state.py`` puts back) is put
back afterwards by :class:`Keep`: objects' attributes, containers, modules' parameters,
buffers and attributes, optimizers' state. :class:`Switches` puts back torch's global
state a cell changes in a line: the random generators, grad mode, the default dtype. Both
are taken before ``collectors/fake_run.record`` runs the code and restored after it."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..torch_build import cuda_ready


class Keep:
    """What the run could bind inside the objects it was given, put back afterwards:
    objects' attributes, the contents of dicts, lists and sets, every submodule's
    parameters, buffers and attributes, an optimizer's state and param groups. Tensors are
    not entered (the fake mode never writes real tensors); the walk goes ``depth`` levels
    into plain objects and containers and stops after ``limit`` of them, so a huge data set
    is not copied."""

    def __init__(
        self, t: Any, roots: Iterable[object], depth: int = 3, limit: int = 20_000
    ) -> None:
        self.saved: list[tuple[Any, Any]] = []
        self.requires_grad: list[tuple[Any, bool]] = []  # parameters of the modules
        # parameters' gradients (``zero_grad()`` sets them to None in the real objects)
        self.grads: list[tuple[Any, Any]] = []
        seen: set[int] = set()
        Tensor, Module, Optimizer = t.Tensor, t.nn.Module, t.optim.Optimizer
        leaves = (Tensor, type, type(sys), str, bytes, int, float, complex, bool)
        stack: list[tuple[object, int]] = [(r, 0) for r in roots]
        while stack and len(self.saved) < limit:
            obj, level = stack.pop()
            if id(obj) in seen or isinstance(obj, leaves):
                continue
            seen.add(id(obj))
            children: Iterable[object] = ()
            if isinstance(obj, Module):
                for m in obj.modules():
                    seen.add(id(m))
                    own = (m._parameters, m._buffers, m._modules)
                    for d in (m.__dict__, *own):
                        self._save(d)
                    for p in m._parameters.values():
                        if p is not None:
                            self.requires_grad.append((p, bool(p.requires_grad)))
                            self.grads.append((p, p.grad))
                    attrs = [v for v in m.__dict__.values() if not any(v is d for d in own)]
                    stack.extend((v, level + 1) for v in attrs if not isinstance(v, Module))
                continue
            if isinstance(obj, Optimizer):
                self._save(obj.__dict__)
                self._save(obj.state)
                for per_param in obj.state.values():
                    if isinstance(per_param, dict):
                        self._save(per_param)
                self._save(obj.param_groups)
                for group in obj.param_groups:
                    self._save(group)
                    params = group.get("params", ()) if isinstance(group, dict) else ()
                    self.grads.extend((p, p.grad) for p in params if isinstance(p, Tensor))
                continue
            if isinstance(obj, (dict, list, set)):
                self._save(obj)
                children = obj.values() if isinstance(obj, dict) else obj
            elif isinstance(obj, tuple):
                children = obj
            else:
                d = getattr(obj, "__dict__", None)
                if isinstance(d, dict):
                    self._save(d)
                    children = d.values()
            if level < depth and not isinstance(obj, set):
                for n, c in enumerate(children):
                    if n >= limit:
                        break
                    stack.append((c, level + 1))

    def _save(self, container: Any) -> None:
        if isinstance(container, dict):
            self.saved.append((container, dict(container)))
        elif isinstance(container, list):
            self.saved.append((container, list(container)))
        elif isinstance(container, set):
            self.saved.append((container, set(container)))

    def restore(self) -> int:
        """Put back what changed; how many containers (and parameters) had changed."""
        changed = 0
        for p, grad in self.grads:
            if p.grad is not grad:
                p.grad = grad
                changed += 1
        for p, requires_grad in self.requires_grad:
            if p.requires_grad != requires_grad:
                p.requires_grad_(requires_grad)
                changed += 1
        for target, saved in self.saved:
            if isinstance(target, dict):
                if len(target) == len(saved) and all(
                    k in target and target[k] is v for k, v in saved.items()
                ):
                    continue
                target.clear()
                target.update(saved)
            elif isinstance(target, list):
                if len(target) == len(saved) and all(
                    a is b for a, b in zip(target, saved, strict=True)
                ):
                    continue
                target[:] = saved
            else:
                if target == saved:
                    continue
                target.clear()
                target.update(saved)
            changed += 1
        return changed


class Switches:
    """torch's global state a cell can change in a line: the random generators' states
    (``torch.manual_seed``), grad mode (``torch.set_grad_enabled``), the default dtype."""

    def __init__(self, t: Any) -> None:
        self.t = t
        self.rng = t.random.get_rng_state()
        # CUDA's generators only when CUDA runs: reading them would start it
        self.cuda_rng = t.cuda.get_rng_state_all() if cuda_ready(t) else None
        self.grad = t.is_grad_enabled()
        self.dtype = t.get_default_dtype()

    def restore(self) -> None:
        t = self.t
        t.random.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            t.cuda.set_rng_state_all(self.cuda_rng)
        t.set_grad_enabled(self.grad)
        t.set_default_dtype(self.dtype)


def reachable(run: Callable[[], object], depth: int = 3) -> list[object]:
    """What a function given to a dry run can reach besides its own locals: its closure's
    cells, the globals its code names (and those of the functions they are), a bound
    method's object, a ``partial``'s arguments. The run binds things in these, and they
    are put back (``keep``)."""
    import functools
    import types

    out: list[object] = []
    seen: set[int] = set()

    def names(code: types.CodeType) -> Iterator[str]:
        yield from code.co_names
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                yield from names(c)

    def visit(fn: object, level: int) -> None:
        if id(fn) in seen or level > depth:
            return
        seen.add(id(fn))
        if isinstance(fn, functools.partial):
            out.extend((*fn.args, *fn.keywords.values()))
            visit(fn.func, level + 1)
            return
        owner = getattr(fn, "__self__", None)
        if owner is not None and not isinstance(owner, types.ModuleType):
            out.append(owner)
        func = getattr(fn, "__func__", fn)
        if not isinstance(func, types.FunctionType):
            if not isinstance(fn, (type, types.BuiltinFunctionType, types.ModuleType)):
                out.append(fn)  # an object that is called: its attributes
            return
        for cell in func.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            out.append(value)
            visit(value, level + 1)
        g = func.__globals__
        for name in set(names(func.__code__)):
            if name in g:
                value = g[name]
                if isinstance(value, types.FunctionType):
                    visit(value, level + 1)
                elif not isinstance(value, (type, types.ModuleType)):
                    out.append(value)

    visit(run, 0)
    return out
