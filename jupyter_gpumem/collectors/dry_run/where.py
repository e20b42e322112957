"""Where a dry run is and why it stopped, in the user's words.

:func:`locate` names the user's line of a traceback (``In[7] line 3`` for a cell,
``train.py:42`` for a file) and the innermost line outside torch when it is another (a
library's); :func:`here` names the line running now (for a value read to the host);
:func:`describe` turns the exception that stopped the run into a
:data:`~jupyter_gpumem.collectors.dry_run.events.StopKind` and one plain line (a value read,
a shape that depends on values, an op without a fake kernel, anything else). Frames in torch
and in this package are skipped. Used by ``collectors/fake_run.record`` and
``collectors/dry_run/state.py``."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

from .events import StopKind


def _torch_dir(t: Any) -> str:
    return os.path.dirname(t.__file__) + os.sep


def _own_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _library_dirs() -> tuple[str, ...]:
    import sysconfig

    dirs = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(sorted(os.path.abspath(d) + os.sep for d in dirs if d))


def locate(
    tb: TracebackType | None, t: Any, cell_names: Callable[[str], int | None] | None
) -> tuple[str | None, str | None]:
    """(the user's line, the innermost line outside torch) of a traceback."""
    skip = (_torch_dir(t), _own_dir())
    libraries = _library_dirs()
    where = inside = None
    cell = None
    for frame, line in traceback.walk_tb(tb):
        filename = frame.f_code.co_filename
        absolute = os.path.abspath(filename)
        if absolute.startswith(skip) or filename.startswith("<frozen"):
            continue
        count = cell_names(filename) if cell_names is not None else None
        label = f"In[{count}] line {line}" if count is not None else None
        if label is None:
            label = f"{os.path.basename(filename)}:{line}"
        inside = label
        if count is not None:
            cell = label
        elif not absolute.startswith(libraries) or filename.startswith("<"):
            where = label
    return (cell or where or inside), inside


def here(t: Any, cell_names: Callable[[str], int | None] | None) -> str | None:
    """The user's line that is running now (as :func:`locate` names it)."""
    return here_and_text(t, cell_names)[0]


def here_and_text(t: Any, cell_names: Callable[[str], int | None] | None) -> tuple[str | None, str]:
    """The user's line that is running now, and its text ("" when unknown)."""
    import linecache

    skip = (_torch_dir(t), _own_dir())
    libraries = _library_dirs()
    frame = sys._getframe(1)
    inside: tuple[str | None, str] = (None, "")
    while frame is not None:
        filename = frame.f_code.co_filename
        absolute = os.path.abspath(filename)
        if not (absolute.startswith(skip) or filename.startswith("<frozen")):
            text = linecache.getline(filename, frame.f_lineno).strip()
            count = cell_names(filename) if cell_names is not None else None
            if count is not None:
                return f"In[{count}] line {frame.f_lineno}", text
            label = f"{os.path.basename(filename)}:{frame.f_lineno}"
            if inside[0] is None:
                inside = (label, text)
            if not absolute.startswith(libraries) or filename.startswith("<"):
                return label, text
        frame = frame.f_back  # type: ignore[assignment]
    return inside


def caused(e: BaseException | None, by: BaseException) -> bool:
    """Whether ``e`` is ``by`` or was raised while handling it."""
    for _ in range(8):
        if e is None:
            return False
        if e is by:
            return True
        e = e.__cause__ or e.__context__
    return False


def describe(e: BaseException, op: Any, t: Any) -> tuple[StopKind, str | None, str]:
    from torch._subclasses import fake_tensor as ft

    func = getattr(e, "func", None) or op
    name = str(func) if func is not None else None
    if isinstance(e, ft.DataDependentOutputException):
        if name and "_local_scalar_dense" in name:
            text = (
                "a tensor's value is read (.item(), .tolist(), bool(), int(), float(), "
                f"`if tensor`: {name}): a dry run has no values"
            )
            return "value read", name, text
        return "value read", name, f"{name}'s output depends on the tensor's values"
    if isinstance(e, ft.DynamicOutputShapeException):
        text = (
            f"{name}'s output size depends on the tensor's values (unique, repeat_interleave "
            "by a tensor, ...): a dry run can't size it"
        )
        return "dynamic shape", name, text
    if isinstance(e, ft.UnsupportedOperatorException) or "no fake impl registered" in str(e):
        if name and name.startswith(("aten.", "prims.")):
            text = f"{name} has no fake kernel in this torch: a dry run can't run it"
        else:
            text = (
                f"{name} has no fake kernel (a custom op or extension without "
                "torch.library.register_fake): a dry run can't run it"
            )
        return "no fake kernel", name, text
    if "hasPrimaryContext expects a valid device index" in str(e):
        # torch's autograd asks the CUDA runtime about each device it runs a backward on,
        # which fails for fake CUDA tensors where no GPU is visible (seen with torch 2.11)
        text = (
            "this torch sees no GPU (CUDA_VISIBLE_DEVICES, or none here), and its autograd "
            "asks CUDA about the device of each backward, fake or not: a dry run of a "
            "backward on CUDA needs a GPU visible (any card: name the one to plan for with "
            "--fit-in)"
        )
        return "no gpu visible", name, text
    first = next((s for s in str(e).splitlines() if s.strip()), "")
    if len(first) > 200:
        first = first[:199] + "…"
    text = f"{type(e).__name__}: {first}" if first else type(e).__name__
    if name:
        text += f" (in {name})"
    return "error", name, text
