"""A path from a root to an object, kept as ``(parent, how, key)`` tuples while the walk
runs and spelled out (:func:`spell`) only for the objects that turn out to be tensors."""

from __future__ import annotations

from typing import Any

# A path from a root: its name, or (parent path, how, key), spelled out only when needed.
Path = Any


def spell(path: Path) -> str:
    """``acts[3]``, ``trainer.cache['a']``, ``opt.state[0]['exp_avg']``."""
    if type(path) is tuple and type(path[0]) is str:  # one hop from a root: most tensors
        parent, how, key = path
        if how == "[]":
            return f"{parent}[{key}]"
        if how == ".":
            return f"{parent}.{key}"
    parts: list[str] = []
    while isinstance(path, tuple):
        path, how, key = path
        if how == "[]" or how == ".state" or how == ".param_groups":
            parts.append(f"{how if how != '[]' else ''}[{key}]")
        elif how == "[k]":
            parts.append(f"[{_key(key)}]")
        elif how == ".":
            parts.append(f".{key}")
        elif how == "{}":
            parts.append("{…}")
        else:
            parts.append(how)
    parts.append(str(path))
    return "".join(reversed(parts))


def _key(k: Any) -> str:
    if isinstance(k, str):
        return repr(k) if len(k) <= 40 else repr(k[:37] + "...")
    if isinstance(k, (int, float, bool)) or k is None:
        return repr(k)
    return f"<{type(k).__name__}>"
