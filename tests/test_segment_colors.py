"""The segment map has one palette: the notebook's picture (reporters/segments.py) and the
panel's Segments tab (labextension/style/segments.css) colour each kind of block alike.
The panel's test (labextension/test/segmentColors.spec.ts) pins the same colours."""

from __future__ import annotations

import re
from pathlib import Path

from jupyter_gpumem.reporters.segments import COLORS

ROOT = Path(__file__).resolve().parent.parent

PALETTE = {
    "allocated": "var(--jp-brand-color1,#1976d2)",
    "pending": "var(--jp-brand-color3,#90caf9)",
    "piece": "var(--jp-warn-color1,#f57c00)",
    "cached": "var(--jp-layout-color3,#bdbdbd)",
}


def panel_colors() -> dict[str, str]:
    """Each `.jp-GpuMem-block-KIND` rule's background in the panel's stylesheet."""
    css = (ROOT / "labextension/style/segments.css").read_text()
    rules = re.findall(r"\.jp-GpuMem-block-([a-z]+)\s*\{([^}]*)\}", css)
    out = {}
    for kind, body in rules:
        declared = {
            name.strip(): value.strip()
            for name, value in re.findall(r"([a-z-]+)\s*:\s*([^;]+);", body)
        }
        out[kind] = re.sub(r"\s+", "", declared.get("background", ""))
    return out


def test_the_notebook_picture_uses_the_palette():
    assert COLORS == PALETTE


def test_the_panel_colours_each_kind_as_the_notebook_does():
    assert panel_colors() == PALETTE
