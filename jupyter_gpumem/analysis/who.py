"""Who holds the live GPU memory of a device: owners in the namespace, allocation lines,
cells. Fed with plain records (an :class:`AllocatorSnapshot`, the walk's
:class:`Reference` list), so it runs unchanged on recorded data.

Every byte is counted once: a storage reached by several names (a view and its base, a
parameter held by a model and its optimizer) goes to the strongest owner (``VIA_RANK``,
then the first name), and a block that no name reaches is a row of its own, so the rows
add up to the allocator's ``allocated``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress, filterfalse
from operator import itemgetter
from typing import Literal

from ..model import AllocatorSnapshot, Block, Reference, Site, WhoReport, WhoRow, WhoRowKind
from ..units import format_bytes
from .sites import SiteResolver

By = Literal["variable", "line", "cell"]

VIA_WORDS = {
    "tensor": "tensor",
    "parameters": "module parameters",
    "buffers": "module buffers",
    "attribute": "object attribute",
    "container": "in a container",
    "gradients": "gradients",
    "optimizer state": "optimizer state",
    "autograd graph": "autograd graph (saved tensors)",
    "optimizer params": "parameters the optimizer holds",
    "output history": "output history",
    "traceback": "kept traceback",
}

UNREACHABLE = "not reachable from the namespace"
_DEVICE, _ADDRESS = itemgetter(0), itemgetter(1)  # Reference.device, Reference.address


@dataclass
class DeviceHoldings:
    """The live blocks of one device with their owner and, lazily, their site."""

    device: int
    tracking: bool
    blocks: dict[int, Block]  # address -> live block
    owners: dict[int, Reference]  # block address -> strongest reference
    outside: int  # bytes of reachable tensors whose memory the allocator doesn't own
    resolver: SiteResolver
    before: frozenset[tuple[int, int, int]] = frozenset()
    notes: list[str] = field(default_factory=list)
    walked: bool = True  # the namespace was read
    elapsed: float = 0.0
    _sites: dict[int, Site] | None = None
    _allocated: int | None = None

    @property
    def allocated(self) -> int:
        if self._allocated is None:
            self._allocated = sum(map(_SIZE, self.blocks.values()))
        return self._allocated

    def site(self, address: int) -> Site:
        return self._all_sites()[address]

    def _all_sites(self) -> dict[int, Site]:
        """Every block's site, resolved at once (the views ask for all of them)."""
        sites = self._sites
        if sites is None:
            before, device, blocks = self.before, self.device, self.blocks
            if before:
                items = [(b["frames"], (device, a, b["size"]) in before) for a, b in blocks.items()]
            else:
                items = [(b["frames"], False) for b in blocks.values()]
            sites = self._sites = dict(zip(blocks, self.resolver.sites(items), strict=True))
        return sites

    # -- views -------------------------------------------------------------------------
    def report(self, by: By = "variable", n: int | None = 20) -> WhoReport:
        if by == "variable":
            rows, explained = self._by_variable(n)
        elif by == "line":
            rows, explained = self._by_site(n, cells=False)
        else:
            rows, explained = self._by_site(n, cells=True)
        notes = list(self.notes)
        if by != "variable" and not self.tracking:
            notes.append(
                "allocation sites are not recorded: `%gpumem track on` records where each "
                "block is allocated from then on"
            )
        return WhoReport(
            device=self.device,
            by=by,
            allocated=self.allocated,
            explained=explained,
            rows=tuple(rows),
            tracking=self.tracking,
            notes=tuple(notes),
            outside_allocator=self.outside,
            elapsed=self.elapsed,
        )

    def _by_variable(self, n: int | None) -> tuple[list[WhoRow], int]:
        # Tens of thousands of owned blocks: group their addresses in one Python pass, then
        # work per group with C loops (map, sum, max) rather than per block in Python.
        blocks, owners = self.blocks, self.owners
        sites = self._all_sites() if self.tracking else None
        groups: dict[tuple[str, str], list[int]] = {}
        for address, ref in owners.items():
            key = (ref.owner, ref.via)
            addresses = groups.get(key)
            if addresses is None:
                groups[key] = [address]
            else:
                addresses.append(address)
        rows = []
        for (owner, via), addresses in groups.items():
            sizes = list(map(_SIZE, map(blocks.__getitem__, addresses)))
            size = sum(sizes)
            top = addresses[sizes.index(max(sizes))]  # the first largest block
            site: str | None = None
            if sites is not None:
                site = _heaviest_site(_bytes_per_site(map(sites.__getitem__, addresses), sizes))
            rows.append(
                WhoRow(
                    owner,
                    VIA_WORDS.get(via, via),
                    size,
                    len(addresses),
                    owners[top].path,
                    "owner",
                    site or "",
                )
            )
        rows.sort(key=lambda r: (-r.bytes, r.key))
        explained = sum(r.bytes for r in rows)
        rows = _top(rows, n, "owners")
        unreached = list(filterfalse(owners.__contains__, blocks))
        if unreached or not rows:
            detail = "temporaries of a running computation, objects this walk does not open"
            if not self.walked:
                detail = "the namespace was not read"
            rows.append(
                WhoRow(
                    UNREACHABLE,
                    detail,
                    sum(map(_SIZE, map(blocks.__getitem__, unreached))),
                    len(unreached),
                    "",
                    "unreachable",
                    self._top_site(unreached) or "",
                )
            )
        return rows, explained

    def _top_site(self, addresses: Sequence[int]) -> str | None:
        sites, blocks = self._all_sites(), self.blocks
        sizes = list(map(_SIZE, map(blocks.__getitem__, addresses)))
        return _heaviest_site(_bytes_per_site(map(sites.__getitem__, addresses), sizes))

    def _by_site(self, n: int | None, cells: bool) -> tuple[list[WhoRow], int]:
        # Group by site object first (a few hundred), then by row key.
        per_site: dict[int, tuple[Site, list[int]]] = {}
        for address, s in self._all_sites().items():
            entry = per_site.get(id(s))
            if entry is None:
                per_site[id(s)] = (s, [address])
            else:
                entry[1].append(address)
        groups: dict[tuple, list[int]] = {}
        labels: dict[tuple, tuple[str, str, WhoRowKind]] = {}
        for s, addresses in per_site.values():
            if not cells:
                key: tuple = (s.kind, s.filename, s.line)
                labels[key] = _site_row(s)
                groups.setdefault(key, []).extend(addresses)
                continue
            if s.kind in ("no_stack", "before_tracking"):
                key = (s.kind,)
                labels[key] = (s.label, "", "untracked")
                groups.setdefault(key, []).extend(addresses)
                continue
            for a in addresses:  # the cell: the outermost cell frame, per block
                b = self.blocks[a]
                count = self._cell_of(b)
                if count is not None:
                    key = ("cell", count)
                    if key not in labels:
                        labels[key] = (f"In[{count}]", self._cell_first_line(b, count), "cell")
                else:
                    key = ("not_cell",)
                    labels[key] = ("not from a cell", "scripts, imported modules", "site")
                groups.setdefault(key, []).append(a)
        rows = []
        explained = 0
        blocks, owners = self.blocks, self.owners
        for key, addresses in groups.items():
            label, detail, kind = labels[key]
            sizes = list(map(_SIZE, map(blocks.__getitem__, addresses)))
            size = sum(sizes)
            holders: dict[str, int] = {}
            for r, block_size in zip(map(owners.get, addresses), sizes, strict=True):
                if r is not None:
                    holders[r.owner] = holders.get(r.owner, 0) + block_size
            example = ""
            if holders:
                top_owner, top_bytes = max(holders.items(), key=lambda kv: kv[1])
                example = f"held by {top_owner}" + (
                    f" ({format_bytes(top_bytes)})" if top_bytes != size else ""
                )
            rows.append(WhoRow(label, detail, size, len(addresses), example, kind))
            if kind != "untracked":
                explained += size
        rows.sort(key=lambda r: (r.kind == "untracked", -r.bytes, r.key))
        untracked = [r for r in rows if r.kind == "untracked"]
        tracked = _top([r for r in rows if r.kind != "untracked"], n, "lines")
        return tracked + untracked, explained

    def _cell_of(self, b: Block) -> int | None:
        """The cell whose run allocated the block: its outermost cell frame."""
        for f in reversed(b["frames"]):
            if self.resolver.file_kind(f["filename"]) == "cell":
                return self.resolver.cells.execution_count(f["filename"])
        return None

    def _cell_first_line(self, b: Block, count: int) -> str:
        for f in reversed(b["frames"]):
            if self.resolver.cells.execution_count(f["filename"]) == count:
                for line in range(1, 50):
                    text = self.resolver.cells.line_text(f["filename"], line)
                    if text and not text.startswith(("%%gpumem", "#")):
                        return text
                return ""
        return ""


_SIZE = itemgetter("size")


def _bytes_per_site(sites: Iterable[Site], sizes: Sequence[int]) -> list[list]:
    """[site, bytes] per distinct site (sites are shared objects), in first-seen order."""
    sites = list(sites)
    ids = list(map(id, sites))
    if ids and ids.count(ids[0]) == len(ids):  # one site (10k tensors from one line): in C
        return [[sites[0], sum(sizes)]]
    by_site: dict[int, list] = {}
    for s, size in zip(sites, sizes, strict=True):
        acc = by_site.get(id(s))
        if acc is None:
            by_site[id(s)] = [s, size]
        else:
            acc[1] += size
    return list(by_site.values())


def _heaviest_site(by_site: Iterable[list]) -> str | None:
    """The label of the known site with the most bytes, from [site, bytes] pairs."""
    known = [acc for acc in by_site if acc[0].kind in ("cell", "file", "library")]
    if not known:
        return None
    s = max(known, key=lambda acc: acc[1])[0]
    return s.label + (f" `{s.text}`" if s.text else "")


def _site_row(s: Site) -> tuple[str, str, WhoRowKind]:
    """(key, detail, kind) of a by-line row."""
    if s.kind in ("no_stack", "before_tracking"):
        return (s.label, "", "untracked")
    detail = f"{s.function}(): " if s.function not in ("<module>", "") else ""
    detail += f"`{s.text}`" if s.text else ""
    if s.library:
        detail += f" -> {s.library}"
    return (s.label, detail, "site")


def _top(rows: list[WhoRow], n: int | None, what: str) -> list[WhoRow]:
    if n is None or len(rows) <= n:
        return rows
    rest = rows[n:]
    more = WhoRow(
        f"{len(rest)} more {what if len(rest) > 1 else what.rstrip('s')}",
        "",
        sum(r.bytes for r in rest),
        sum(r.blocks for r in rest),
        "",
        "rest",
    )
    return [*rows[:n], more]


def live_blocks(snapshot: AllocatorSnapshot, device: int) -> dict[int, Block]:
    return snapshot.live_blocks(device)


def holdings(
    snapshot: AllocatorSnapshot,
    device: int,
    refs: Sequence[Reference] | None,
    resolver: SiteResolver,
    before: frozenset[tuple[int, int, int]] = frozenset(),
    notes: Sequence[str] = (),
    elapsed: float = 0.0,
) -> DeviceHoldings:
    """Match references with the live blocks of ``device``. ``refs=None``: the namespace
    was not read (every block is then unreachable)."""
    blocks = live_blocks(snapshot, device)
    owners: dict[int, Reference] = {}
    outside: dict[int, int] = {}
    here = list(compress(refs, map(device.__eq__, map(_DEVICE, refs)))) if refs else []
    addresses = list(map(_ADDRESS, here))
    if all(map(blocks.__contains__, addresses)) and len(set(addresses)) == len(here):
        # Every storage starts a block and no two share one (tensors made one by one):
        # each block's only reference owns it, what the loop below gives, in C.
        owners = dict(zip(addresses, here, strict=True))
        here = []
    starts = sorted(blocks) if here else []
    for ref in here:
        address = ref.address if ref.address in blocks else _containing(starts, blocks, ref.address)
        if address is None:
            outside[ref.address] = max(outside.get(ref.address, 0), ref.nbytes)
            continue
        best = owners.get(address)
        if best is None or ref.rank < best.rank:
            owners[address] = ref
    return DeviceHoldings(
        device=device,
        tracking=snapshot.tracking,
        blocks=blocks,
        owners=owners,
        outside=sum(outside.values()),
        resolver=resolver,
        before=before,
        notes=list(notes),
        walked=refs is not None,
        elapsed=elapsed,
    )


def _containing(starts: list[int], blocks: dict[int, Block], address: int) -> int | None:
    i = bisect.bisect_right(starts, address) - 1
    if i >= 0:
        start = starts[i]
        if address < start + blocks[start]["size"]:
            return start
    return None
