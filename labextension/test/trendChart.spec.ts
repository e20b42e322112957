/**
 * The tooltip of a cell marker on the trend chart.
 */
import { describe, expect, it } from 'vitest';

import { ICellMarker } from '../src/protocol';
import { plainTrans } from '../src/present/trans';
import { cellTooltip } from '../src/views/overview/trendChart';
import { MiB, postmortem } from './fixtures';

const trans = plainTrans as any;

describe('the tooltip of a cell marker', () => {
  const marker: ICellMarker = {
    execution_count: 7,
    time: 1000,
    wall_time: 1.5,
    failed: false,
    first_line: 'x = torch.ones(n)',
    devices: [
      {
        index: 0,
        allocated_delta: 3 * MiB,
        reserved_delta: 4 * MiB,
        peak_allocated: 10 * MiB,
        kept_at: [
          { line: 2, text: 'x = torch.ones(n)', bytes: 2 * MiB, blocks: 1 },
          { line: 4, text: 'y = x * 2', bytes: 1 * MiB, blocks: 1 }
        ]
      }
    ]
  };

  it('names the lines that kept memory', () => {
    const tooltip = cellTooltip(marker, 0, trans).split('\n');
    expect(tooltip.slice(-2)).toEqual([
      'kept at line 2 `x = torch.ones(n)` 2.00 MiB',
      'kept at line 4 `y = x * 2` 1.00 MiB'
    ]);
  });

  it('is as before without kept lines', () => {
    const plain: ICellMarker = {
      ...marker,
      devices: [{ ...marker.devices[0], kept_at: undefined }]
    };
    expect(cellTooltip(plain, 0, trans)).toBe(
      [
        'Cell [7]',
        'x = torch.ones(n)',
        'Wall time 1.50 s',
        'Allocated +3.00 MiB',
        'Reserved +4.00 MiB',
        'Peak allocated 10.0 MiB'
      ].join('\n')
    );
  });

  it('says the cell ran out of memory', () => {
    const failed: ICellMarker = {
      ...marker,
      failed: true,
      postmortems: [postmortem()]
    };
    expect(cellTooltip(failed, 0, trans)).toContain(
      'Out of memory: asked for 128 MiB'
    );
    expect(cellTooltip(failed, 1, trans)).not.toContain('Out of memory');
  });
});
