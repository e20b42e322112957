"""Who keeps an object alive when no name of the user's does: Python's own referrers
(``gc.get_referrers``), followed upward until something can be named.

What is named: a hook on a module (``other._forward_hooks``, a closure over the object), a
function in the user's namespace whose closure holds it, a global of an imported module
(a library's cache, ``vllm...parallel_state._TP``), a frame of another thread, or a running
frame. An object that nothing Python tracks refers to is held from C/C++ (an extension, a
CUDA graph) or by nothing at all any more.

``gc.get_referrers`` scans every tracked object (tens of milliseconds on a large kernel), so
a search is bounded: ``max_nodes`` objects, ``max_depth`` levels. Called by ``%gpumem
free`` only, before acting (hooks and closures) and after (what still holds the rest).
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
)
# A hook's id is a key in these too (torch.utils.hooks.RemovableHandle removes it from all).
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_HOOK_EXTRAS = ("_forward_hooks_with_kwargs", "_forward_hooks_always_called")


@dataclass
class Found:
    """Something that keeps the object alive."""

    kind: str  # "hook", "function", "global", "thread", "frame", "name", "none"
    label: str  # "other._forward_hooks[3]", "vllm.distributed.parallel_state._TP"
    why: str  # in words
    remove: Callable[[], None] | None = field(default=None, repr=False)  # lets it go


def keepers(
    obj: Any,
    names: Mapping[int, str],
    module_names: Mapping[int, str] | None = None,
    max_depth: int = 7,
    max_nodes: int = 300,
) -> list[Found]:
    """What keeps ``obj`` alive, found upward from it: the holders nearest to it (and every
    hook on the way). ``names``: id of a user-namespace dict (or of another object the
    caller already names) -> its label; the search stops there. ``module_names``: the ids
    of objects the user's namespace names (a module ``other`` -> "other"), to name a hook's
    module."""
    module_names = module_names or {}
    threads = _thread_frames()
    found: list[Found] = []
    seen: set[int] = {id(obj)}
    # (object, how it reaches obj: "._forward_hooks[3] (closure)")
    frontier: list[tuple[Any, str]] = [(obj, "")]
    nodes = 0
    for _ in range(max_depth):
        nxt: list[tuple[Any, str]] = []
        ignore = {id(frontier), id(nxt), id(sys._getframe())}
        level: list[Found] = []
        for cur, path in frontier:
            refs = gc.get_referrers(cur)
            ignore.add(id(refs))
            for r in refs:
                rid = id(r)
                if rid in seen or rid in ignore:
                    continue
                seen.add(rid)
                nodes += 1
                step = _step(r, cur) + path
                hit = _name(r, cur, step, names, module_names, threads)
                if hit is not None:
                    if hit.kind == "hook":
                        found.append(hit)
                    elif hit.kind not in ("skip", "name"):
                        level.append(hit)
                    continue
                if isinstance(r, (types.FrameType, types.ModuleType, type)):
                    continue
                nxt.append((r, step))
                if nodes >= max_nodes:
                    break
            del refs
            if nodes >= max_nodes:
                break
        if level:  # the nearest holders; what holds them is not the question
            return found + level
        if not nxt or nodes >= max_nodes:
            break
        frontier = nxt
    return found


def _step(r: Any, child: Any) -> str:
    """How ``r`` refers to ``child``: ``['key']``, ``[3]``, ``.attr``, ``(closure)``."""
    try:
        if isinstance(r, dict):
            for k, v in r.items():
                if v is child:
                    return f"[{k!r}]" if not isinstance(k, int) else f"[{k}]"
            return ""
        if isinstance(r, (list, tuple)):
            for i, v in enumerate(r):
                if v is child:
                    return f"[{i}]" if not isinstance(r, tuple) or len(r) > 1 else ""
            return ""
        if type(r).__name__ == "cell":
            return " (closure)"
        if isinstance(r, types.FunctionType):
            return ""
        attrs = getattr(r, "__dict__", None)
        if isinstance(attrs, dict):
            if attrs is child:
                return ""
            for k, v in attrs.items():
                if v is child:
                    return f".{k}"
    except Exception:
        pass
    return ""


def _name(
    r: Any,
    child: Any,
    path: str,
    names: Mapping[int, str],
    module_names: Mapping[int, str],
    threads: Mapping[int, str],
) -> Found | None:
    label = names.get(id(r))
    if label is not None:
        return Found("name", label + path, "a name in the namespace")
    if isinstance(r, types.FrameType):
        code = r.f_code
        where = f"{code.co_name}() at {_short(code.co_filename)}:{r.f_lineno}"
        thread = threads.get(id(r))
        if thread is not None:
            return Found("thread", f"thread {thread!r}: {where}", "a frame of another thread")
        if code.co_filename.startswith(_PACKAGE):  # this search and its callers
            return Found("skip", "", "")
        return Found("frame", where, "a running frame's local")
    if isinstance(r, threading.Thread):
        return Found("thread", f"thread {r.name!r}{path}", "a running thread holds it")
    if isinstance(r, dict):
        d: dict[Any, Any] = r
        for modname, m in list(sys.modules.items()):
            if getattr(m, "__dict__", None) is d:
                if modname == "__main__" or not path:
                    return None
                return Found("global", f"{modname}{_dotted(path)}", "a global of a module")
        hook = _hook_of(d, child, module_names)
        if hook is not None:
            return hook
    else:
        attrs = getattr(r, "__dict__", None)
        if isinstance(attrs, dict) and type(r).__module__ != "builtins":
            for attr in HOOK_DICTS:
                hooks = attrs.get(attr)
                if hooks is child and isinstance(hooks, dict):
                    return _hook_of(hooks, _first_value_on(hooks, path), module_names, r)
    return None


def _dotted(path: str) -> str:
    """``['_TP']...`` of a module's globals -> ``._TP...``."""
    if path.startswith("['") and "']" in path:
        key, rest = path[2:].split("']", 1)
        return f".{key}{rest}"
    return path


def _first_value_on(d: dict[Any, Any], path: str) -> Any:
    for k, v in d.items():
        if path.startswith((f"[{k}]", f"[{k!r}]")):
            return v
    return None


def _hook_of(
    d: dict[Any, Any], fn: Any, module_names: Mapping[int, str], owner: Any = None
) -> Found | None:
    """``d`` is a module's hook dict holding ``fn``: a Found that removes the hook."""
    key = _key_of(d, fn) if fn is not None else None
    if key is None:
        return None
    owners = [owner] if owner is not None else _objects_holding(d)
    for o in owners:
        attrs = getattr(o, "__dict__", None)
        if not isinstance(attrs, dict):
            continue
        for attr in HOOK_DICTS:
            if attrs.get(attr) is d:
                name = module_names.get(id(o), f"a {type(o).__name__}")

                def remove(o: Any = o, attr: str = attr, key: Any = key) -> None:
                    getattr(o, attr).pop(key, None)
                    for extra in _HOOK_EXTRAS:
                        getattr(o, extra, {}).pop(key, None)

                return Found(
                    "hook",
                    f"{name}.{attr}[{key}]",
                    f"a hook on {name} whose closure holds it",
                    remove,
                )
    return None


def _objects_holding(d: dict[Any, Any]) -> list[Any]:
    """The objects that hold ``d`` as an attribute (through their ``__dict__``, which is
    itself a referrer once materialised)."""
    out = []
    for r in gc.get_referrers(d):
        if isinstance(r, dict):
            out += [o for o in gc.get_referrers(r) if getattr(o, "__dict__", None) is r]
        elif not isinstance(r, (list, tuple)):
            out.append(r)
    return out


def _key_of(d: dict[Any, Any], value: Any) -> Any:
    for k, v in list(d.items()):
        if v is value:
            return k
    return None


def _thread_frames() -> dict[int, str]:
    """id of each frame on another thread's stack -> that thread's name."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    out: dict[int, str] = {}
    for ident, f in sys._current_frames().items():
        if ident == me:
            continue
        name = names.get(ident, str(ident))
        cur: types.FrameType | None = f
        while cur is not None:
            out[id(cur)] = name
            cur = cur.f_back
    return out


def _short(path: str) -> str:
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:])


__all__ = ["Found", "keepers"]
