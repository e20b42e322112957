/**
 * The segment map has one palette: the panel's Segments tab (style/segments.css)
 * colours each kind of block as the picture drawn in a notebook does
 * (jupyter_gpumem/reporters/segments.py, COLORS; tests/test_segment_colors.py
 * pins the same colours on the Python side).
 */
import { readFileSync } from 'fs';
import { join } from 'path';
import { describe, expect, it } from 'vitest';

const PALETTE: Record<string, string> = {
  allocated: 'var(--jp-brand-color1,#1976d2)',
  pending: 'var(--jp-brand-color3,#90caf9)',
  piece: 'var(--jp-warn-color1,#f57c00)',
  cached: 'var(--jp-layout-color3,#bdbdbd)'
};

const squeeze = (s: string): string => s.replace(/\s+/g, '');

/** Each `.jp-GpuMem-block-KIND` rule's background in the panel's stylesheet. */
function panelColors(): Record<string, string> {
  const css = readFileSync(
    join(__dirname, '..', 'style', 'segments.css'),
    'utf8'
  );
  const out: Record<string, string> = {};
  for (const [, kind, body] of css.matchAll(
    /\.jp-GpuMem-block-([a-z]+)\s*\{([^}]*)\}/g
  )) {
    const background = /(?:^|;|\s)background\s*:\s*([^;]+);/.exec(body);
    out[kind] = background ? squeeze(background[1]) : '';
  }
  return out;
}

/** COLORS of the notebook's segment map. */
function notebookColors(): Record<string, string> {
  const py = readFileSync(
    join(__dirname, '..', '..', 'jupyter_gpumem', 'reporters', 'segments.py'),
    'utf8'
  );
  const block = /^COLORS = \{\n([\s\S]*?)\n\}/m.exec(py);
  expect(block).not.toBeNull();
  const out: Record<string, string> = {};
  for (const [, kind, color] of block![1].matchAll(
    /"([a-z]+)":\s*"([^"]+)"/g
  )) {
    out[kind] = color;
  }
  return out;
}

describe('the colours of the segment map', () => {
  it('are the palette in the panel', () => {
    expect(panelColors()).toEqual(PALETTE);
  });

  it('are the colours of the picture drawn in a notebook', () => {
    expect(notebookColors()).toEqual(PALETTE);
  });
});
