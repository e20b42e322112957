"""Host memory of this process."""

from __future__ import annotations

import os

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def host_rss() -> int | None:
    """Resident set size in bytes. Reads /proc directly on Linux (5 us, vs 6 us for psutil)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None
