"""Small records of one process that the others build on: its memory on a device (NVML)
and the OOMs its allocator reported. They import nothing of the model, so that
:mod:`.measurement`, :mod:`.workers` and :mod:`.postmortem` import them, and one another
one way only (measurement -> workers -> postmortem)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class ProcessMemory(NamedTuple):
    """A process's memory on a device, from NVML."""

    pid: int
    name: str
    bytes: int


@dataclass(frozen=True, slots=True)
class OomEvent:
    """What the allocator's OOM observer saw just before raising OutOfMemoryError."""

    device: int
    requested: int  # bytes the failing allocation asked for
    allowed: int  # device total, or the cap when one is set
    free: int  # free device memory at that moment
