"""IPython front end: ``load_ipython_extension`` / ``unload_ipython_extension``, and the
one place a session's services are composed (:func:`compose`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..collectors.torch_build import imported_torch
from .session import GpuMem, Session
from .sessions import SESSIONS
from .sessions import current as current
from .sessions import is_loaded as is_loaded

if TYPE_CHECKING:
    from ..collectors import Collector
    from ..core.attribution import AttributionSource


def compose(
    shell: Any,
    collector: Collector | None = None,
    attribution: AttributionSource | None = None,
) -> Session:
    """The session of ``shell`` and its services, each given what it needs. The sources are
    chosen here, once: the collector's backend and the attribution source are those given,
    else those the environment names (``collectors.plugged``), else the live ones; the worker
    sources (the kernel's worker channel, Ray) are handed to the collector (one given with
    none gets them too) and the tracker."""
    from ..collectors import ATTRIBUTION_ENV, Collector, plugged, worker_sources, workers
    from ..core.breakdown import Breakdowns
    from ..core.free import Frees
    from ..core.history import History
    from ..core.postmortem import PostMortems
    from ..core.trace import Traces
    from ..core.tracker import CellTracker
    from ..core.who import Who
    from .cells import IPythonWorkspace

    config = GpuMem(parent=shell)
    collector = collector or Collector()
    if not collector.workers:
        collector.workers = worker_sources.sources()
    if attribution is None:
        attribution = plugged(ATTRIBUTION_ENV)
    workspace = IPythonWorkspace(shell)
    who = Who(workspace, attribution, track=config.track)
    return Session(
        shell,
        config,
        collector,
        CellTracker(collector, workers.channel(), worker_sources.CELL_FEEDS),
        History(config.history_size),
        who,
        PostMortems(workspace, collector, who),
        Traces(who),
        Breakdowns(workspace),
        Frees(workspace, collector, who),
    )


def load(shell: Any, collector: Collector | None = None) -> Session:
    """Register magics, the input transformer and cell events. Idempotent: loading as
    ``gpumem`` and as ``jupyter_gpumem`` gives one session. ``collector``: the one the
    session is composed with (tests give theirs), else the environment's or the live one."""
    existing = SESSIONS.get(id(shell))
    if existing is not None:
        return existing
    from .magics import GpuMemMagics

    session = compose(shell, collector)
    shell.register_magics(GpuMemMagics(shell, session))
    shell.input_transformers_cleanup.append(session.transform)
    shell.events.register("pre_run_cell", session.pre_run_cell)
    shell.events.register("post_run_cell", session.post_run_cell)
    SESSIONS[id(shell)] = session
    # A plugged backend that plays cells back (the demo's kernel) is handed the session.
    bind = getattr(session.collector.backend, "bind_session", None)
    if callable(bind):
        bind(session)
    from .. import _kernel

    _kernel.attach(session, getattr(shell, "kernel", None))
    return session


def unload(shell: Any) -> None:
    """Remove everything ``load`` registered."""
    session = SESSIONS.pop(id(shell), None)
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
    session.who.recording.stop(imported_torch())  # only if we started it
