"""``%gpumem panel``: live bars and buttons as an ipywidgets widget, for frontends without
the JupyterLab extension (VS Code, Notebook 7, Colab-like UIs).

The bars update from a daemon thread while cells run (widget updates travel on IOPub).
Button clicks travel as comm messages on the shell channel, so the kernel handles them
when the running cell ends; only the JupyterLab panel's control-channel buttons act during
a cell.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .core import actions
from .errors import ActionRefused
from .protocol.convert import to_protocol
from .protocol.stream import SampleStream
from .reporters.bars import sample_html
from .units import format_bytes as fb
from .units import parse_size

if TYPE_CHECKING:
    from ._ipython.session import Session


class _WidgetChannel:
    comm_id = None

    def __init__(self, widget: GpuMemWidget) -> None:
        self.widget = widget

    def send(self, data: dict[str, Any]) -> None:
        if data.get("type") == "sample":
            self.widget.bars.value = sample_html(data["sample"])
        elif data.get("type") == "cell":
            c = data["cell"]
            self.widget.last_cell.value = (
                f"last measured cell [{c['execution_count']}] {c['first_line'][:40]!r}: "
                + ", ".join(
                    f"cuda:{d['index']} alloc {fb(d['allocated_delta'])}" for d in c["devices"]
                )
            )


class GpuMemWidget:
    """Owns the ipywidgets tree and its stream."""

    _current: ClassVar[dict[int, GpuMemWidget]] = {}

    def __init__(self, session: Session, interval_ms: int = 500) -> None:
        import ipywidgets as w

        self.session = session
        self.bars = w.HTML(sample_html(to_protocol(session.collector.measure())))
        self.status = w.HTML("")
        self.last_cell = w.HTML("")
        self.empty = w.Button(description="Empty cache", tooltip="gc.collect() + empty_cache()")
        self.caching = w.ToggleButton(value=True, description="Caching on")
        self.reset = w.Button(description="Reset peak")
        self.cap = w.Text(placeholder="24GiB or 0.3", description="Cap:", layout={"width": "200px"})
        self.set_cap = w.Button(description="Set cap")
        self.clear_cap = w.Button(description="Clear cap")
        self.empty.on_click(lambda _: self._do(self._empty))
        self.caching.observe(lambda ch: self._do(lambda: self._caching(ch["new"])), "value")
        self.reset.on_click(lambda _: self._do(self._reset))
        self.set_cap.on_click(lambda _: self._do(self._set_cap))
        self.clear_cap.on_click(lambda _: self._do(lambda: self._limit(None)))
        self.box = w.VBox(
            [
                self.bars,
                w.HBox([self.empty, self.caching, self.reset]),
                w.HBox([self.cap, self.set_cap, self.clear_cap]),
                self.status,
                self.last_cell,
            ]
        )
        self.stream = SampleStream(session.collector, _WidgetChannel(self), lambda: session.busy)
        session.report_listeners.append(self.stream.push_cell)
        self.stream.subscribe(interval_ms)

    @classmethod
    def create(cls, session: Session, interval_ms: int = 500) -> Any:
        old = cls._current.pop(id(session), None)
        if old is not None:
            old.close()
        widget = cls(session, interval_ms)
        cls._current[id(session)] = widget
        return widget.box

    def close(self) -> None:
        self.stream.stop()
        if self.stream.push_cell in self.session.report_listeners:
            self.session.report_listeners.remove(self.stream.push_cell)
        self.box.close()

    def _do(self, fn: Any) -> None:
        try:
            self.status.value = fn()
        except ActionRefused as e:
            self.status.value = f"<span style='color:var(--jp-error-color1,#d32f2f)'>{e}</span>"
        self.bars.value = sample_html(to_protocol(self.session.collector.measure()))

    def _empty(self) -> str:
        r = actions.empty_cache(self.session.collector)
        return "released to the driver: " + (
            ", ".join(f"cuda:{i} {fb(b)}" for i, b in sorted(r.released.items())) or "nothing"
        )

    def _caching(self, on: bool) -> str:
        r = actions.set_caching(self.session.collector, on)
        self.caching.description = "Caching on" if r.caching else "Caching off"
        return f"caching allocator is now {'on' if r.caching else 'off'}"

    def _reset(self) -> str:
        actions.reset_peak(self.session.collector)
        return "peak counters reset"

    def _set_cap(self) -> str:
        text = self.cap.value.strip()
        try:
            fraction = float(text)
        except ValueError:
            try:
                return self._limit(nbytes=parse_size(text))
            except ValueError as e:
                raise ActionRefused(str(e)) from None
        return self._limit(fraction=fraction)

    def _limit(self, fraction: float | None = None, nbytes: int | None = None) -> str:
        ready = self.session.collector.backend.initialized_devices()
        device = ready[0] if ready else 0
        r = actions.set_limit(self.session.collector, device, fraction=fraction, nbytes=nbytes)
        if r.bytes is None:
            return f"cap removed on cuda:{device}"
        return f"cap on cuda:{device}: {fb(r.bytes)}"
