"""Answers the panel's requests: one method per action of schema.json.

Depends on a small :class:`Services` interface (the collector, the who and post-mortem
services, the history, whether a cell runs, who listens to its reports), not on a front
end: IPython's session provides it, and the kernel front end and the widget depend on it
alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .._version import __version__
from ..core import actions
from ..errors import ActionRefused, ProtocolError
from . import BUSY, PROTOCOL_VERSION, check_request, error_reply, schema
from .convert import last_cell, to_protocol

if TYPE_CHECKING:
    from ..collectors import Collector
    from ..core.free import Frees
    from ..core.history import History
    from ..core.postmortem import PostMortems
    from ..core.who import Who
    from ..model import CellReport
    from .stream import SampleStream


class Services(Protocol):
    """What the protocol, the kernel front end and the widget need of the kernel's state
    (IPython's session has it)."""

    collector: Collector
    history: History
    busy: bool  # a cell is running
    last_report: CellReport | None  # the last measured cell's report
    report_listeners: list[Callable[[CellReport], None]]  # called with each cell's report

    @property
    def who(self) -> Who | None:
        """Who holds the memory, tracking (None: not available in this kernel)."""
        ...

    @property
    def postmortems(self) -> PostMortems | None:
        """The last failure's post-mortems, the kept traceback (None: not available)."""
        ...

    @property
    def frees(self) -> Frees | None:
        """Letting go of what holds named objects (None: not available in this kernel)."""
        ...


ShellRunner = Callable[[Callable[[], dict[str, Any]]], dict[str, Any]]


def run_here_when_idle(services: Services) -> ShellRunner:
    """Without a kernel (tests, plain IPython): run at once, unless a cell runs."""

    def run(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        if services.busy:
            raise ProtocolError("busy", BUSY)
        return fn()

    return run


class Handler:
    """Answers requests for one kernel. Runs on ipykernel's control thread: keep it fast.
    Actions that read the user's namespace run on the shell thread, only between cells
    (``on_shell``, from the kernel front end); while a cell runs they answer ``busy``."""

    def __init__(
        self, services: Services, stream: SampleStream, on_shell: ShellRunner | None = None
    ) -> None:
        self.services = services
        self.stream = stream
        self.on_shell = on_shell if on_shell is not None else run_here_when_idle(services)

    @property
    def collector(self) -> Collector:
        return self.services.collector

    @property
    def who_service(self) -> Who:
        a = self.services.who
        if a is None:
            raise ActionRefused("attribution is not available in this kernel")
        return a

    @property
    def postmortems(self) -> PostMortems:
        a = self.services.postmortems
        if a is None:
            raise ActionRefused("attribution is not available in this kernel")
        return a

    def handle(self, content: Any) -> dict[str, Any]:
        action: str | None = None
        try:
            action, args = check_request(content)
            result = ACTIONS[action](self, **args)
        except ProtocolError as e:
            return error_reply(action, e.code, e.message)
        except ActionRefused as e:
            return error_reply(action, "refused", str(e))
        except Exception as e:  # the tool failed; the kernel must keep working
            return error_reply(action, "failed", f"{type(e).__name__}: {e}"[:2000])
        return {"protocol": PROTOCOL_VERSION, "action": action, "status": "ok", "result": result}

    # -- actions -------------------------------------------------------------------
    def hello(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL_VERSION,
            "revision": schema()["protocol_revision"],
            "tracking": self._tracking(),
            "version": __version__,
            "actions": list(ACTIONS),
            "sample": to_protocol(self.collector.measure()),
            "stream": self.stream.state(),
        }

    def sample(self) -> dict[str, Any]:
        return {"sample": to_protocol(self.collector.measure())}

    def empty_cache(self, collect_garbage: bool = False) -> dict[str, Any]:
        r = actions.empty_cache(self.collector, collect_garbage=collect_garbage)
        return {
            "released": {str(k): v for k, v in r.released.items()},
            "sample": to_protocol(r.after),
        }

    def set_caching(self, enabled: bool) -> dict[str, Any]:
        r = actions.set_caching(self.collector, enabled)
        return {"caching": r.caching, "sample": to_protocol(r.after)}

    def reset_peak(self, device: int | None = None) -> dict[str, Any]:
        return {"sample": to_protocol(actions.reset_peak(self.collector, device))}

    def set_limit(
        self, device: int | None = None, bytes: int | None = None, fraction: float | None = None
    ) -> dict[str, Any]:
        if bytes is not None and fraction is not None:
            raise ProtocolError("bad_request", "set_limit: give bytes or fraction, not both")
        if device is None:
            ready = self.collector.backend.initialized_devices()
            device = ready[0] if ready else 0
        r = actions.set_limit(
            self.collector,
            device,
            fraction=None if fraction is None else float(fraction),
            nbytes=bytes,
        )
        limit = None if r.fraction is None else {"fraction": r.fraction, "bytes": r.bytes}
        return {"limit": limit, "sample": to_protocol(r.after)}

    def subscribe(
        self, interval_ms: int, heartbeat_ms: int = 2000, client: str = ""
    ) -> dict[str, Any]:
        return {"stream": self.stream.subscribe(interval_ms, heartbeat_ms, client)}

    def unsubscribe(self, client: str = "") -> dict[str, Any]:
        return {"stream": self.stream.unsubscribe(client)}

    def who(self, device: int | None = None, n: int = 10) -> dict[str, Any]:
        who = self.who_service
        postmortems = self.postmortems
        if device is not None:
            actions.check_device(self.collector, device)

        def read() -> dict[str, Any]:
            held = who.read(None if device is None else [device])
            return {
                "devices": [
                    {
                        "index": d,
                        "by_variable": to_protocol(h.report("variable", n)),
                        "by_line": to_protocol(h.report("line", n)) if h.tracking else None,
                    }
                    for d, h in sorted(held.items())
                ],
                "tracking": who.tracking,
                "postmortems": [to_protocol(p) for p in postmortems.last],
            }

        return self.on_shell(read)

    def segments(
        self,
        device: int | None = None,
        max_segments: int = 200,
        rank: int | None = None,
        pid: int | None = None,
    ) -> dict[str, Any]:
        if rank is not None or pid is not None:
            return self._worker_segments(device, max_segments, rank, pid)
        if device is not None:
            actions.check_device(self.collector, device)
        maps = self.who_service.segment_maps(device, max_segments)
        return {"devices": [to_protocol(m) for m in maps]}

    def _worker_segments(
        self, device: int | None, max_segments: int, rank: int | None, pid: int | None
    ) -> dict[str, Any]:
        """A worker's map: asked through the channel's directory, waiting at most 2 s (the
        kernel front end runs it off the control thread: :data:`WAITS_FOR_A_WORKER`; a
        worker that does not answer is refused with that sentence)."""
        from ..core.worker_segments import worker_segment_maps

        found, maps = worker_segment_maps(rank, pid, device, max_segments)
        w = found.worker
        return {
            "devices": [to_protocol(m) for m in maps],
            "worker": {
                "pid": w.pid,
                "rank": w.rank,
                "host": w.host,
                "label": w.label,
                "note": found.note,
                "trimmed": found.trimmed,
            },
        }

    def history(self, n: int = 200) -> dict[str, Any]:
        return {"cells": [to_protocol(row) for row in self.services.history.last(n)]}

    def last_cell(self) -> dict[str, Any]:
        report = self.services.last_report
        if report is None:
            return {"cell": None}
        return {"cell": last_cell(report, self._tracking()["active"])}

    def _tracking(self) -> dict[str, bool]:
        """``active``: sites are being recorded; ``wanted``: asked for (recording starts
        once torch is imported)."""
        a = self.services.who  # a bare session (tests) has none
        if a is None:
            return {"active": False, "wanted": False}
        return {"active": a.tracking, "wanted": a.recording.wanted}

    def track(self, enabled: bool) -> dict[str, Any]:
        message = self.who_service.set_tracking(enabled)
        return {"tracking": self._tracking(), "message": message}

    def release_traceback(self) -> dict[str, Any]:
        postmortems = self.postmortems

        def release() -> dict[str, Any]:
            r = postmortems.release_traceback()
            return {"frames": r.frames, "freed": {str(k): v for k, v in r.freed.items()}}

        return self.on_shell(release)

    def free(self, names: list[str], dry: bool = False) -> dict[str, Any]:
        frees = self.services.frees
        if frees is None:
            raise ActionRefused("freeing is not available in this kernel")

        def free() -> dict[str, Any]:
            report = frees.free(names, dry=dry)
            return {"report": to_protocol(report), "sample": to_protocol(self.collector.measure())}

        return self.on_shell(free)


# Actions that read the user's namespace: the kernel runs them on the shell thread, between
# cells, and replies when they end (the control thread stays free for samples).
READS_NAMESPACE = frozenset({"who", "release_traceback", "free"})
# Actions that wait for a worker process when given ``rank`` or ``pid``: the kernel runs
# them off its control thread and replies when they end.
WAITS_FOR_A_WORKER = frozenset({"segments"})

ACTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "hello": Handler.hello,
    "sample": Handler.sample,
    "empty_cache": Handler.empty_cache,
    "set_caching": Handler.set_caching,
    "reset_peak": Handler.reset_peak,
    "set_limit": Handler.set_limit,
    "subscribe": Handler.subscribe,
    "unsubscribe": Handler.unsubscribe,
    "who": Handler.who,
    "track": Handler.track,
    "release_traceback": Handler.release_traceback,
    "segments": Handler.segments,
    "history": Handler.history,
    "free": Handler.free,
    "last_cell": Handler.last_cell,
}
