"""What an action did, in words: the lines ``%gpumem empty-cache``, ``caching``, ``limit``,
``reset-peak`` and ``release-traceback`` print, and the status line of the ``%gpumem
panel`` widget's buttons (whose words follow the JupyterLab panel's,
``labextension/src/views/present/messages.ts``). Pure functions of the results' figures,
for the magics' commands and ``widget.py``."""

from __future__ import annotations

from collections.abc import Mapping

from ..units import cuda_label, format_bytes


# -- the magics' lines ---------------------------------------------------------------------
def empty_cache_lines(released: Mapping[int, int], gc_collected: int) -> list[str]:
    if not released:
        return [
            (
                f"gpumem: gc.collect() freed {gc_collected} objects; CUDA is not initialised,"
                " so there was no cache to empty"
            )
        ]
    parts = [f"{cuda_label(i)} {format_bytes(b)}" for i, b in sorted(released.items())]
    return [
        (
            f"gpumem: released to the driver: {', '.join(parts)} "
            f"(gc.collect() freed {gc_collected} objects)"
        )
    ]


def caching_lines(caching: bool, initialised_cuda: bool) -> list[str]:
    msg = f"gpumem: caching allocator is now {'on' if caching else 'off'}"
    if initialised_cuda:
        msg += " (this initialised CUDA: the switch needs a context)"
    out = [msg]
    if not caching:
        out.append(
            "  Cached blocks stay reserved until `%gpumem empty-cache`. From now on every "
            "allocation is a direct cudaMalloc, invisible to PyTorch's counters and peaks: "
            "reports show it under 'outside PyTorch' and device figures."
        )
    return out


def limit_lines(
    device: int,
    fraction: float | None,
    nbytes: int | None,
    initialised_cuda: bool,
    reserved_over_cap: int,
) -> list[str]:
    if fraction is None:
        out = [f"gpumem: cap removed on {cuda_label(device)}"]
    else:
        out = [
            (
                f"gpumem: PyTorch may reserve at most {format_bytes(nbytes)} on "
                f"{cuda_label(device)} "
                f"({fraction:.4g} of the device); a larger request raises OutOfMemoryError"
            )
        ]
    if initialised_cuda:
        out.append("  (this initialised CUDA on that device: a cap needs a context)")
    if reserved_over_cap:
        out.append(
            f"  {format_bytes(reserved_over_cap)} is already reserved above the cap; it stays "
            "until freed and `%gpumem empty-cache`"
        )
    return out


def reset_peak_line(device: int | None) -> str:
    return "gpumem: peak counters reset" + (
        f" on {cuda_label(device)}" if device is not None else ""
    )


def release_traceback_line(frames: int, freed: Mapping[int, int], held: int | None) -> str:
    """``held``: what the traceback's frames held before, when known."""
    if not frames:
        return "gpumem: no kept traceback with frames of its own: nothing to release"
    nonzero = {d: b for d, b in freed.items() if b}
    what = (
        ", ".join(f"{cuda_label(d)} {format_bytes(b)}" for d, b in sorted(nonzero.items()))
        or "no GPU memory"
    )
    expected = f" (it held {format_bytes(held)})" if held else ""
    return (
        f"gpumem: released the kept traceback ({frames} frame(s)): freed {what}{expected}."
        " %tb and %debug no longer show that error."
    )


# -- the widget's status line ----------------------------------------------------------------
def empty_cache_status(released: Mapping[int, int]) -> str:
    total = sum(released.values())
    if total <= 0:
        return "Nothing to release: the cache held no free blocks."
    if len(released) == 1:
        return f"Released {format_bytes(total)} to the driver"
    parts = ", ".join(f"{cuda_label(i)}: {format_bytes(b)}" for i, b in sorted(released.items()))
    return f"Released {format_bytes(total)} to the driver ({parts})"


def caching_status(caching: bool) -> str:
    if caching:
        return "Caching is on: freed blocks stay with PyTorch for reuse."
    return (
        "Caching is off: each allocation goes to the driver; allocator figures no longer "
        "count new allocations."
    )


RESET_PEAK_STATUS = "Peak reset to the current allocation"


def limit_status(device: int, nbytes: int | None, fraction: float | None) -> str:
    if nbytes is None or fraction is None:
        return f"Cap removed on {cuda_label(device)}"
    return (
        f"Capped {cuda_label(device)} at {format_bytes(nbytes)} ({percent(fraction)} of the device)"
    )


def percent(fraction: float) -> str:
    rounded = round(fraction * 1000) / 10
    return f"{rounded:.0f}%" if rounded == int(rounded) else f"{rounded:.1f}%"
