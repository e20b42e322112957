"""``%%gpumem --scan NAME=... --dry-run``: the largest value that fits a card, found by
bisection on dry runs' predictions (``core/dry_run.py`` predicts each); nothing runs on the
GPU."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from ..model import DryScan, DryScanPoint, Target
from .dry_run import (
    Cell,
    held_by,
    outside_for,
    predict,
    untouched_by_device,
    with_libraries,
    workspaces_for,
)

# -- the largest value that fits, by bisection on dry runs ------------------------------------
MAX_DRY_RUNS = 24  # a scan's dry runs at most (each about a second for a GPT-2 step)
MAX_DOUBLINGS = 12  # when every value given fits: look this far above the largest


def search(
    predict_at: Callable[[float], DryScanPoint],
    values: tuple[float, ...],
    integer: bool,
    max_runs: int = MAX_DRY_RUNS,
) -> tuple[list[DryScanPoint], float | None, float | None, list[str]]:
    """The largest value predicted to fit: the values given first, then doubling past the
    largest while everything fits, then bisection between the largest that fits and the
    smallest that does not (to the unit for whole numbers, to 1 % otherwise). A value
    whose dry run stopped early is not known to fit: it ends the search there."""
    points: list[DryScanPoint] = []
    notes: list[str] = []
    fit: float | None = None
    fail: float | None = None

    def at(v: float) -> bool | None:
        p = predict_at(v)
        points.append(p)
        return p.fits

    for v in sorted(set(values)):
        ok = at(v)
        if ok is None:
            notes.append(f"{_shown(v, integer)}: the dry run could not see the whole cell")
            return points, fit, fail, notes
        if ok:
            fit = v
        else:
            fail = v
            break
    if fit is None:
        return points, None, fail, notes
    doublings = 0
    while fail is None and doublings < MAX_DOUBLINGS and len(points) < max_runs:
        v = fit * 2
        ok = at(v)
        doublings += 1
        if ok is None:
            return points, fit, fail, notes
        if ok:
            fit = v
        else:
            fail = v
    if fail is None:
        notes.append(f"everything up to {_shown(fit, integer)} fits; not looked further")
        return points, fit, fail, notes
    while len(points) < max_runs:
        if integer:
            if fail - fit <= 1:
                break
            mid: float = (int(fit) + int(fail)) // 2
        else:
            if fail - fit <= 0.01 * fit:
                break
            mid = (fit + fail) / 2
        ok = at(mid)
        if ok is None:
            break
        if ok:
            fit = mid
        else:
            fail = mid
    else:
        notes.append(f"stopped after {max_runs} dry runs")
    return points, fit, fail, notes


def _shown(v: float, integer: bool) -> str:
    return str(int(v)) if integer else f"{v:g}"


def dry_scan(
    cell: Cell,
    name: str,
    values: tuple[float, ...],
    integer: bool,
    target: Target | None,
    here: tuple[int, str] | None = None,
    device_type: str = "cuda",
    world_size: int = 1,
    count_untouched: bool = False,
    progress: Callable[[str, int, str | None, float], None] | None = None,
) -> DryScan:
    """``%%gpumem --scan NAME=... --dry-run``: the cell dry-run with ``NAME`` bound to each
    value tried (in its copy of the namespace: the user's own value of ``NAME`` stays);
    ``world_size`` > 1: each as rank 0 of a fake job of that many processes."""
    from ..collectors.dry_run import check_world_size, fake_job

    t0 = time.perf_counter()
    if target is None:
        raise ValueError("a scan without running needs a target: --fit-in 24GiB or a card")
    outside = outside_for(target, here)
    measured = outside[1].startswith("measured in this process")
    used = [outside]  # the largest figure beside PyTorch of the values tried
    holders: list[tuple[tuple[str, int], ...]] = []  # the first run's held_by
    unseen: set[str] = set()
    spaces = workspaces_for(target) if device_type == "cuda" else None
    world_size = check_world_size(world_size)

    def predict_at(v: float) -> DryScanPoint:
        value: float = int(v) if integer else v
        with fake_job(world_size):
            seen = cell.record(
                device_type=device_type,
                workspaces=spaces,
                breakdown=False,
                progress=None if progress is None else partial(progress, f"{name}={value}"),
                bind={name: value},
            )
        stopped = seen.error.line if seen.error is not None else None
        if not holders:
            holders.append(held_by(seen))
        unseen.update(seen.unseen)
        beside = with_libraries(outside, seen.libraries, world_size, measured)
        used[0] = max(used[0], beside, key=lambda o: o[0])
        devices, fits, _ = predict(
            seen.events,
            target=target,
            outside=beside,
            breakdown=False,
            untouched=untouched_by_device(seen),
            count_untouched=count_untouched,
        )
        busiest = max(devices, key=lambda d: d.peak_reserved, default=None)
        if busiest is None:
            return DryScanPoint(value, 0, 0, None, None if stopped else True, stopped)
        return DryScanPoint(
            value,
            busiest.peak_allocated,
            busiest.peak_reserved,
            busiest.peak_reserved + beside[0],
            None if stopped else fits,
            stopped,
        )

    points, largest, failing, notes = search(predict_at, values, integer)
    return DryScan(
        name=name,
        target=target,
        outside=used[0][0],
        outside_source=used[0][1],
        points=tuple(points),
        largest=largest,
        smallest_failing=failing,
        integer=integer,
        seconds=time.perf_counter() - t0,
        execution_count=cell.execution_count,
        notes=tuple(notes),
        world_size=world_size,
        held_by=holders[0] if holders else (),
        unseen=tuple(sorted(unseen)),
    )
