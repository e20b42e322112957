"""Which torch this process has imported and what it was built for, asked in one place.

For every module that must know whether there is a GPU allocator to read or act on: the
collectors, the core services and the front ends' refusals ("needs a CUDA build of
torch"). It never imports torch (the tool must not import what the user has not:
:func:`imported_torch` reads ``sys.modules``) and never starts CUDA (``torch.version``
and ``torch.cuda.is_initialized`` ask nothing of the driver). Each answer is one or two
attribute reads, cheap enough for a cell's path.

A build is told by ``torch.version``: ``cuda`` is set on a CUDA build, ``hip`` on a ROCm
build (whose GPUs PyTorch still calls ``cuda``), neither on a CPU-only build.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from typing import Any

from ..model import BackendName

# imported_torch(): the ``torch`` module if the user's code imported it, else None. A
# partial of dict.get, not a function of ours: asked twice a measured cell, it must cost
# no more than the lookup itself.
imported_torch: Callable[[], Any] = partial(sys.modules.get, "torch")


def torch_version() -> str | None:
    """The version of the torch this process imported, or None (never imports it)."""
    t = imported_torch()
    version = getattr(t, "__version__", None) if t is not None else None
    return str(version) if version is not None else None


def gpu_build(t: Any) -> bool:
    """Whether torch module ``t`` is a CUDA or a ROCm build: it has the caching allocator
    the tool reads. False for None and for a CPU-only build."""
    v = getattr(t, "version", None)
    return bool(getattr(v, "cuda", None) or getattr(v, "hip", None))


def rocm_build(t: Any) -> bool:
    """Whether torch module ``t`` is a ROCm (HIP) build."""
    return bool(getattr(getattr(t, "version", None), "hip", None))


def gpu_backend(t: Any) -> BackendName:
    """The backend a GPU build of torch reads through: ``"rocm"`` or ``"cuda"``."""
    return "rocm" if rocm_build(t) else "cuda"


def cuda_ready(t: Any) -> bool:
    """Whether ``t`` is a GPU build that has started CUDA in this process (asked without
    starting it): only then may the allocator be read without creating a context."""
    return gpu_build(t) and bool(t.cuda.is_initialized())


def torch_installed() -> bool:
    """Whether this Python could import torch: found, not imported."""
    import importlib.util

    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def externally_managed(stdlib: str | None = None, in_venv: bool | None = None) -> bool:
    """Whether pip refuses to install into this Python (PEP 668): its standard library
    holds an ``EXTERNALLY-MANAGED`` file (the system Python of Debian and Ubuntu) and it
    is not a virtual environment, where pip ignores that file."""
    import os
    import sysconfig

    if in_venv is None:
        in_venv = sys.prefix != sys.base_prefix
    if in_venv:
        return False
    if stdlib is None:
        stdlib = sysconfig.get_paths()["stdlib"]
    return os.path.isfile(os.path.join(stdlib, "EXTERNALLY-MANAGED"))


def install_hint(executable: str | None = None, managed: bool | None = None) -> str:
    """How to install torch for this kernel (the tool never installs it): with this
    Python's pip, or, where the system manages this Python, into a virtual environment
    that the notebook then runs on as its kernel."""
    if managed is None:
        managed = externally_managed()
    if managed:
        return (
            "this Python is the system's (externally managed, PEP 668), so pip will not "
            "install into it: make a virtual environment (python3 -m venv ENV), install "
            "torch into it as PyTorch's instructions say for your CUDA version, with "
            "ipykernel and jupyter-gpumem, and run the notebook on its kernel "
            "(ENV/bin/python -m ipykernel install --user --name ENV)"
        )
    return (
        "install it as PyTorch's instructions say for your CUDA version, "
        f"e.g. {executable or sys.executable} -m pip install torch"
    )


_ASK: Any = object()  # why_no_gpu's default torch: the one imported now


def why_no_gpu(
    feature: str | None,
    t: Any = _ASK,
    *,
    needs: str = "build",
    where: str = "kernel",
    before_cell: str | None = None,
    state: str | None = None,
    version: str | None = None,
) -> str | None:
    """The one wording of "there is no GPU for this": why ``feature`` (``"--scan"``,
    ``"who()"``) can't run here, or None when it can. Every front end that refuses for
    want of torch or a GPU says it through here.

    Asked of torch module ``t`` (by default the imported one, :func:`imported_torch`;
    None: not imported), or, with ``state``, of a reading's state (``"no_torch"``,
    ``"cpu_only"``, ``"no_gpu"``, ``"not_initialized"``) and its torch ``version``.
    ``needs``: ``"build"`` refuses without torch or with a CPU-only build; ``"gpu"`` also
    where torch sees no GPU; ``"memory"`` also where CUDA is not initialised (no GPU
    memory of PyTorch's yet). ``before_cell``: the feature is a cell's option, set up
    before the cell runs, for this reason; torch not imported is then told apart from
    torch not installed. Without a ``feature``, the reason alone, for a sentence that
    says itself what it can't do."""
    if state is None:
        if t is _ASK:
            t = imported_torch()
        if t is None:
            state = "no_torch"
        else:
            version = str(getattr(t, "__version__", "?"))
            if not gpu_build(t):
                state = "cpu_only"
            elif needs == "memory" and not cuda_ready(t):
                state = "not_initialized"
            elif needs == "gpu" and not t.cuda.is_initialized() and not t.cuda.is_available():
                state = "no_gpu"
            else:
                return None
    if state == "no_torch" and before_cell is not None:
        if not torch_installed():
            why = f"torch is not installed in this {where}; {install_hint()}"
        else:
            why = (
                "torch was not imported when the cell began: import torch before the cell, "
                f"as {before_cell} (the tool never imports it itself)"
            )
    elif state == "no_torch":
        why = f"torch is not imported in this {where}"
    elif state == "cpu_only":
        why = f"torch {version} is a CPU-only build"
    elif state == "no_gpu":
        why = f"torch {version} finds no GPU"
    elif state == "not_initialized" and needs == "memory":
        why = f"CUDA is not initialised in this {where} yet"
    else:
        return None
    return why if feature is None else f"{feature} needs torch and a CUDA GPU: {why}"
