"""The kernel side of the panel protocol: validate a request, run one of a fixed set of
actions, build the reply. Transport (control channel, comm) lives in ``_kernel.py``.

``schema.json`` beside this file is the single source of truth: request arguments are
validated from it, and tests validate every reply and comm message against it. The kernel
never evaluates code sent to it: an action is a name looked up in :data:`ACTIONS`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from .. import actions
from .._version import __version__

if TYPE_CHECKING:
    from .._ipython.session import Session
    from .stream import SampleStream

PROTOCOL_VERSION = 1
# Additions an older peer can ignore (new actions, new optional fields) raise the revision
# and keep the protocol version; a frontend checks ``hello``'s ``actions`` before using one.
# 2: who, track, release_traceback; CellMarker.kept_at and .postmortems; error code busy.
# 3: segments, history.
# 4: Device.children (the kernel's child processes on the device).
# 5: hello.tracking; track's tracking as {active, wanted}; WhoRow.site and kind "rest";
#    PostMortem.execution_count and .time.
# 6: Fix.first_step and .shortfall; PostMortem.need, .need_full, .room and .hint (fixes are
#    judged against what the failed cell needs).
PROTOCOL_REVISION = 6
REQUEST = "gpumem_request"
REPLY = "gpumem_reply"
COMM_TARGET = "jupyter_gpumem"


@cache
def schema() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("schema.json").read_text()
    return dict(json.loads(text))


class ProtocolError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_TYPES: dict[str, Callable[[Any], bool]] = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
}


def validate_args(action: str, args: Any) -> dict[str, Any]:
    """Check ``args`` against the action's schema (the subset the schema uses)."""
    spec = schema()["actions"][action]
    if not isinstance(args, dict):
        raise ProtocolError("bad_request", f"{action}: args must be an object")
    props: dict[str, Any] = spec.get("properties", {})
    extra = sorted(set(args) - set(props))
    if extra:
        raise ProtocolError("bad_request", f"{action}: unknown argument(s) {', '.join(extra)}")
    for name in spec.get("required", []):
        if name not in args:
            raise ProtocolError("bad_request", f"{action}: missing argument {name}")
    for name, value in args.items():
        p = props[name]
        if "enum" in p:
            if value not in p["enum"]:
                choices = ", ".join(map(str, p["enum"]))
                raise ProtocolError("bad_request", f"{action}: {name} must be one of {choices}")
            continue
        if not _TYPES[p["type"]](value):
            raise ProtocolError("bad_request", f"{action}: {name} must be a {p['type']}")
        if "minLength" in p and len(value) < p["minLength"]:
            raise ProtocolError("bad_request", f"{action}: {name} is too short")
        if "maxLength" in p and len(value) > p["maxLength"]:
            raise ProtocolError("bad_request", f"{action}: {name} is too long")
        if "minimum" in p and value < p["minimum"]:
            raise ProtocolError("bad_request", f"{action}: {name} must be >= {p['minimum']}")
        if "maximum" in p and value > p["maximum"]:
            raise ProtocolError("bad_request", f"{action}: {name} must be <= {p['maximum']}")
        if "exclusiveMinimum" in p and value <= p["exclusiveMinimum"]:
            raise ProtocolError(
                "bad_request", f"{action}: {name} must be > {p['exclusiveMinimum']}"
            )
    return dict(args)


ShellRunner = Callable[[Callable[[], dict[str, Any]]], dict[str, Any]]


def run_here_when_idle(session: Session) -> ShellRunner:
    """Without a kernel (tests, plain IPython): run at once, unless a cell runs."""

    def run(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        if session.busy:
            raise ProtocolError("busy", BUSY)
        return fn()

    return run


BUSY = "busy: available when the cell ends"


class Handler:
    """Answers requests for one session. Runs on ipykernel's control thread: keep it fast.
    Actions that read the user's namespace run on the shell thread, only between cells
    (``on_shell``, from ``_kernel.py``); while a cell runs they answer ``busy``."""

    def __init__(
        self, session: Session, stream: SampleStream, on_shell: ShellRunner | None = None
    ) -> None:
        self.session = session
        self.stream = stream
        self.on_shell = on_shell if on_shell is not None else run_here_when_idle(session)

    @property
    def collector(self) -> Any:
        return self.session.collector

    def handle(self, content: Any) -> dict[str, Any]:
        action = content.get("action") if isinstance(content, Mapping) else None
        action = action if isinstance(action, str) else None
        try:
            if not isinstance(content, Mapping):
                raise ProtocolError("bad_request", "the request content must be an object")
            if content.get("protocol") != PROTOCOL_VERSION:
                raise ProtocolError(
                    "unsupported_protocol",
                    f"this kernel speaks protocol {PROTOCOL_VERSION}, "
                    f"got {content.get('protocol')!r}",
                )
            if action is None:
                raise ProtocolError("bad_request", "missing action")
            method = ACTIONS.get(action)
            if method is None:
                raise ProtocolError("unknown_action", f"unknown action {action!r}")
            args = validate_args(action, content.get("args", {}))
            result = method(self, **args)
        except ProtocolError as e:
            return _error(action, e.code, e.message)
        except actions.Busy:
            return _error(action, "busy", BUSY)
        except actions.ActionRefused as e:
            return _error(action, "refused", str(e))
        except Exception as e:  # the tool failed; the kernel must keep working
            return _error(action, "failed", f"{type(e).__name__}: {e}")
        return {"protocol": PROTOCOL_VERSION, "action": action, "status": "ok", "result": result}

    # -- actions -------------------------------------------------------------------
    def hello(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL_VERSION,
            "revision": PROTOCOL_REVISION,
            "tracking": self._tracking(),
            "version": __version__,
            "actions": list(ACTIONS),
            "sample": self.collector.measure().to_dict(),
            "stream": self.stream.state(),
        }

    def sample(self) -> dict[str, Any]:
        return {"sample": self.collector.measure().to_dict()}

    def empty_cache(self, collect_garbage: bool = False) -> dict[str, Any]:
        r = actions.empty_cache(self.collector, collect_garbage=collect_garbage)
        return {"released": {str(k): v for k, v in r.released.items()}, "sample": r.after.to_dict()}

    def set_caching(self, enabled: bool) -> dict[str, Any]:
        r = actions.set_caching(self.collector, enabled)
        return {"caching": r.caching, "sample": r.after.to_dict()}

    def reset_peak(self, device: int | None = None) -> dict[str, Any]:
        return {"sample": actions.reset_peak(self.collector, device).to_dict()}

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
        return {"limit": limit, "sample": r.after.to_dict()}

    def subscribe(
        self, interval_ms: int, heartbeat_ms: int = 2000, client: str = ""
    ) -> dict[str, Any]:
        return {"stream": self.stream.subscribe(interval_ms, heartbeat_ms, client)}

    def unsubscribe(self, client: str = "") -> dict[str, Any]:
        return {"stream": self.stream.unsubscribe(client)}

    def who(self, device: int | None = None, n: int = 10) -> dict[str, Any]:
        attributor = self.session.attributor
        if device is not None:
            actions.check_device(self.collector, device)

        def read() -> dict[str, Any]:
            held = attributor.read(None if device is None else [device])
            return {
                "devices": [
                    {
                        "index": d,
                        "by_variable": h.report("variable", n).to_dict(),
                        "by_line": h.report("line", n).to_dict() if h.tracking else None,
                    }
                    for d, h in sorted(held.items())
                ],
                "tracking": attributor.tracking,
                "postmortems": [p.to_dict() for p in attributor.last_postmortems],
            }

        return self.on_shell(read)

    def segments(self, device: int | None = None, max_segments: int = 200) -> dict[str, Any]:
        if device is not None:
            actions.check_device(self.collector, device)
        maps = self.session.attributor.segment_maps(device, max_segments)
        return {"devices": [m.to_dict() for m in maps]}

    def history(self, n: int = 200) -> dict[str, Any]:
        return {"cells": self.session.history.cells(n)}

    def _tracking(self) -> dict[str, bool]:
        """``active``: sites are being recorded; ``wanted``: asked for (recording starts
        once torch is imported)."""
        a = getattr(self.session, "attributor", None)  # a bare session (tests) has none
        if a is None:
            return {"active": False, "wanted": False}
        return {"active": a.tracking, "wanted": a.recording.wanted}

    def track(self, enabled: bool) -> dict[str, Any]:
        message = self.session.attributor.set_tracking(enabled)
        return {"tracking": self._tracking(), "message": message}

    def release_traceback(self) -> dict[str, Any]:
        attributor = self.session.attributor

        def release() -> dict[str, Any]:
            r = attributor.release_traceback()
            return {"frames": r.frames, "freed": {str(k): v for k, v in r.freed.items()}}

        return self.on_shell(release)


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
}


def _error(action: str | None, code: str, message: str) -> dict[str, Any]:
    return {
        "protocol": PROTOCOL_VERSION,
        "action": action,
        "status": "error",
        "error": {"code": code, "message": message},
    }
