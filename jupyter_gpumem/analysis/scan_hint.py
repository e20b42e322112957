"""What an out-of-memory cell can learn from the scans of this session.

A cell that failed and reads a scanned name (``batch``) gets the whole need at its value
from the scan's fit, and the answer: "`batch` = 64 failed; the scan of In[5] found 24 fits
in 12.00 GiB (verified)". A cell with an obvious size variable and no scan gets the scan
command to run. Plain records in, sentences out.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import Any

from ..model import ScanResult
from ..units import GiB, MiB, format_bytes
from .fit import largest_within, smaller_values
from .postmortem import scan_suggestion, size_variables


def _value_in(code: str, name: str, namespace: Mapping[str, Any]) -> float | None:
    """The value ``name`` has for this cell: a number the cell assigns it, else the
    namespace's; None when the cell does not read it or it is not a number."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    reads = False
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant):
            v = n.value.value
            if any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    return float(v)
        if isinstance(n, ast.Name) and n.id == name:
            reads = True
    if not reads:
        return None
    v = namespace.get(name)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return None


def _show(v: float, integer: bool) -> str:
    return str(int(v)) if integer else f"{v:g}"


def size_arg(n: int) -> str:
    """A size as ``--fit-in`` takes it: ``12GiB``, ``1500MiB``."""
    if n % GiB == 0:
        return f"{n // GiB}GiB"
    return f"{n // MiB}MiB"  # rounded down: a target never larger than the cap


def scan_knowledge(
    code: str,
    device: int,
    namespace: Mapping[str, Any],
    scans: Sequence[ScanResult],
    cap: int | None,
    outside: int | None = None,
) -> tuple[int | None, str]:
    """(the whole need above the cell's start, when a scan knows it; a hint).

    ``cap``: what PyTorch may reserve here now (``set_per_process_memory_fraction``), None
    when uncapped; ``outside``: what this process holds on the device beyond PyTorch (CUDA
    context, libraries). ``--fit-in`` means a card's whole memory, from which the scan
    takes ``outside``, so the scan it suggests for a capped cell fits in the cap plus
    ``outside``: its budget is then the cap."""
    for s in reversed(scans):
        if s.device != device or s.fit is None:
            continue
        value = _value_in(code, s.name, namespace)
        if value is None:
            continue
        base = max((r.base for r in s.probes if r.ok), default=0)
        full = max(0, round(s.fit(value) - base))
        where = f"In[{s.execution_count}]" if s.execution_count is not None else "scan()"
        said = (
            f"`{s.name}` = {_show(value, s.integer)} needs about {format_bytes(full)} (the fit of "
        )
        said += f"the scan of {where})"
        failed = s.smallest_failed
        if s.verify_failed and failed is not None:
            # its verification ran out of memory at every value tried: nothing fits that
            # the scan knows of, and its fit is known to promise too much
            said += (
                f"; it found no {s.name} that fits in {s.target.label}: every value tried ran "
                f"out of memory under its cap, down to {_show(failed, s.integer)}"
            )
            smaller = smaller_values(failed, s.integer)
            if len(smaller) >= 2:
                values = ",".join(_show(x, s.integer) for x in smaller)
                said += f"; scan smaller values: `%%gpumem --scan {s.name}={values}`"
            return full, said
        if s.largest is not None:
            how = "verified" if s.verified is not None else "predicted"
            said += f"; {_show(s.largest, s.integer)} fits in {s.target.label} ({how})"
        if cap is not None and abs(cap - s.cap) > 0.02 * s.cap:
            now = largest_within(s.fit, cap - s.margin, s.integer)
            if now is not None:
                said += (
                    f"; under the current cap of {format_bytes(cap)} its fit predicts "
                    f"{_show(now, s.integer)} (not verified)"
                )
        return full, said
    sizes = size_variables(code, dict(namespace))
    if sizes:
        name, value, inside = sizes[0]
        if cap is None:
            suggestion = scan_suggestion(name, value, inside, "")
            return None, suggestion.replace(" --fit-in ", "")  # the default: free now
        whole = cap + max(0, outside or 0)
        suggestion = scan_suggestion(name, value, inside, size_arg(whole))
        if outside:
            suggestion += (
                f" (--fit-in is a card's whole memory, from which the scan takes what this "
                f"process holds outside PyTorch: the current cap of {format_bytes(cap)} plus the "
                f"{format_bytes(outside)} held outside it here)"
            )
        else:
            suggestion += (
                f" (--fit-in is a card's whole memory, from which the scan takes what this "
                f"process holds outside PyTorch, unknown here: add it to the current cap of "
                f"{format_bytes(cap)})"
            )
        return None, suggestion
    return None, ""
