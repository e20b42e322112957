"""What every self-contained HTML page of the tool shares (``jupyter-gpumem run --html``,
the comparison of two runs): plain colours for light and dark mode
(``prefers-color-scheme``), no scripts, no fonts or images to fetch."""

from __future__ import annotations

PAGE_CSS = """
:root { color-scheme: light dark; --fg: #1b1b1b; --bg: #ffffff; --muted: #5f6368;
  --line: #d0d0d0; --ok: #1b7f3b; --fail: #c62828; --warn: #a15c00; --zebra: #f4f4f4;
  --jp-ui-font-color2: #5f6368; --jp-border-color1: #999999;
  --jp-brand-color1: #1976d2; --jp-brand-color3: #64a8e8; --jp-warn-color2: #f39c12; }
@media (prefers-color-scheme: dark) {
  :root { --fg: #e6e6e6; --bg: #1e1e1e; --muted: #a0a0a0; --line: #444444; --ok: #5cc77f;
    --fail: #ff6b6b; --warn: #f0b35a; --zebra: #262626; --jp-ui-font-color2: #a0a0a0;
    --jp-border-color1: #777777; --jp-brand-color1: #64a8e8; --jp-brand-color3: #2f6da8; }
}
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
  background: var(--bg); margin: 2em auto; max-width: 1100px; padding: 0 1em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
.verdict { font-weight: 600; padding: .5em .8em; border-left: 5px solid; }
.pass { color: var(--ok); } .fail, .error { color: var(--fail); } .warn { color: var(--warn); }
.meta { color: var(--muted); }
table { border-collapse: collapse; width: 100%; font-size: .9em; }
th, td { padding: .25em .6em; border-bottom: 1px solid var(--line); text-align: left;
  vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tbody tr:nth-child(even) { background: var(--zebra); }
code { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
.legend span { margin-right: 12px; }
.replay { font-weight: 600; padding: .5em .8em; border-left: 5px solid; color: var(--warn); }
"""
