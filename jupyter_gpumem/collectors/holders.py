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
    """What keeps ``obj`` alive, found upward from it. ``names``: id of a user-namespace
    dict (or of another object the caller already names) -> its label; the search stops
    there. ``module_names``: the ids of objects the user's namespace reaches by name (a
    module ``other`` -> "other"), to name a hook's module."""
    module_names = module_names or {}
    ignore = {id(sys._getframe())}
    threads = _thread_frames()
    found: list[Found] = []
    seen: set[int] = {id(obj)}
    frontier: list[tuple[Any, tuple[Any, ...]]] = [(obj, ())]
    nodes = 0
    for _ in range(max_depth):
        nxt: list[tuple[Any, tuple[Any, ...]]] = []
        ignore.add(id(frontier))
        ignore.add(id(nxt))
        for cur, chain in frontier:
            refs = gc.get_referrers(cur)
            ignore.add(id(refs))
            for r in refs:
                rid = id(r)
                if rid in seen or rid in ignore or r is frontier or r is nxt:
                    continue
                seen.add(rid)
                nodes += 1
                hit = _name(r, cur, chain, names, module_names, threads)
                if hit is not None:
                    if hit.kind != "skip":
                        found.append(hit)
                    continue
                if isinstance(r, (types.FrameType, types.ModuleType, type)):
                    continue
                nxt.append((r, (*chain, cur)))
                if nodes >= max_nodes:
                    break
            del refs
            if nodes >= max_nodes:
                break
        if not nxt or nodes >= max_nodes:
            break
        frontier = nxt
    return found


def _name(
    r: Any,
    child: Any,
    chain: tuple[Any, ...],
    names: Mapping[int, str],
    module_names: Mapping[int, str],
    threads: Mapping[int, str],
) -> Found | None:
    label = names.get(id(r))
    if label is not None:
        return Found("name", label, "a name in the namespace")
    if isinstance(r, types.FrameType):
        code = r.f_code
        where = f"{code.co_name}() at {_short(code.co_filename)}:{r.f_lineno}"
        thread = threads.get(id(r))
        if thread is not None:
            return Found("thread", f"thread {thread!r}: {where}", "a frame of another thread")
        if code.co_filename.startswith(_PACKAGE):  # this search and its callers
            return Found("skip", "", "")
        return Found("frame", where, "a running frame's local")
    if isinstance(r, dict):
        d: dict[Any, Any] = r
        for modname, m in list(sys.modules.items()):
            if getattr(m, "__dict__", None) is d:
                key = _key_of(d, child)
                if modname == "__main__" or key is None:
                    return None
                return Found("global", f"{modname}.{key}", "a global of an imported module")
        hook = _hook_of(d, child, module_names)
        if hook is not None:
            return hook
    if isinstance(r, types.FunctionType) and isinstance(child, tuple) and chain:
        return None  # a closure's cells: go on up to where the function is kept
    return None


def _hook_of(d: dict[Any, Any], fn: Any, module_names: Mapping[int, str]) -> Found | None:
    """``d`` is a module's hook dict holding ``fn``: a Found that removes the hook."""
    key = _key_of(d, fn)
    if key is None:
        return None
    for owner in gc.get_referrers(d):
        attrs = getattr(owner, "__dict__", None) if not isinstance(owner, dict) else None
        if not isinstance(attrs, dict):
            continue
        for attr in HOOK_DICTS:
            if attrs.get(attr) is d:
                name = module_names.get(id(owner), f"a {type(owner).__name__}")

                def remove(owner: Any = owner, attr: str = attr, key: Any = key) -> None:
                    getattr(owner, attr).pop(key, None)
                    for extra in _HOOK_EXTRAS:
                        getattr(owner, extra, {}).pop(key, None)

                return Found(
                    "hook",
                    f"{name}.{attr}[{key}]",
                    f"a hook on {name} whose closure holds it",
                    remove,
                )
    return None


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
