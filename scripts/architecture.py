"""The package's layers and its import graph: one source for the architecture test
(``tests/test_architecture.py``) and the picture in ``docs/architecture.md``.

    python scripts/architecture.py          # print the graph, layer by layer
    python scripts/architecture.py --write  # regenerate docs/architecture.svg

A module may import its own layer and the layers below it, never one above: collectors
know nothing of reporters, the model nothing of torch. Every import counts, including
the ones inside functions (the package imports lazily to keep its own import cheap).
``testing`` (recorded backends for tests and demos) may import anything below the front
ends, and no production module may import it.
"""

from __future__ import annotations

import ast
import sys
from html import escape
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jupyter_gpumem"
PICTURE = ROOT / "docs" / "architecture.svg"

# (layer, what it is, its modules: a package name covers its modules). Bottom first.
LAYERS: list[tuple[str, str, tuple[str, ...]]] = [
    ("base", "units, log", ("_version", "units", "log")),
    ("model", "the typed records; the errors", ("model", "errors")),
    ("collectors", "talk to torch, NVML, psutil, the namespace", ("collectors",)),
    ("analysis", "pure functions of records", ("analysis",)),
    ("reporters", "records as text, HTML, SVG", ("reporters",)),
    ("core", "services: tracking, history, actions, attribution, scans", ("core",)),
    ("protocol", "the panel protocol: schema, checks, conversion, handler", ("protocol",)),
    (
        "front ends",
        "IPython, the kernel, the widget, the server, the CLI, the demo",
        ("_ipython", "_kernel", "widget", "server", "run", "demo", "api", "__init__", "__main__"),
    ),
]
TEST_ONLY = "testing"


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int | None:
    """The rank of a module (``collectors.nvml`` -> 2); None for ``testing``."""
    top = module.split(".")[0]
    if top == TEST_ONLY:
        return None
    for rank, (_, _, members) in enumerate(LAYERS):
        if top in members:
            return rank
    raise LookupError(f"jupyter_gpumem.{module} is in no layer: add it to LAYERS")


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """The package modules a ``from ... import ...`` names (relative or absolute)."""
    if node.level:
        base = module.split(".") if module != "__init__" else []
        if not is_package:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        target = ".".join(base + ([node.module] if node.module else []))
    elif node.module and (node.module + ".").startswith("jupyter_gpumem."):
        target = node.module[len("jupyter_gpumem.") :]
    elif node.module == "jupyter_gpumem":
        target = ""
    else:
        return []
    if not target:  # "from . import x" / "from jupyter_gpumem import x"
        return [a.name if a.name in _TOP else "__init__" for a in node.names]
    # "from .core import actions" imports the module core.actions, not the package
    return [
        f"{target}.{a.name}" if _is_module(f"{target}.{a.name}") else target for a in node.names
    ]


def _is_module(module: str) -> bool:
    path = PACKAGE.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


_TOP = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()} - {"labextension"}


def imports() -> dict[str, set[str]]:
    """Module -> the package modules it imports (anywhere in its body)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "labextension" in path.parts:
            continue
        module = module_name(path)
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                found.update(_resolve(module, is_package, node))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("jupyter_gpumem."):
                        found.add(a.name[len("jupyter_gpumem.") :])
        graph[module] = {m for m in found if m and m != module}
    return graph


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a higher layer, and every production import of ``testing``."""
    out = []
    for module, targets in sorted(graph.items()):
        mine = layer_of(module)
        for t in sorted(targets):
            theirs = layer_of(t)
            if theirs is None:
                if mine is not None:
                    out.append(f"{module} imports the test-only {t}")
            elif mine is not None and theirs > mine:
                out.append(
                    f"{module} ({LAYERS[mine][0]}) imports {t} ({LAYERS[theirs][0]}), a layer above"
                )
            elif mine is None and theirs == len(LAYERS) - 1:
                out.append(f"{module} (test-only) imports the front end {t}")
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles among production modules (``testing`` left out): each strongly
    connected component of more than one module, sorted. Every import counts, as in
    :func:`imports` (inside functions and ``TYPE_CHECKING`` blocks too)."""
    prod = {
        m: sorted(t for t in ts if t in graph and layer_of(t) is not None)
        for m, ts in graph.items()
        if layer_of(m) is not None
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(prod):  # Tarjan's, iterative
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            targets = prod[v]
            if i < len(targets):
                work.append((v, i + 1))
                w = targets[i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return sorted(found)


def layer_edges(graph: dict[str, set[str]]) -> dict[tuple[int, int], int]:
    """(from layer, to layer) -> how many module imports cross it (within a layer too)."""
    edges: dict[tuple[int, int], int] = {}
    for module, targets in graph.items():
        a = layer_of(module)
        for t in targets:
            b = layer_of(t)
            if a is None or b is None:
                continue
            edges[(a, b)] = edges.get((a, b), 0) + 1
    return edges


PALETTE = ["#7f7f7f", "#8c564b", "#2ca02c", "#17becf", "#9467bd", "#1f77b4", "#ff7f0e", "#d62728"]


def svg(graph: dict[str, set[str]]) -> str:
    """The layers as stacked boxes (their modules inside) and, on the right, one column
    per importing layer with an arrow into each layer it imports (thicker: more module
    imports; hover for the count). Self-contained; text in ``currentColor`` so that it reads
    in light and dark themes."""
    n = len(LAYERS)
    box_w, box_h, gap, left = 700, 64, 14, 10
    col0, col_w = left + box_w + 16, 22
    width = col0 + col_w * n + 10
    height = n * (box_h + gap) + 24
    y_of = {rank: 20 + (n - 1 - rank) * (box_h + gap) for rank in range(n)}
    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
            f'width="{width}" height="{height}" font-family="sans-serif" font-size="12" '
            'role="img" aria-label="jupyter_gpumem: layers and the imports between them">'
        ),
        (
            "<style>text{fill:currentColor}.box{fill:none;stroke:currentColor;stroke-opacity:.45}"
            ".mods{font-size:11px;fill-opacity:.75}</style>"
        ),
        f'<text x="{col0}" y="12" font-size="11">imports (one column per layer)</text>',
    ]
    for rank, (name, what, _) in enumerate(LAYERS):
        y = y_of[rank]
        mods = sorted(m for m in graph if layer_of(m) == rank)
        parts.append(
            f'<rect class="box" x="{left}" y="{y}" width="{box_w}" height="{box_h}" rx="6"/>'
        )
        parts.append(
            f'<text x="{left + 10}" y="{y + 18}"><tspan font-weight="bold" '
            f'fill="{PALETTE[rank]}">{rank} {escape(name)}</tspan>: {escape(what)}</text>'
        )
        line, lines = "", []
        for m in mods:
            piece = (", " if line else "") + m
            if len(line) + len(piece) > 118:
                lines.append(line + ",")
                line = m
            else:
                line += piece
        lines.append(line)
        for j, text in enumerate(lines[:3]):
            parts.append(
                f'<text class="mods" x="{left + 10}" y="{y + 34 + 13 * j}">{escape(text)}</text>'
            )
    edges = layer_edges(graph)
    mid = {rank: y_of[rank] + box_h / 2 for rank in range(n)}
    edge = left + box_w
    for a in range(n):
        targets = sorted(b for (s, b) in edges if s == a and b != a)
        if not targets:
            continue
        x = col0 + col_w * a
        colour = PALETTE[a]
        low = mid[min(targets)] + (a - n / 2) * 2
        parts.append(f'<g stroke="{colour}" fill="{colour}">')
        parts.append(f'<circle cx="{edge}" cy="{mid[a]:.0f}" r="3"/>')
        parts.append(
            f'<path fill="none" stroke-width="1.5" d="M{edge},{mid[a]:.0f} H{x} V{low:.0f}"/>'
        )
        for b in targets:
            count = edges[(a, b)]
            y = mid[b] + (a - n / 2) * 2
            w = 1 + min(count, 30) / 10
            parts.append(
                f'<path fill="none" stroke-width="{w:.1f}" d="M{x},{y:.0f} H{edge + 7}">'
                f"<title>{escape(LAYERS[a][0])} imports {escape(LAYERS[b][0])}: {count} "
                "module import(s)</title></path>"
            )
            parts.append(
                f'<path stroke="none" d="M{edge},{y:.0f} l8,-4 v8 z"><title>'
                f"{escape(LAYERS[a][0])} -> {escape(LAYERS[b][0])}</title></path>"
            )
        parts.append("</g>")
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv: list[str]) -> int:
    graph = imports()
    bad = violations(graph)
    if "--write" in argv:
        PICTURE.write_text(svg(graph))
        print(f"wrote {PICTURE.relative_to(ROOT)}")
    for rank, (name, _, _) in enumerate(LAYERS):
        print(f"{rank} {name}")
        for m in sorted(x for x in graph if layer_of(x) == rank):
            deps = sorted(graph[m])
            print(f"    {m} -> {', '.join(deps) if deps else '-'}")
    for v in bad:
        print("VIOLATION", v)
    for c in circles(graph):
        print("CIRCLE", " <-> ".join(c))
    return 1 if bad or circles(graph) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
