"""What a dry run's peak would be made of: the ``%%gpumem --breakdown`` categories for a
step that never ran, from plain records.

Inputs, recorded by ``collectors/fake_run.py`` while the cell ran under FakeTensorMode:

- the events: every storage's allocation (its exact bytes, stream, the innermost module
  running) and its free, in order, for every device;
- :class:`~jupyter_gpumem.collectors.fake_run.Seen`: which allocation was a parameter, a
  buffer, a gradient or optimizer state (claims by allocation key), which ones autograd
  saved for backward and while which module ran, where each phase began (forward,
  backward, backward done, optimizer step, other), as indices into the events.

The events are replayed through the model of the caching allocator
(``analysis/caching_allocator.py``, exactly as ``replay`` counts *allocated*: each block's
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
from collections.abc import Sequence
from typing import Any

from ..collectors.fake_run import Alloc, Free, Seen
from ..model import CATEGORIES, Breakdown, CategoryShare, ModuleShare, Phase
from .breakdown import NO_MODULE
from .caching_allocator import AllocatorConfig, CachingAllocatorModel, round_size

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
    :class:`~jupyter_gpumem.collectors.fake_run.Alloc` and ``Free`` records, all devices,
    in order (the positions in ``seen`` index them); ``config``: the allocator's settings
    the prediction used (``AllocatorConfig.from_conf``; no cap)."""
    model = CachingAllocatorModel(config)
    malloc, free = model.malloc, model.free
    block: dict[int, int] = {}  # key -> the block the allocator gave it
    live: set[int] = set()
    peak = reserved_at_peak = 0
    peak_at = -1  # index in events of the allocation that first reached the peak
    requests = peak_request = 0
    for i, e in enumerate(events):
        if type(e) is Alloc:
            if e.device != device:
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

    # the allocations alive at the peak, in the order they were made
    alive: dict[int, Alloc] = {}
    for e in events[: peak_at + 1]:
        if type(e) is Alloc:
            if e.device == device:
                alive[e.key] = e
        elif type(e) is Free:
            alive.pop(e.key, None)

    # A saved tensor is an activation until the backward pass that uses it is over (the
    # first "backward done" after it was saved); after that, whatever still holds it.
    done = sorted(m.at for m in seen.marks if m.phase == "backward done")
    activation: dict[int, int] = {}  # key -> the module that saved it (first save counts)
    for s in seen.saved:
        if s.key in alive and s.key not in activation:
            j = bisect_left(done, s.at)
            if j == len(done) or done[j] > peak_at:
                activation[s.key] = s.module

    names = seen.modules
    totals: dict[str, list[int]] = {c: [0, 0] for c in CATEGORIES}
    acts: dict[int, int] = {}  # module index -> activation bytes alive at the peak
    temps: dict[int, int] = {}  # module index -> temporaries alive at the peak
    claims = seen.claims
    for key, a in alive.items():
        size = block[key]
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

    def name(i: int) -> str:
        return names[i] if 0 <= i < len(names) else NO_MODULE

    per_module: dict[str, list[int]] = {}
    for i, n in acts.items():
        per_module.setdefault(name(i), [0, 0])[0] += n
    for i, n in temps.items():
        per_module.setdefault(name(i), [0, 0])[1] += n
    shares = [ModuleShare(m, a, t) for m, (a, t) in per_module.items()]
    shares.sort(key=lambda m: (-m.bytes, m.module))
    categories = tuple(
        CategoryShare(c, totals[c][0], totals[c][1]) for c in CATEGORIES if totals[c][1]
    )
    return Breakdown(
        device=device,
        peak=peak,
        base=0,
        categories=categories,
        phase=phase_at(seen, peak_at),
        modules=tuple(shares[:max_modules]),
        reserved_at_peak=reserved_at_peak if peak_at >= 0 else None,
        outside_torch=None,
        exact=False,
        events=requests,
        peak_event=peak_request,
        counter_peak=None,
        note=PREDICTED,
    )


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
