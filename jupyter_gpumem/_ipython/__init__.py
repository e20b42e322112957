"""IPython front end: ``load_ipython_extension`` / ``unload_ipython_extension``."""

from __future__ import annotations

from typing import Any

from .session import Session

_SESSIONS: dict[int, Session] = {}  # id(shell) -> session; one per shell however loaded


def load(shell: Any) -> Session:
    """Register magics, the input transformer and cell events. Idempotent: loading as
    ``gpumem`` and as ``jupyter_gpumem`` gives one session."""
    existing = _SESSIONS.get(id(shell))
    if existing is not None:
        return existing
    from .magics import GpuMemMagics

    session = Session(shell)
    magics = GpuMemMagics(shell, session)
    shell.register_magics(magics)
    shell.input_transformers_cleanup.append(session.transform)
    shell.events.register("pre_run_cell", session.pre_run_cell)
    shell.events.register("post_run_cell", session.post_run_cell)
    session.magics = magics  # type: ignore[attr-defined]
    _SESSIONS[id(shell)] = session
    from .. import _kernel

    _kernel.attach(session)
    return session


def unload(shell: Any) -> None:
    """Remove everything ``load`` registered."""
    session = _SESSIONS.pop(id(shell), None)
    if session is None:
        return
    from .. import _kernel

    _kernel.detach(session)
    if session.transform in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.remove(session.transform)
    for name, cb in (
        ("pre_run_cell", session.pre_run_cell),
        ("post_run_cell", session.post_run_cell),
    ):
        try:
            shell.events.unregister(name, cb)
        except ValueError:
            pass
    for kind in ("line", "cell"):
        shell.magics_manager.magics[kind].pop("gpumem", None)
    registry = shell.magics_manager.registry
    registry.pop("GpuMemMagics", None)
    session.tracker.cancel()
    if session.tracker.workers is not None:
        session.tracker.workers.close()
    import sys

    session.attributor.recording.stop(sys.modules.get("torch"))  # only if we started it


def current() -> Session | None:
    """The session of the running IPython shell, if the extension is loaded there."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return _SESSIONS.get(id(shell)) if shell is not None else None
