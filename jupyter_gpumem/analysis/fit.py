"""peak(x) from a few measured runs, and the largest x whose peak stays within a budget.

Peak memory grows affinely with a batch size (activations and temporaries scale with it,
weights and optimizer state do not) and quadratically with a sequence length when
attention materialises its score matrix. The fit is affine unless three or more points
show curvature: the affine fit then misses some point by more than 1 % of the measured
span (and 1 MiB), and the quadratic term is positive. Plain least squares in Python: a
handful of points needs no numpy.

When the runs' phases are known (forward, backward, optimizer step, other: the peak of
each), each phase's peak is fitted on its own and the peak is the largest of the fitted
phases (:func:`fit_phases`): the phase that makes the peak can change with the value (an
optimizer step at small batches, the backward pass at larger ones), and one curve through
peaks made by different phases bends where neither phase does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..model import Fit

CURVE_SHARE = 0.01  # of the measured span of peaks
CURVE_FLOOR = 1 << 20  # bytes: allocator rounding and library workspaces move peaks this much


def _solve(rows: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting (3x3 at most)."""
    n = len(rhs)
    m = [[*row, rhs[i]] for i, row in enumerate(rows)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                for k in range(col, n + 1):
                    m[r][k] -= f * m[col][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def _least_squares(xs: Sequence[float], ys: Sequence[float], degree: int) -> list[float] | None:
    """Coefficients (a, b[, c]) of the polynomial fit, x scaled to [0, 1] for stability."""
    scale = max(abs(x) for x in xs) or 1.0
    u = [x / scale for x in xs]
    k = degree + 1
    rows = [[sum(ui ** (i + j) for ui in u) for j in range(k)] for i in range(k)]
    rhs = [sum(y * ui**i for ui, y in zip(u, ys, strict=True)) for i in range(k)]
    coef = _solve(rows, rhs)
    if coef is None:
        return None
    return [c / scale**i for i, c in enumerate(coef)]


def fit_peaks(xs: Sequence[float], ys: Sequence[int], regimes: bool = False) -> Fit:
    """Fit peak(x). Needs two distinct x at least (``ValueError`` otherwise).

    ``regimes``: a parabola that falls before it rises over the values measured is read as
    two regimes (a part of the step that does not grow makes the peak at the small values,
    one that grows at the large ones) and replaced by the line through the two largest
    values, whose regime goes on. Without it such a parabola is kept: it rises faster than
    the large values' regime, so the value it predicts is the smaller, the one likely to
    run (the scan's prediction); with it, what the values measured so far allow at most
    (the scan's steps up from a value that ran, ``analysis/scan_verify.py``)."""
    if len(xs) != len(ys):
        raise ValueError("as many peaks as values are needed")
    if len(set(xs)) < 2:
        raise ValueError("two different values at least are needed to fit")
    affine = _least_squares(xs, ys, 1)
    assert affine is not None  # two distinct x: never singular
    a, b = affine
    kind, c = "affine", 0.0
    residuals = [y - (a + b * x) for x, y in zip(xs, ys, strict=True)]
    if len(set(xs)) >= 3:
        span = max(ys) - min(ys)
        worst = max(abs(r) for r in residuals)
        if worst > max(CURVE_SHARE * span, CURVE_FLOOR):
            quad = _least_squares(xs, ys, 2)
            falls = quad is not None and quad[2] > 0 and -quad[1] / (2 * quad[2]) >= min(xs)
            if regimes and falls:
                # memory does not shrink as the value grows: two regimes, not a square
                (x1, y1), (x2, y2) = sorted(zip(xs, ys, strict=True))[-2:]
                if x2 > x1:
                    b = (y2 - y1) / (x2 - x1)
                    a = y2 - b * x2
                    residuals = [y - (a + b * x) for x, y in zip(xs, ys, strict=True)]
            elif quad is not None and quad[2] > 0:
                a, b, c = quad
                kind = "quadratic"
                residuals = [y - (a + b * x + c * x * x) for x, y in zip(xs, ys, strict=True)]
    return Fit(
        kind=kind,  # type: ignore[arg-type]
        a=a,
        b=b,
        c=c,
        xs=tuple(float(x) for x in xs),
        ys=tuple(int(y) for y in ys),
        residuals=tuple(residuals),
    )


def fit_phases(
    xs: Sequence[float],
    ys: Sequence[int],
    phases: Mapping[str, Sequence[int]],
    regimes: bool = False,
) -> Fit:
    """Fit each phase's peak on its own; the peak is their maximum. ``ys``: the whole runs'
    peaks (the residuals are theirs); ``phases``: each phase's peak at every x. The
    combined fit's own curve is, until :func:`bind` picks the one that binds at a budget,
    that of the phase highest at the largest x. ``regimes``: as :func:`fit_peaks`."""
    if not phases:
        return fit_peaks(xs, ys, regimes)
    curves = tuple(replace(fit_peaks(xs, p, regimes), phase=name) for name, p in phases.items())
    top = max(curves, key=lambda f: f(max(xs)))
    residuals = tuple(y - max(f(x) for f in curves) for x, y in zip(xs, ys, strict=True))
    return replace(
        top,
        ys=tuple(int(y) for y in ys),
        residuals=residuals,
        phases=curves,
    )


def grows(fit: Fit) -> bool:
    """Whether the fitted peak grows with x (some phase's does), so a largest x exists."""
    if fit.phases:
        return any(grows(f) for f in fit.phases)
    return fit.b > 0 or fit.c > 0


def bind(fit: Fit, budget: float, integer: bool) -> Fit:
    """The combined fit with its own curve set to the phase that binds at ``budget`` (the
    one whose largest value within it is the smallest); a fit without phases as it is."""
    if not fit.phases:
        return fit
    best: tuple[float, float, Fit] | None = None
    for f in fit.phases:
        x = largest_within(f, budget, integer) if grows(f) else None
        if x is None:
            continue
        # the smallest value; of phases that reach the same one, the highest there
        key = (x, -f(x))
        if best is None or key < best[:2]:
            best = (*key, f)
    if best is None:
        return fit
    f = best[2]
    return replace(fit, kind=f.kind, a=f.a, b=f.b, c=f.c, phase=f.phase)


def largest_within(fit: Fit, budget: float, integer: bool) -> float | None:
    """The largest x >= 0 with fit(x) <= budget; None when even x = 0 (or 1) does not fit,
    or when the peak does not grow with x (then there is no largest value). With phases:
    the smallest over the phases whose peak grows, None when a phase whose peak does not
    grow is over the budget at the largest x fitted."""
    if fit.phases:
        found: float | None = None
        for f in fit.phases:
            if not grows(f):
                if f(max(f.xs)) > budget:
                    return None
                continue
            x = largest_within(f, budget, integer)
            if x is None:
                return None
            found = x if found is None else min(found, x)
        return found
    a, b, c = fit.a, fit.b, fit.c
    if c > 0:
        disc = b * b - 4 * c * (a - budget)
        if disc < 0:
            return None
        x = (-b + math.sqrt(disc)) / (2 * c)
    elif b > 0:
        x = (budget - a) / b
    else:
        return None
    if integer:
        x = math.floor(x + 1e-9)
        # floating-point can leave fit(x) a hair above the budget
        while x >= 1 and fit(x) > budget:
            x -= 1
        return float(x) if x >= 1 else None
    if x <= 0:
        return None
    return float(_round_down(x))


def smaller_values(failed: float, integer: bool) -> list[float]:
    """Probe values below one that ran out of memory: an eighth, a quarter and a half of it
    (whole numbers when the scan's are: then fewer, or none, near 1)."""
    if not integer:
        return [failed / 8, failed / 4, failed / 2]
    f = int(failed)
    values = {max(1, f * k // 8) for k in (1, 2, 4)} - {f}
    if len(values) < 2:
        values = set(range(1, min(f, 3)))
    return sorted(float(v) for v in values)


def _round_down(x: float, digits: int = 4) -> float:
    """Round down to ``digits`` significant digits, so the answer never exceeds the fit."""
    if x <= 0:
        return x
    power = 10 ** (digits - 1 - math.floor(math.log10(x)))
    return math.floor(x * power) / power


def formula(fit: Fit, name: str) -> str:
    """``peak(batch) = 1.20 GiB + 36.00 MiB × batch`` in the user's units."""
    from ..units import format_bytes

    parts = [format_bytes(round(fit.a))]
    parts.append(
        f"{format_bytes(round(fit.b))} × {name}"
        if fit.b >= 0
        else f"- {format_bytes(round(-fit.b))} × {name}"
    )
    if fit.kind == "quadratic":
        parts.append(
            f"{format_bytes(round(fit.c))} × {name}²" if fit.c >= 1 else f"{fit.c:.3g} B × {name}²"
        )
    return f"peak({name}) = " + " + ".join(parts).replace("+ -", "-")
