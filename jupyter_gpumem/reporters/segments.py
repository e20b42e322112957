"""``%gpumem segments``: the allocator's segments and their blocks, to scale within each
segment, as self-contained SVG (no script, no CDN; JupyterLab's theme colours with plain
fallbacks) and as text."""

from __future__ import annotations

from functools import lru_cache
from html import escape

from ..model import BlockView, SegmentMap, SegmentView
from ..units import cuda_label, format_bytes
from .picture import picture

# One colour per kind of block, as the panel's Segments tab has them
# (labextension/style/segments.css; tests on both sides pin them).
COLORS = {
    "allocated": "var(--jp-brand-color1,#1976d2)",
    "pending": "var(--jp-brand-color3,#90caf9)",
    "piece": "var(--jp-warn-color1,#f57c00)",
    "cached": "var(--jp-layout-color3,#bdbdbd)",
}
WORDS = {
    "allocated": "allocated",
    "pending": "freed, waiting for another stream",
    "piece": "free piece (empty_cache can't return it)",
    "cached": "cached free (empty_cache returns it)",
}
LEGEND = {
    "allocated": "allocated",
    "pending": "freed, pending",
    "piece": "free piece: fragmentation",
    "cached": "cached free: releasable",
}

WIDTH = 720  # viewBox units
LABEL = 150  # left column with the segment's size
BAR = WIDTH - LABEL - 8
ROW = 14
SMALL_PER_ROW = 6  # 2 MiB small-pool segments are drawn side by side


def summary_lines(m: SegmentMap) -> list[str]:
    sp = m.space
    owner = f"{m.owner} " if m.owner else ""  # another process's: a worker's
    lines = [
        (
            f"{owner}{cuda_label(m.device)}: {sp.segments} segment(s) hold "
            f"{format_bytes(sp.reserved)}: "
            f"allocated {format_bytes(sp.allocated)}, cached free {format_bytes(sp.cached_free)}"
        )
    ]
    if sp.segments:
        lines.append(
            f"free pieces in segments with live blocks: {sp.pieces} "
            f"({format_bytes(sp.pieces_bytes)}), "
            f"largest free block {format_bytes(sp.largest_free_block)}; "
            f"fragmentation {100 * sp.fragmentation:.0f} % of the cached free memory"
        )
        lines.append(
            f"empty-cache would return {format_bytes(sp.releasable)} (whole free segments)"
        )
    if m.omitted:
        lines.append(f"{m.omitted} smaller segment(s) not drawn ({format_bytes(m.omitted_bytes)})")
    return lines


def _segment_line(s: SegmentView) -> str:
    pieces = s.free_pieces
    kind = ("expandable " if s.expandable else "") + s.pool
    text = f"{kind} {format_bytes(s.size)} @{s.address:#x}: live {format_bytes(s.live)}"
    if pieces:
        text += (
            f", {len(pieces)} free piece(s) {format_bytes(sum(p.size for p in pieces))} "
            f"(largest {format_bytes(max(p.size for p in pieces))})"
        )
    elif all(b.kind == "cached" for b in s.blocks):
        text += ", all free (releasable)"
    return text


def segments_text(maps: list[SegmentMap], rows: int = 30) -> str:
    out: list[str] = []
    for m in maps:
        out += summary_lines(m)
        if m.segments:
            out.append("  segments, largest first:")
            out += [f"    {_segment_line(s)}" for s in m.segments[:rows]]
            if len(m.segments) > rows:
                out.append(f"    ... {len(m.segments) - rows} more (the picture shows all)")
    return "\n".join(out) if out else "no device holds segments"


def _title(b: BlockView, s: SegmentView) -> str:
    parts = [f"{WORDS[b.kind]}: {format_bytes(b.size)}"]
    if b.kind == "allocated" and b.requested and b.requested != b.size:
        parts.append(f"asked {format_bytes(b.requested)}")
    parts.append(f"stream {s.stream}")
    if b.site:
        parts.append(b.site)
    return ", ".join(parts)


def _runs(s: SegmentView, scale: float) -> list[tuple[int, int, str, str]]:
    """(offset, size, kind, title) to draw: a block, or a run of adjacent blocks of one kind
    each narrower than a unit of the drawing (merged: thousands of slivers say nothing)."""
    out: list[tuple[int, int, str, str]] = []
    blocks = s.blocks
    i, n = 0, len(blocks)
    while i < n:
        b = blocks[i]
        if b.size * scale >= 1.0:
            out.append((b.offset, b.size, b.kind, _title(b, s)))
            i += 1
            continue
        j, size = i, 0
        while j < n and blocks[j].kind == b.kind and blocks[j].size * scale < 1.0:
            size += blocks[j].size
            j += 1
        if j - i == 1:
            out.append((b.offset, b.size, b.kind, _title(b, s)))
        else:
            out.append(
                (b.offset, size, b.kind, f"{j - i} {WORDS[b.kind]} blocks: {format_bytes(size)}")
            )
        i = j
    return out


def _bar(
    s: SegmentView,
    x: float,
    y: float,
    width: float,
    height: float,
    frames: list[str],
    kinds: dict[str, list[str]],
) -> None:
    dash = ' stroke-dasharray="2 1"' if s.expandable else ""
    frames.append(
        f'<rect x="{x:.1f}" y="{y}" width="{width:.1f}" height="{height}"{dash}>'
        f"<title>{escape(_segment_line(s))}</title></rect>"
    )
    scale = width / s.size if s.size else 0.0
    for offset, size, kind, title in _runs(s, scale):
        kinds[kind].append(
            f'<rect x="{x + offset * scale:.1f}" y="{y + 1}" width="{max(0.4, size * scale):.1f}" '
            f'height="{height - 2}"><title>{_escaped(title)}</title></rect>'
        )


@lru_cache(maxsize=4096)  # blocks of one line and size share their title
def _escaped(text: str) -> str:
    return escape(text)


def segments_svg(m: SegmentMap) -> str:
    large = [s for s in m.segments if s.pool != "small"]
    small = [s for s in m.segments if s.pool == "small"]
    labels: list[str] = []
    frames: list[str] = []  # one outline per segment
    kinds: dict[str, list[str]] = {k: [] for k in COLORS}  # blocks, grouped by colour
    y = 0
    for s in large:
        label = ("exp. " if s.expandable else "") + format_bytes(s.size)
        labels.append(f'<text x="0" y="{y + ROW - 4}">{escape(label)}</text>')
        _bar(s, LABEL, y, BAR, ROW - 2, frames, kinds)
        y += ROW
    if small:
        labels.append(f'<text x="0" y="{y + ROW - 4}">{len(small)} small (2 MiB)</text>')
        tile = (BAR - (SMALL_PER_ROW - 1) * 4) / SMALL_PER_ROW
        for i, s in enumerate(small):
            col, row = i % SMALL_PER_ROW, i // SMALL_PER_ROW
            _bar(s, LABEL + col * (tile + 4), y + row * ROW, tile, ROW - 2, frames, kinds)
        y += ROW * (-(-len(small) // SMALL_PER_ROW))
    height = max(y, ROW)
    parts = [
        '<g font-size="10" fill="var(--jp-ui-font-color1,#333)">',
        *labels,
        "</g>",
        (
            '<g fill="var(--jp-layout-color1,#fff)" stroke="var(--jp-border-color1,#999)" '
            'stroke-width="0.5">'
        ),
        *frames,
        "</g>",
    ]
    for kind, rects in kinds.items():
        if rects:
            parts += [
                (
                    f'<g fill="{COLORS[kind]}" stroke="var(--jp-layout-color1,#fff)" '
                    f'stroke-width="0.3">'
                ),
                *rects,
                "</g>",
            ]
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
        f'width="100%" style="max-width:{WIDTH * 1.4:.0f}px" role="img" '
        f'aria-label="{escape(summary_lines(m)[0])}">' + "".join(parts) + "</svg>"
    )


def _legend() -> str:
    items = "".join(
        f'<span style="margin-right:12px"><span style="display:inline-block;width:10px;'
        f'height:10px;background-color:{COLORS[k]};margin-right:4px;vertical-align:middle">'
        f"</span>{escape(v)}</span>"
        for k, v in LEGEND.items()
    )
    return f'<div style="margin:4px 0">{items}</div>'


def segments_html(maps: list[SegmentMap]) -> str:
    out = [
        (
            '<div class="jp-GpuMem-segments" style="font-family:var(--jp-ui-font-family,'
            "sans-serif);font-size:var(--jp-ui-font-size1,13px);color:var(--jp-ui-font-color1,"
            'inherit)">'
        )
    ]
    for m in maps:
        lines = summary_lines(m)
        out.append(f"<div><b>{escape(lines[0])}</b></div>")
        out += [f"<div>{escape(line)}</div>" for line in lines[1:]]
        if m.segments:
            out.append(_legend())
            out.append(picture(segments_svg(m)))
    if not maps:
        out.append("<div>no device holds segments</div>")
    out.append("</div>")
    return "".join(out)
