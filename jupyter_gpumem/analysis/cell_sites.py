"""Which lines of a cell allocated the memory the cell left alive.

A block counts for the cell when it was not alive at the previous snapshot (``known``:
address -> size of that device's live blocks then)
and its recorded stack passes through the cell's code (``cell_files``: ipykernel names a
cell's file after a hash of its code, so a re-run of the same code has the same file; the
``known`` set keeps earlier runs' blocks out). It is attributed to the innermost frame in
the cell: for ``acts.append(f(x))`` the line of that call, even when ``f`` was defined in
another cell.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..model import ACTIVE, AllocatorSnapshot, DeviceAttribution, LineShare, Site
from .sites import SiteResolver


def cell_attribution(
    snapshot: AllocatorSnapshot,
    device: int,
    cell_files: frozenset[str],
    known: Mapping[int, int],
    resolver: SiteResolver,
) -> DeviceAttribution:
    lines: dict[int, list[int]] = {}  # line -> [bytes, blocks]
    sites: dict[int, Site] = {}
    files: dict[int, str] = {}
    new = elsewhere = no_stack = 0
    for seg in snapshot.device_segments(device):
        for b in seg.get("blocks", ()):
            if b["state"] != ACTIVE or known.get(b["address"]) == b["size"]:
                continue
            size = b["size"]
            new += size
            frames = b["frames"]
            if not frames:
                no_stack += size
                continue
            f = resolver.cell_line(frames, cell_files)
            if f is None:
                elsewhere += size
                continue
            line = int(f["line"])
            acc = lines.setdefault(line, [0, 0])
            acc[0] += size
            acc[1] += 1
            if line not in sites:
                sites[line] = resolver.site(frames)
                files[line] = f["filename"]
    shares = [
        LineShare(
            line=line,
            text=resolver.cells.line_text(files[line], line),
            bytes=acc[0],
            blocks=acc[1],
            site=sites[line],
        )
        for line, acc in lines.items()
    ]
    shares.sort(key=lambda s: (-s.bytes, s.line))
    return DeviceAttribution(device, new, tuple(shares), elsewhere, no_stack)


def live_blocks_by_device(snapshot: AllocatorSnapshot) -> dict[int, dict[int, int]]:
    """device -> {address: size} of every live block: what ``known`` is made of."""
    out: dict[int, dict[int, int]] = {}
    for s in snapshot.segments:
        d = out.setdefault(s.get("device", 0), {})
        for b in s.get("blocks", ()):
            if b["state"] == ACTIVE:
                d[b["address"]] = b["size"]
    return out
