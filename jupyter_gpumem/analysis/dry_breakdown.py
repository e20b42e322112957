"""What a dry run's peak would be made of: the ``%%gpumem --breakdown`` categories for a
step that never ran, from plain records.

Inputs, recorded by ``collectors/fake_run.record`` while the cell ran under FakeTensorMode:

- the events: every storage's allocation (its exact bytes, stream, the innermost module
  running) and its free, in order, for every device;
- :class:`~jupyter_gpumem.collectors.dry_run.events.Seen`: which allocation was a parameter, a
  buffer, a gradient or optimizer state (claims by allocation key), which ones autograd
  saved for backward and while which module ran, where each phase began (forward,
  backward, backward done, optimizer step, other), as indices into the events.

The events are replayed through the model of the caching allocator
(``analysis/caching/``, exactly as ``replay`` counts *allocated*: each block's
size, a request rounded to 512 B, or the whole cached block when the rest would be too
small to keep), which gives the peak and the blocks alive then. Each block alive at the
peak is counted once, in the first category that claims it, as ``analysis/breakdown.py``
counts a real run's: a claimed block counts its storage rounded up to 512 B, the rest of it
is ``block slack``; cuBLAS's workspaces are ``library workspaces``; an activation counts
until the backward pass that began after it was saved is over; what nothing claims is a
temporary. So the categories add up to the predicted peak allocated to the byte. Nothing
is "kept from before": a dry run predicts a fresh process.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..collectors.dry_run import Alloc, Free, Seen
from ..model import CATEGORIES, Breakdown, CategoryShare, ModuleShare, Phase
from .breakdown import NO_MODULE
from .caching import AllocatorConfig, CachingAllocatorModel, round_size

PREDICTED = "predicted by a dry run (FakeTensorMode and a model of the caching allocator)"
WORKSPACES = "library workspaces"


def analyze(
    device: int,
    events: Sequence[Any],
    seen: Seen,
    *,
    config: AllocatorConfig | None = None,
    max_modules: int = 8,
) -> Breakdown:
    """The predicted breakdown of ``device``'s peak allocated. ``events``: the run's
    :class:`~jupyter_gpumem.collectors.dry_run.events.Alloc` and ``Free`` records, all devices,
    in order (the positions in ``seen`` index them); ``config``: the allocator's settings
    the prediction used (``AllocatorConfig.from_conf``; no cap)."""
    peak = _replay(device, events, config)
    alive = _alive_at(device, events, peak.at)
    activation = _activations(seen, alive, peak.at)
    totals, acts, temps = _categories(alive, peak.blocks, seen.claims, activation)
    categories = tuple(
        CategoryShare(c, totals[c][0], totals[c][1]) for c in CATEGORIES if totals[c][1]
    )
    return Breakdown(
        device=device,
        peak=peak.allocated,
        base=0,
        categories=categories,
        phase=phase_at(seen, peak.at),
        modules=_module_shares(seen.modules, acts, temps, max_modules),
        reserved_at_peak=peak.reserved if peak.at >= 0 else None,
        outside_torch=None,
        exact=False,
        events=peak.requests,
        peak_event=peak.request,
        counter_peak=None,
        note=PREDICTED,
    )


class _Peak(NamedTuple):
    """Where a device's allocated first reached its peak in a replay of a run's events."""

    blocks: dict[int, int]  # allocation key -> the block the allocator gave it
    allocated: int  # the peak
    at: int  # index in events of the allocation that first reached it; -1: none
    request: int  # that allocation's number among the device's requests
    requests: int  # the device's requests (allocations and frees) in all
    reserved: int  # reserved when the peak was reached


def _replay(device: int, events: Sequence[Any], config: AllocatorConfig | None) -> _Peak:
    """Replay ``device``'s allocations and frees through the caching allocator's model:
    each allocation's block, and where allocated first reached its peak."""
    model = CachingAllocatorModel(config)
    malloc, free = model.malloc, model.free
    block: dict[int, int] = {}  # key -> the block the allocator gave it
    live: set[int] = set()
    peak = reserved_at_peak = 0
    peak_at = -1  # index in events of the allocation that first reached the peak
    requests = peak_request = 0
    for i, e in enumerate(events):
        if type(e) is Alloc:
            if e.device != device or not e.nbytes:  # a workspace of 0 bytes: not asked for
                continue
            requests += 1
            before = model.allocated
            malloc(e.key, e.nbytes, e.stream)
            block[e.key] = model.allocated - before
            live.add(e.key)
            if model.allocated > peak:
                peak, peak_at, peak_request = model.allocated, i, requests
                reserved_at_peak = model.reserved
        elif type(e) is Free and e.key in live:
            requests += 1
            live.discard(e.key)
            free(e.key)
    return _Peak(block, peak, peak_at, peak_request, requests, reserved_at_peak)


def _alive_at(device: int, events: Sequence[Any], at: int) -> dict[int, Alloc]:
    """``device``'s allocations alive after ``events[at]``, in the order they were made."""
    alive: dict[int, Alloc] = {}
    for e in events[: at + 1]:
        if type(e) is Alloc:
            if e.device == device:
                alive[e.key] = e
        elif type(e) is Free:
            alive.pop(e.key, None)
    return alive


def _activations(seen: Seen, alive: Mapping[int, Alloc], at: int) -> dict[int, int]:
    """The allocations alive at ``events[at]`` that are activations then: allocation key
    -> the module that saved it (its first save counts)."""
    # A saved tensor is an activation until the backward pass that uses it is over (the
    # first "backward done" after it was saved); after that, whatever still holds it.
    done = sorted(m.at for m in seen.marks if m.phase == "backward done")
    activation: dict[int, int] = {}
    for s in seen.saved:
        if s.key in alive and s.key not in activation:
            j = bisect_left(done, s.at)
            if j == len(done) or done[j] > at:
                activation[s.key] = s.module
    return activation


def _categories(
    alive: Mapping[int, Alloc],
    blocks: Mapping[int, int],
    claims: Mapping[int, str],
    activation: Mapping[int, int],
) -> tuple[dict[str, list[int]], dict[int, int], dict[int, int]]:
    """Each block alive at the peak counted once, in the first category that claims it:
    category -> [bytes, blocks], and by module index the activations' and temporaries'
    bytes."""
    totals: dict[str, list[int]] = {c: [0, 0] for c in CATEGORIES}
    acts: dict[int, int] = {}  # module index -> activation bytes alive at the peak
    temps: dict[int, int] = {}  # module index -> temporaries alive at the peak
    for key, a in alive.items():
        size = blocks[key]
        if a.kind != "tensor":
            category: str | None = WORKSPACES
        else:
            category = claims.get(key)
            if category is None and key in activation:
                category = "activations"
        if category is None:
            totals["temporaries"][0] += size
            totals["temporaries"][1] += 1
            temps[a.module] = temps.get(a.module, 0) + size
            continue
        owned = min(size, round_size(a.nbytes))
        totals[category][0] += owned
        totals[category][1] += 1
        if size > owned:
            totals["block slack"][0] += size - owned
            totals["block slack"][1] += 1
        if category == "activations":
            m = activation[key]
            acts[m] = acts.get(m, 0) + owned
    return totals, acts, temps


def _module_shares(
    names: Sequence[str], acts: Mapping[int, int], temps: Mapping[int, int], max_modules: int
) -> tuple[ModuleShare, ...]:
    """The ``max_modules`` modules holding the most activations and temporaries at the
    peak, by name (module indices outside ``names``: no module)."""

    def name(i: int) -> str:
        return names[i] if 0 <= i < len(names) else NO_MODULE

    per_module: dict[str, list[int]] = {}
    for i, n in acts.items():
        per_module.setdefault(name(i), [0, 0])[0] += n
    for i, n in temps.items():
        per_module.setdefault(name(i), [0, 0])[1] += n
    shares = [ModuleShare(m, a, t) for m, (a, t) in per_module.items()]
    shares.sort(key=lambda m: (-m.bytes, m.module))
    return tuple(shares[:max_modules])


def phase_at(seen: Seen, at: int) -> Phase:
    """The phase of the last mark made before ``events[at]`` (``backward done``: other)."""
    phase = "other"
    for m in seen.marks:
        if m.at > at:
            break
        phase = "other" if m.phase == "backward done" else m.phase
    return phase  # type: ignore[return-value]


def is_predicted(b: Breakdown) -> bool:
    """Whether a breakdown is a dry run's prediction (not a measured run's)."""
    return not b.exact and b.note == PREDICTED
