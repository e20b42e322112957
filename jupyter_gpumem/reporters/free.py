"""``%gpumem free``'s words: what will be (or was) let go, what that should give back, what
came back to the driver, and what still holds the rest. Pure functions of a
:class:`~jupyter_gpumem.model.free.FreeReport`; the text is the view's ``text/plain``, the
same lines in a ``<pre>`` its HTML."""

from __future__ import annotations

from html import escape

from ..model.free import DeviceFree, FreeReport, Holder
from ..model.render import Bundle, register
from ..units import cuda_label, format_bytes


def free_lines(r: FreeReport) -> list[str]:
    names = ", ".join(r.names)
    head = "gpumem free" + ("" if r.done else " --dry")
    out = [f"{head} {names}: holds {_per_device(r.devices, 'held')}"]
    if r.let_go:
        out.append("  let go:" if r.done else "  will let go of:")
        width = min(40, max(len(g.code) for g in r.let_go))
        for g in r.let_go:
            out.append(f"    {g.code:<{width}}  {g.why} ({format_bytes(g.bytes)})")
    if r.kept:
        out.append("  left as they are (they keep part of it):")
        out += [_holder_line(h) for h in r.kept]
    out.append(f"  expected back to the driver: {_expected(r.devices)}")
    out += [f"  note: {n}" for n in r.notes]
    if not r.done:
        out.append("  dry run: nothing was let go; run without --dry to free it")
        return out
    for d in r.devices:
        out.append("  " + _came_back(d))
    if r.still:
        out.append("  still held:")
        out += [_holder_line(h) for h in r.still]
    return out


def _per_device(devices: tuple[DeviceFree, ...], field: str) -> str:
    if not devices:
        return "nothing on the GPU"
    return ", ".join(
        f"{format_bytes(getattr(d, field))} on {cuda_label(d.device)}" for d in devices
    )


def _expected(devices: tuple[DeviceFree, ...]) -> str:
    parts = []
    for d in devices:
        s = f"{format_bytes(d.expected_returned)} on {cuda_label(d.device)}"
        if d.cached_free:
            s += f" ({format_bytes(d.cached_free)} of it already free in the cache)"
        parts.append(s)
    return ", ".join(parts) or "nothing"


def _came_back(d: DeviceFree) -> str:
    where = cuda_label(d.device)
    if d.returned is None and d.freed is None:
        return f"{where}: nothing was measured"
    if d.returned is None:
        return f"{where}: the driver's figure could not be read; freed {format_bytes(d.freed)}"
    s = f"came back to the driver on {where}: {format_bytes(d.returned)} (cudaMemGetInfo)"
    if d.held:
        s += f", {100 * d.returned / d.held:.1f} % of what it held"
    if d.expected_returned:
        s += f", {100 * d.returned / d.expected_returned:.1f} % of the expected"
    if d.freed is not None:
        s += f"; allocated fell by {format_bytes(d.freed)}"
    return s


def _holder_line(h: Holder) -> str:
    s = f"    {h.holder}: keeps {format_bytes(h.bytes)}"
    if h.example:
        s += f" ({h.example})"
    s += f" - {h.why}"
    if h.fix:
        s += f"; to free it: {h.fix}"
    return s


def free_bundle(r: FreeReport) -> Bundle:
    text = "\n".join(free_lines(r))
    return {"text/plain": text, "text/html": f"<pre>{escape(text)}</pre>"}


register(FreeReport, free_bundle)

__all__ = ["free_bundle", "free_lines"]
