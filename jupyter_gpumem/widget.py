"""``%gpumem panel``: live bars and buttons as an ipywidgets widget, for frontends without
the JupyterLab extension (VS Code, Notebook 7, Colab-like UIs).

The bars update from a daemon thread while cells run (widget updates travel on IOPub).
Button clicks travel as comm messages on the shell channel, so the kernel handles them
when the running cell ends; only the JupyterLab panel's control-channel buttons act during
a cell. The buttons, their words and when they are off follow the JupyterLab panel's
(``labextension/src/views/overview/controls.tsx``, ``capControl.tsx``, ``present/messages.ts``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from .core import actions
from .errors import ActionRefused
from .protocol.convert import to_protocol
from .protocol.stream import SampleStream
from .reporters.actions import (
    RESET_PEAK_STATUS,
    caching_status,
    empty_cache_status,
    limit_status,
)
from .reporters.bars import STATE_TITLES, BarScale, sample_html
from .units import cuda_label, format_bytes

if TYPE_CHECKING:
    from .protocol.handler import Services

Action = Literal["empty_cache", "set_caching", "reset_peak", "set_limit", "clear_limit"]

# The action's name in messages (present/messages.ts, actionLabel)
LABELS: dict[Action, str] = {
    "empty_cache": "Empty cache",
    "set_caching": "Switching caching",
    "reset_peak": "Reset peak",
    "set_limit": "Set cap",
    "clear_limit": "Set cap",
}
HELP = {
    "empty_cache": "gc.collect(), then torch.cuda.empty_cache(): release cached free blocks "
    "to the driver",
    "caching_off": "Every allocation goes straight to the driver; allocator figures stop "
    "counting new allocations",
    "caching_on": "Let PyTorch keep freed blocks for reuse again",
    "reset_peak": "Set the peak counters to the current figures (for everyone in this kernel)",
    "set_limit": "Cap the bytes PyTorch may reserve on this device (frees nothing)",
    "clear_limit": "Remove the cap",
    "scale": "Switch the bars between the device total and a scale fitted to what this "
    "kernel holds",
}


def cap_device(sample: dict[str, Any]) -> dict[str, Any] | None:
    """The device the cap field acts on: the first with a CUDA context."""
    return next((d for d in sample.get("devices", []) if d.get("initialized")), None)


def availability(sample: dict[str, Any], action: Action, refused: str | None = None) -> str | None:
    """Why ``action`` can't run now, in the JupyterLab panel's words; None when it can.
    ``refused``: the backend's own reason, when it has one (``Backend.actionable``)."""
    state = str(sample.get("state"))
    if state not in ("ok", "not_initialized"):
        return STATE_TITLES.get(state, "Not available now")
    if refused:
        return refused[:1].upper() + refused[1:]
    device = cap_device(sample)
    if action in ("empty_cache", "reset_peak") and device is None:
        return "CUDA is not initialised in this kernel: the allocator holds nothing"
    if action == "set_caching" and sample.get("caching") is None:
        return "The caching state is unknown for this kernel"
    if device is None:
        return "CUDA is not initialised in this kernel"
    if action == "clear_limit" and not device.get("limit"):
        return "No cap is set"
    return None


class _WidgetChannel:
    comm_id = None

    def __init__(self, widget: GpuMemWidget) -> None:
        self.widget = widget

    def send(self, data: dict[str, Any]) -> None:
        if data.get("type") == "sample":
            self.widget.show(data["sample"])
        elif data.get("type") == "cell":
            c = data["cell"]
            self.widget.last_cell.value = (
                f"last measured cell [{c['execution_count']}] {c['first_line'][:40]!r}: "
                + ", ".join(
                    f"{cuda_label(d['index'])} alloc {format_bytes(d['allocated_delta'])}"
                    for d in c["devices"]
                )
            )
        self.widget.keep_alive()


class GpuMemWidget:
    """Owns the ipywidgets tree and its stream."""

    _current: ClassVar[dict[int, GpuMemWidget]] = {}

    def __init__(
        self,
        session: Services,
        interval_ms: int = 500,
        loaded: Callable[[], bool] = lambda: True,
    ) -> None:
        """``loaded``: whether the extension is still loaded for ``session`` (the stream's
        lease is renewed only while it is)."""
        import ipywidgets as w

        self.session = session
        self.interval_ms = interval_ms
        self.loaded = loaded
        self.scale: BarScale = "fit"
        self.sample: dict[str, Any] = {}
        self.bars = w.HTML("")
        self.status = w.HTML("")
        self.last_cell = w.HTML("")
        self.empty = w.Button(description="Empty cache")
        self.caching = w.Button(description="Caching off")
        self.reset = w.Button(description="Reset peak")
        self.cap = w.Text(
            placeholder="24 GiB · 0.3 · off", description="Cap", layout={"width": "220px"}
        )
        self.set_cap = w.Button(description="Set cap")
        self.clear_cap = w.Button(description="Clear cap")
        self.scale_switch = w.Button(tooltip=HELP["scale"], layout={"width": "auto"})
        self.empty.on_click(lambda _: self._do("empty_cache", self._empty))
        self.caching.on_click(lambda _: self._do("set_caching", self._switch_caching))
        self.reset.on_click(lambda _: self._do("reset_peak", self._reset))
        self.set_cap.on_click(lambda _: self._do("set_limit", self._set_cap))
        self.clear_cap.on_click(lambda _: self._do("clear_limit", lambda: self._limit(None)))
        self.scale_switch.on_click(lambda _: self._switch_scale())
        self.box = w.VBox(
            [
                self.bars,
                self.scale_switch,
                w.HBox([self.empty, self.caching, self.reset]),
                w.HBox([self.cap, self.set_cap, self.clear_cap]),
                self.status,
                self.last_cell,
            ]
        )
        self.show(to_protocol(session.collector.measure()))
        self.stream = SampleStream(session.collector, _WidgetChannel(self), lambda: session.busy)
        session.report_listeners.append(self.stream.push_cell)
        self._renewed = time.monotonic()
        self.stream.subscribe(interval_ms)

    @classmethod
    def create(
        cls, session: Services, interval_ms: int = 500, loaded: Callable[[], bool] = lambda: True
    ) -> Any:
        old = cls._current.pop(id(session), None)
        if old is not None:
            old.close()
        widget = cls(session, interval_ms, loaded)
        cls._current[id(session)] = widget
        return widget.box

    def close(self) -> None:
        self.stream.stop()
        if self.stream.push_cell in self.session.report_listeners:
            self.session.report_listeners.remove(self.stream.push_cell)
        self.box.close()

    def keep_alive(self) -> None:
        """Renew the stream's lease while the extension stays loaded in the shell: once it
        is unloaded the lease runs out and the thread stops."""
        now = time.monotonic()
        if now - self._renewed < self.stream.lease_s / 3:
            return
        if self.loaded():
            self._renewed = now
            self.stream.subscribe(self.interval_ms)

    # -- the view ----------------------------------------------------------------------
    def show(self, sample: dict[str, Any]) -> None:
        """Draw ``sample``: the bars, and each button on or off with the reason."""
        self.sample = sample
        self.bars.value = sample_html(sample, self.scale)
        self.scale_switch.description = (
            "Show the device total" if self.scale == "fit" else "Fit to this kernel"
        )
        backend = self.session.collector.backend
        refused = backend.actionable()
        caching_off = sample.get("caching") is False
        self.caching.description = "Caching on" if caching_off else "Caching off"
        caching_why = refused or (backend.caching_supported() if not caching_off else None)
        help_caching = HELP["caching_on" if caching_off else "caching_off"]
        buttons: list[tuple[Any, Action, str, str | None]] = [
            (self.empty, "empty_cache", HELP["empty_cache"], refused),
            (self.caching, "set_caching", help_caching, caching_why),
            (self.reset, "reset_peak", HELP["reset_peak"], refused),
            (self.set_cap, "set_limit", HELP["set_limit"], refused),
            (self.clear_cap, "clear_limit", HELP["clear_limit"], refused),
        ]
        for button, action, help_text, why in buttons:
            reason = availability(sample, action, why)
            button.disabled = reason is not None
            button.tooltip = help_text if reason is None else reason
        self.cap.disabled = self.set_cap.disabled

    def _switch_scale(self) -> None:
        self.scale = "total" if self.scale == "fit" else "fit"
        self.show(self.sample)

    def _do(self, action: Action, fn: Callable[[], str]) -> None:
        try:
            self.status.value = fn()
        except ActionRefused as e:
            self.status.value = (
                "<span style='color:var(--jp-error-color1,#d32f2f)'>"
                f"{LABELS[action]} refused: {e}</span>"
            )
        self.show(to_protocol(self.session.collector.measure()))

    # -- the actions -------------------------------------------------------------------
    def _empty(self) -> str:
        return empty_cache_status(actions.empty_cache(self.session.collector).released)

    def _switch_caching(self) -> str:
        r = actions.set_caching(self.session.collector, self.sample.get("caching") is False)
        return caching_status(r.caching)

    def _reset(self) -> str:
        actions.reset_peak(self.session.collector)
        return RESET_PEAK_STATUS

    def _set_cap(self) -> str:
        return self._limit(*actions.parse_limit(self.cap.value))

    def _limit(self, fraction: float | None = None, nbytes: int | None = None) -> str:
        ready = self.session.collector.backend.initialized_devices()
        if not ready:  # a cap would create a CUDA context: the user did not ask for one
            raise ActionRefused("CUDA is not initialised in this kernel")
        device = ready[0]
        r = actions.set_limit(self.session.collector, device, fraction=fraction, nbytes=nbytes)
        return limit_status(device, r.bytes, r.fraction)
