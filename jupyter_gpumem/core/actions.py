"""Things the user explicitly asks for: empty the cache, switch caching, cap memory, reset
peaks. Shared by the ``%gpumem`` commands, the widget and the panel protocol, so all behave
alike.

Each action returns a typed result or raises :class:`ActionRefused` with a reason meant
for the user. Only these may call ``gc.collect``/``empty_cache`` or initialise CUDA, and
only because the user asked.

A cap typed by a person (``24GiB``, ``0.3``, ``30%``, ``off``) is read by
:func:`parse_limit`, for every front end that takes one as text; the panel reads it as
well, at once, as the user types (``labextension/src/present/cap.ts``), and
``tests/fixtures/cap_inputs.json`` holds the inputs on which both must agree. This module
is the authority: :func:`set_limit` enforces what a cap may be, however it was typed.
"""

from __future__ import annotations

import gc
import re
from dataclasses import dataclass
from typing import NamedTuple

from ..collectors import Collector
from ..errors import ActionRefused
from ..model import Measurement
from ..units import NUMBER, format_bytes, parse_size, shown


@dataclass(frozen=True, slots=True)
class EmptyCacheResult:
    released: dict[int, int]  # device -> bytes PyTorch handed back to the driver
    gc_collected: int  # objects freed by gc.collect()
    after: Measurement


@dataclass(frozen=True, slots=True)
class CachingResult:
    caching: bool  # the real state afterwards
    initialised_cuda: bool
    after: Measurement


@dataclass(frozen=True, slots=True)
class LimitResult:
    device: int
    fraction: float | None  # None: no cap
    bytes: int | None
    initialised_cuda: bool
    reserved_over_cap: int  # already reserved beyond the new cap (stays until freed)
    after: Measurement


def _require_torch(c: Collector) -> None:
    why = c.backend.actionable()
    if why is not None:
        raise ActionRefused(why)


def check_device(c: Collector, device: int) -> None:
    n = c.backend.device_count()
    if not 0 <= device < n:
        raise ActionRefused(
            f"no device {shown(device)}: this kernel sees {n} device(s)"
            + (f" (0..{n - 1})" if n else "")
        )


def empty_cache(c: Collector, collect_garbage: bool = True) -> EmptyCacheResult:
    """``gc.collect()`` then ``empty_cache()``; report what went back to the driver.

    A full collection takes ~100 ms with torch loaded (and holds the GIL, stalling a running
    cell), so the panel's button skips it unless asked."""
    _require_torch(c)
    before = c.measure(with_process=False)
    collected = gc.collect() if collect_garbage else 0
    c.backend.empty_cache()
    after = c.measure()
    released = {}
    for d in after.devices:
        b = before.device(d.index)
        if d.allocator is not None and b is not None and b.allocator is not None:
            released[d.index] = b.allocator.reserved - d.allocator.reserved
    return EmptyCacheResult(released, collected, after)


def set_caching(c: Collector, enabled: bool) -> CachingResult:
    _require_torch(c)
    why_not = c.backend.caching_supported()
    if why_not is not None:
        raise ActionRefused(why_not)
    was_ready = c.backend.cuda_ready()
    state = c.backend.set_caching(enabled)
    if state != enabled:
        raise ActionRefused(
            f"caching is still {'on' if state else 'off'}: PYTORCH_NO_CUDA_MEMORY_CACHING=1 "
            "was read when CUDA started; restart the kernel without it"
        )
    return CachingResult(state, not was_ready, c.measure())


def reset_peak(c: Collector, device: int | None = None) -> Measurement:
    _require_torch(c)
    if device is not None:
        check_device(c, device)
    ready = c.backend.initialized_devices()
    if not ready:
        raise ActionRefused("CUDA is not initialised in this kernel: there is no peak to reset")
    c.backend.reset_peaks(ready if device is None else [d for d in ready if d == device])
    return c.measure()


def fraction_for(nbytes: int, total: int) -> float:
    """The fraction whose cap is exactly ``nbytes``: the allocator takes
    ``size_t(fraction * total)``, and ``nbytes / total`` can land one byte short."""
    import math

    fraction = nbytes / total
    while int(fraction * total) < nbytes and fraction < 1.0:
        fraction = math.nextafter(fraction, 2.0)
    return min(fraction, 1.0)


OFF_WORDS = frozenset({"off", "none", "no", "clear", "unlimited"})  # a cap typed as "no cap"
_FRACTION = re.compile(rf"({NUMBER})\s*(%?)")  # 0.3, 30 %: a fraction of the device


class CapRequest(NamedTuple):
    """A cap as :func:`set_limit` takes it: a ``fraction`` of the device or ``nbytes``;
    both None removes the cap."""

    fraction: float | None
    nbytes: int | None


def parse_limit(text: str) -> CapRequest:
    """Read a cap as a person types it: a size with its unit (``24GiB``, ``24 GB``, as
    :func:`~jupyter_gpumem.units.parse_size` reads sizes), a plain number from 0 to 1 or a
    percentage (a fraction of the device: ``0.3``, ``30%``), or one of :data:`OFF_WORDS`
    (no cap). A plain number above 1 is refused (bytes or gigabytes?), as are a fraction of
    0 and one above 100 %. Raises :class:`ActionRefused` with the accepted forms."""
    spec = text.strip()
    if not spec:
        raise ActionRefused('type a cap such as 24 GiB or 0.3, or "off"')
    if spec.lower() in OFF_WORDS:
        return CapRequest(None, None)
    m = _FRACTION.fullmatch(spec)
    if m is None:
        try:
            return CapRequest(None, parse_size(spec))
        except ValueError as e:
            raise ActionRefused(f"{e}; or a fraction like 0.3; or off") from None
    fraction = float(m.group(1))
    if m.group(2):
        fraction /= 100
    elif fraction > 1:
        raise ActionRefused(
            f"a plain number is a fraction of the device, in (0, 1]; got {shown(spec)}. "
            "For a size add a unit: 24GiB, 24GB"
        )
    if not 0.0 < fraction <= 1.0:
        raise ActionRefused(
            f"a fraction of the device must be above 0 and at most 1 (100%); got {shown(spec)}"
        )
    return CapRequest(fraction, None)


def set_limit(
    c: Collector, device: int, *, fraction: float | None = None, nbytes: int | None = None
) -> LimitResult:
    """Cap what PyTorch may reserve on ``device``; both None removes the cap.

    ``set_per_process_memory_fraction`` caps bytes newly requested from cudaMalloc; it
    frees nothing, so a cap below what is already reserved bites only once that is freed
    and emptied.
    """
    _require_torch(c)
    check_device(c, device)
    was_ready = c.backend.cuda_ready()
    total = c.backend.total_for_limit(device)  # initialises CUDA on that device if needed
    if nbytes is not None:
        if nbytes > total:
            raise ActionRefused(
                f"a cap of {format_bytes(nbytes)} is more than device {device} has "
                f"({format_bytes(total)})"
            )
        fraction = fraction_for(nbytes, total)
    if fraction is not None and not 0.0 < fraction <= 1.0:
        raise ActionRefused(f"a fraction must be in (0, 1], got {fraction}")
    c.backend.set_limit(device, 1.0 if fraction is None else fraction)
    after = c.measure()
    d = after.device(device)
    cap = None if fraction is None else int(fraction * total)
    over = 0
    if cap is not None and d is not None and d.allocator is not None:
        over = max(0, d.allocator.reserved - cap)
    return LimitResult(device, fraction, cap, not was_ready, over, after)
