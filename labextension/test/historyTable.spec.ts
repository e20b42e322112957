/**
 * The History tab: the measured cells as a sortable table whose rows scroll
 * the notebook to their cell; the trend chart's `[N]` markers; finding the
 * cell of an execution count.
 */
import { readFileSync } from 'fs';
import * as React from 'react';
import { describe, expect, it, vi } from 'vitest';

import { findCell } from '../src/lab/cellScroller';
import { ICellMarker, IHistoryCell, PROTOCOL_REVISION } from '../src/protocol';
import { GpuMemEvent, initialState, reduce } from '../src/state';
import { plainTrans } from '../src/present/trans';
import {
  DEFAULT_SORT,
  historyDevices,
  historyRows,
  HistoryTable,
  HistoryView,
  sortHistory
} from '../src/views/history/historyTable';
import {
  placeMarkers,
  stepLine,
  TrendChart
} from '../src/views/overview/trendChart';
import { device, GiB, helloResult, MiB, okReply } from './fixtures';
import { byClass, findAll, render, text } from './render';

const trans = plainTrans as any;

function cell(
  n: number | null,
  kept: number | null,
  peak: number | null,
  extra: Partial<IHistoryCell> = {}
): IHistoryCell {
  return {
    execution_count: n,
    time: 1000 + (n ?? 0),
    first_line: `line of ${n}`,
    wall_time: 0.5,
    failed: false,
    devices: [
      {
        index: 0,
        allocated: 1 * GiB,
        allocated_delta: kept,
        reserved: 2 * GiB,
        reserved_delta: 0,
        peak_allocated: 2 * GiB,
        peak_above_start: peak,
        kept_at: null
      }
    ],
    ...extra
  };
}

const CELLS = [
  cell(3, 64 * MiB, 128 * MiB),
  cell(4, -32 * MiB, 4 * GiB),
  cell(5, null, null),
  cell(7, 1 * GiB, 1 * GiB, {
    failed: true,
    devices: [
      {
        index: 1,
        allocated: 0,
        allocated_delta: 0,
        reserved: 0,
        reserved_delta: 0,
        peak_allocated: 0,
        peak_above_start: 0,
        kept_at: null
      },
      {
        index: 0,
        allocated: 2 * GiB,
        allocated_delta: 1 * GiB,
        reserved: 2 * GiB,
        reserved_delta: 512 * MiB,
        peak_allocated: 2 * GiB,
        peak_above_start: 1 * GiB,
        kept_at: "In[7] line 2 `x = torch.empty(2**30, device='cuda')`"
      }
    ]
  })
];

const order = (sort: Parameters<typeof sortHistory>[1]) =>
  sortHistory(historyRows(CELLS, 0), sort).map(r => r.executionCount);

describe('the table of measured cells', () => {
  it('has a row per cell and device', () => {
    expect(historyDevices(CELLS)).toEqual([0, 1]);
    expect(historyRows(CELLS, 0).map(r => r.executionCount)).toEqual([
      3, 4, 5, 7
    ]);
    expect(historyRows(CELLS, 1).map(r => r.executionCount)).toEqual([7]);
  });

  it('sorts by any column, unknown figures last either way', () => {
    expect(order(DEFAULT_SORT)).toEqual([7, 5, 4, 3]);
    expect(order({ column: 'kept', descending: true })).toEqual([7, 3, 4, 5]);
    expect(order({ column: 'kept', descending: false })).toEqual([4, 3, 7, 5]);
    expect(order({ column: 'peak', descending: true })).toEqual([4, 7, 3, 5]);
    expect(order({ column: 'code', descending: false })).toEqual([3, 4, 5, 7]);
  });

  it('sorts on a header click and goes to the cell on a row click', () => {
    const onSort = vi.fn();
    const onGoTo = vi.fn();
    const nodes = render(
      React.createElement(HistoryTable, {
        rows: historyRows(CELLS, 0),
        device: 0,
        sort: { column: 'kept', descending: true },
        onSort,
        onGoTo,
        trans
      })
    );
    const headers = findAll(nodes, n => n.type === 'th');
    expect(headers.map(h => h.props['data-column'])).toEqual([
      'cell',
      'code',
      'kept',
      'peak'
    ]);
    // The peak is the cell's own, above its start: said so, unlike the
    // Overview's absolute "Peak allocated".
    expect(headers.map(h => text(h))).toEqual([
      'Cell',
      'First line',
      'Kept ▾',
      'Peak above start'
    ]);
    expect(findAll(headers[3], n => n.type === 'button')[0].props.title).toBe(
      "The cell's exact peak allocated, above what was allocated when it started (the Overview's Peak allocated counts from zero)"
    );
    expect(headers.map(h => h.props['aria-sort'])).toEqual([
      'none',
      'none',
      'descending',
      'none'
    ]);
    // The active column flips; another starts largest first.
    findAll(headers[2], n => n.type === 'button')[0].props.onClick();
    expect(onSort).toHaveBeenLastCalledWith({
      column: 'kept',
      descending: false
    });
    findAll(headers[3], n => n.type === 'button')[0].props.onClick();
    expect(onSort).toHaveBeenLastCalledWith({
      column: 'peak',
      descending: true
    });
    const rows = byClass(nodes, 'jp-GpuMem-historyRow');
    expect(rows.map(r => r.props['data-cell'])).toEqual([7, 3, 4, 5]);
    expect(text(rows[0])).toContain('[7]');
    expect(text(rows[0])).toContain('+1.00 GiB');
    expect(text(rows[0])).toContain('failed');
    expect(text(rows[0])).toContain('kept at In[7] line 2');
    expect(text(rows[0])).toContain('0.50 s · reserved +512 MiB');
    expect(text(rows[2])).toContain('-32.0 MiB');
    rows[1].props.onClick();
    expect(onGoTo).toHaveBeenCalledWith(3);
    const prevent = vi.fn();
    rows[2].props.onKeyDown({ key: 'Enter', preventDefault: prevent });
    expect(onGoTo).toHaveBeenLastCalledWith(4);
    expect(prevent).toHaveBeenCalled();
  });

  it('reads through the tab: a table per device, hostile lines as text', () => {
    const evil = '=HYPERLINK("x") <script>alert(1)</script>';
    const model = {
      settings: { units: 'binary' },
      fetchReading: vi.fn(),
      setReadingShown: vi.fn(),
      reportError: vi.fn(),
      scrollToCell: vi.fn(async () => undefined)
    };
    const events: GpuMemEvent[] = [
      { type: 'follow', kernelId: 'k1', source: 'a.ipynb' },
      {
        type: 'reply',
        action: 'hello',
        reply: okReply('hello', helloResult())
      },
      { type: 'reading_sent', view: 'history' },
      {
        type: 'reply',
        action: 'history',
        reply: okReply('history', {
          cells: [
            ...CELLS,
            cell(9, 0, 0, { first_line: evil }),
            cell(10, null, null, { devices: [], first_line: 'import torch' })
          ]
        } as any),
        at: 5
      }
    ];
    const nodes = render(
      React.createElement(HistoryView, {
        model: model as any,
        state: events.reduce(reduce, initialState()),
        trans,
        sort: DEFAULT_SORT,
        onSort: vi.fn()
      })
    );
    const tables = findAll(nodes, n => n.type === 'table');
    // Cells run before CUDA was initialised have a table of their own.
    expect(tables.map(t => t.props['data-device'])).toEqual([0, 1, 'none']);
    expect(text(tables[2])).toContain('[10]');
    expect(text(tables[2])).toContain('import torch');
    expect(text(tables[0])).toContain(evil);
    expect(findAll(nodes, n => n.type === 'script')).toHaveLength(0);
    byClass(tables[0], 'jp-GpuMem-historyRow')[0].props.onClick();
    expect(model.scrollToCell).toHaveBeenCalledWith(9);
  });

  it('names the protocol revision a too-old kernel lacks, from the schema', () => {
    const hello = helloResult();
    hello.actions = hello.actions.filter(a => a !== 'history');
    const events: GpuMemEvent[] = [
      { type: 'follow', kernelId: 'k1', source: 'a.ipynb' },
      { type: 'reply', action: 'hello', reply: okReply('hello', hello) }
    ];
    const nodes = render(
      React.createElement(HistoryView, {
        model: { settings: { units: 'binary' } } as any,
        state: events.reduce(reduce, initialState()),
        trans,
        sort: DEFAULT_SORT,
        onSort: vi.fn()
      })
    );
    expect(text(byClass(nodes, 'jp-GpuMem-messageDetail'))).toBe(
      `History needs jupyter_gpumem with protocol revision ${PROTOCOL_REVISION} in the kernel (it has 0.1.0). Upgrade it where the kernel runs and restart the kernel.`
    );
    // The kernel's schema says the same revision (its `protocol_revision`).
    expect(PROTOCOL_REVISION).toBe(
      JSON.parse(
        readFileSync('../jupyter_gpumem/protocol/schema.json', 'utf-8')
      ).protocol_revision
    );
    expect(findAll(nodes, n => n.type === 'table')).toHaveLength(0);
  });

  it('says how to get cells when none was measured', () => {
    const events: GpuMemEvent[] = [
      { type: 'follow', kernelId: 'k1', source: 'a.ipynb' },
      {
        type: 'reply',
        action: 'hello',
        reply: okReply('hello', helloResult())
      },
      { type: 'reading_sent', view: 'history' },
      {
        type: 'reply',
        action: 'history',
        reply: okReply('history', { cells: [] } as any)
      }
    ];
    const nodes = render(
      React.createElement(HistoryView, {
        model: { settings: { units: 'binary' } } as any,
        state: events.reduce(reduce, initialState()),
        trans,
        sort: DEFAULT_SORT,
        onSort: vi.fn()
      })
    );
    expect(text(nodes)).toContain('No measured cells yet');
  });
});

function marker(n: number | null, time: number): ICellMarker {
  return {
    execution_count: n,
    time,
    wall_time: 0.1,
    failed: false,
    first_line: '',
    devices: [
      { index: 0, allocated_delta: 0, reserved_delta: 0, peak_allocated: 0 }
    ]
  };
}

describe('the trend chart', () => {
  it('labels markers [N] unless they crowd the newer one', () => {
    const places = placeMarkers(
      [marker(1, 10), marker(2, 11), marker(3, 50), marker(null, 80)],
      0,
      0,
      100
    );
    expect(places.map(p => [p.cell.execution_count, p.labelled])).toEqual([
      [1, false],
      [2, true],
      [3, true],
      [null, false]
    ]);
    expect(places[2].x).toBeCloseTo(0.5);
  });

  it('draws allocated, reserved and this process, and a marker goes to its cell', () => {
    const onGoTo = vi.fn();
    const points = [
      { time: 0, allocated: 1 * GiB, reserved: 2 * GiB, process: 2.5 * GiB },
      { time: 60, allocated: 2 * GiB, reserved: 2 * GiB, process: 2.5 * GiB }
    ];
    const nodes = render(
      React.createElement(TrendChart, {
        device: device(),
        points,
        cells: [marker(7, 30)],
        now: 60,
        minutes: 5,
        trans,
        onGoTo
      })
    );
    const lines = findAll(nodes, n => n.type === 'polyline');
    expect(lines.map(l => l.props['data-line']).sort()).toEqual([
      'allocated',
      'process',
      'reserved'
    ]);
    const legend = byClass(nodes, 'jp-GpuMem-trendLegend')[0];
    expect(text(legend)).toBe(
      'Allocated 2.00 GiB Reserved 2.00 GiB This process (NVML) 2.50 GiB'
    );
    // Scaled to the data: the highest line (2.5 GiB) near the top.
    expect(text(byClass(nodes, 'jp-GpuMem-trendAxis'))).toContain(
      'max 2.50 GiB'
    );
    const [label] = byClass(nodes, 'jp-GpuMem-markerLabel');
    expect(text(label)).toBe('[7]');
    expect(label.props.style.left).toBe('50.000%');
    label.props.onClick();
    expect(onGoTo).toHaveBeenCalledWith(7);
  });

  it('keeps each marker in place as the window slides: one transform moves them', () => {
    const at = (now: number) =>
      render(
        React.createElement(TrendChart, {
          device: device(),
          points: [
            { time: 0, allocated: 1, reserved: 2, process: 3 },
            { time: now, allocated: 1, reserved: 2, process: 3 }
          ],
          cells: [marker(7, 100)],
          now,
          minutes: 1,
          trans
        })
      );
    const a = at(110);
    const b = at(115);
    const left = (nodes: any) =>
      byClass(nodes, 'jp-GpuMem-markerLabel')[0].props.style.left;
    const shift = (nodes: any) =>
      byClass(nodes, 'jp-GpuMem-markerLabels')[0].props.style.transform;
    expect(left(a)).toBe(left(b));
    expect(shift(a)).not.toBe(shift(b));
    // The tooltip is worded once per cell and reused.
    const title = (nodes: any) =>
      byClass(nodes, 'jp-GpuMem-markerLabel')[0].props.title;
    expect(title(a)).toBe(title(b));
    expect(title(a)).toContain('Cell [7]');
  });

  it('draws a few points per pixel column at most, keeping each peak', () => {
    // 6000 points over 300 px, one spike of 9 in the middle.
    const points = Array.from({ length: 6000 }, (_, i) => ({
      time: i,
      allocated: i === 3001 ? 9 : 1,
      reserved: 1,
      process: null
    }));
    const x = (t: number) => (t / 6000) * 300;
    const y = (b: number) => 10 - b;
    const line = stepLine(points, 'allocated', x, y, 300);
    const pairs = line.split(' ');
    expect(pairs.length).toBeLessThan(10);
    // The spike's column rises to 9 (y 1.0) and falls back to 1 (y 9.0).
    const spike = pairs.indexOf('150,1.0');
    expect(spike).toBeGreaterThan(0);
    expect(pairs.slice(spike - 1, spike + 2)).toEqual([
      '150,9.0',
      '150,1.0',
      '150,9.0'
    ]);
    expect(pairs.filter(p => p.endsWith(',1.0'))).toEqual(['150,1.0']);
    expect(pairs[pairs.length - 1]).toBe('300,9.0');
  });

  it('leaves the process line out when NVML does not know it', () => {
    const nodes = render(
      React.createElement(TrendChart, {
        device: device({ process_used: null }),
        points: [{ time: 0, allocated: 1, reserved: 2, process: null }],
        cells: [],
        now: 60,
        minutes: 5,
        trans
      })
    );
    expect(
      findAll(nodes, n => n.type === 'polyline').map(l => l.props['data-line'])
    ).toEqual(['reserved', 'allocated']);
  });
});

describe('finding the cell of an execution count', () => {
  const c = (type: string, executionCount: number | null) => ({
    model: { type, executionCount }
  });
  it('takes the last code cell that ran with it', () => {
    const cells = [
      c('code', 3),
      c('markdown', null),
      c('code', 7),
      c('code', 3)
    ];
    expect(findCell(cells, 3)).toBe(3);
    expect(findCell(cells, 7)).toBe(2);
    expect(findCell(cells, 9)).toBe(-1);
  });
});
