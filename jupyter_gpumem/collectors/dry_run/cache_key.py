"""A faster key for the fake mode's cache of op results.

``FakeTensorMode`` answers an op it has seen with the same inputs from a cache, keyed by
the op and each input's metadata; building that key is most of the cost of a cached op
(about 200 of 330 µs for an ``add`` on a 2-core CPU: ``extract_tensor_metadata`` makes a
dataclass per tensor and flattens it field by field). A ``generate()`` of 64 tokens runs
over 50,000 ops, nearly all cached.

:func:`install` gives one fake mode a key built from the same facts in one tuple per
tensor: dtype, shape, strides, device, layout, storage offset and size, requires_grad,
conjugate and negative bits, inference. torch's key also holds the memory format and
whether the tensor is quantized, which the shape and strides and the dtype decide. The
key starts with a marker of its own, so it never meets a key made by torch's code (the
cache is shared by every fake mode of the process). Anything the fast key does not
handle (symbolic sizes, a shape environment, sparse tensors, graph modules, callables) is
keyed by torch's own code, as before; an input torch refuses to key (a real tensor, a
constant) is refused the same way.
"""

from __future__ import annotations

from typing import Any

_MARKER = ("jupyter_gpumem.dry_run", 1)


class _Slow(Exception):
    """An input the fast key leaves to torch's own key."""


def install(mode: Any) -> bool:
    """Give ``mode`` the fast key; False (nothing changed) where this torch's cache is not
    the one this was written against."""
    import inspect

    try:
        from torch._subclasses import fake_tensor as ft
    except ImportError:
        return False
    original = getattr(type(mode), "_cache_key", None)
    needed = ("_DispatchCacheKey", "_BypassDispatchCache", "FakeTensor")
    if original is None or not all(hasattr(ft, n) for n in needed):
        return False
    try:
        params = list(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        return False
    if params != ["self", "state", "func", "args", "kwargs"]:
        return False
    mode._cache_key = _fast_key(mode, original, ft)
    return True


def _fast_key(mode: Any, original: Any, ft: Any) -> Any:
    import torch

    FakeTensor = ft.FakeTensor
    Bypass = ft._BypassDispatchCache
    Key = ft._DispatchCacheKey
    Tensor = torch.Tensor
    strided = torch.strided
    default_dtype = torch.get_default_dtype
    default_device = torch._C._get_default_device
    inference = torch.is_inference_mode_enabled
    plain: tuple[type, ...] = (int, float, bool, str, type(None), torch.dtype, torch.device)
    plain += (torch.layout, torch.memory_format)
    sym = (torch.SymInt, torch.SymFloat, torch.SymBool)

    def tensor(t: Any) -> tuple[Any, ...]:
        if t.fake_mode is not mode:
            raise Bypass("not our fake")
        if t.constant is not None:
            raise Bypass("constant attribute")
        if t.layout is not strided or t._has_symbolic_sizes_strides:
            raise _Slow
        return (
            t.dtype,
            tuple(t.shape),
            t.stride(),
            t.device,
            t.storage_offset(),
            t.untyped_storage().nbytes(),
            t.requires_grad,
            t.is_conj(),
            t.is_neg(),
            t.is_inference(),
        )

    def flat(out: list[Any], args: Any) -> None:
        for a in args:
            if type(a) is FakeTensor or isinstance(a, FakeTensor):
                out.append(tensor(a))
            elif isinstance(a, plain):
                out.append(type(a))
                out.append(a)
            elif isinstance(a, (list, tuple)):
                out.append(type(a))
                out.append(len(a))
                flat(out, a)
            elif isinstance(a, Tensor):
                raise Bypass("non-fake tensor")
            elif isinstance(a, sym):
                raise _Slow
            else:  # callables, graph modules, dicts, anything else: torch's own key
                raise _Slow

    def cache_key(state: Any, func: Any, args: Any, kwargs: Any) -> Any:
        if mode.shape_env is not None:
            return original(mode, state, func, args, kwargs)
        out: list[Any] = [_MARKER, func, default_dtype(), default_device(), inference()]
        try:
            if args:
                flat(out, args)
            if kwargs:
                out.append(tuple(kwargs))
                flat(out, kwargs.values())
        except _Slow:
            return original(mode, state, func, args, kwargs)
        return Key(tuple(out))

    return cache_key
