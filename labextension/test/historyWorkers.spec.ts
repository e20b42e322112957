/**
 * The History tab keeps each worker process's figures of a cell (the
 * kernel's history rows with `worker`), under the cell's row: a
 * notebook_launcher cell's ranks have exited by the time the cell ends, so
 * the Overview no longer lists them.
 */
import * as React from 'react';
import { describe, expect, it, vi } from 'vitest';

import { plainTrans } from '../src/present/trans';
import { IHistoryCell, IHistoryCellDevice } from '../src/protocol';
import { GpuMemEvent, initialState, reduce } from '../src/state';
import {
  DEFAULT_SORT,
  historyRows,
  HistoryTable,
  HistoryView,
  IHistorySort
} from '../src/views/history/historyTable';
import {
  workerDevices,
  workerFigures,
  workerName
} from '../src/views/history/historyWorkers';
import { GiB, helloResult, MiB, okReply } from './fixtures';
import { byClass, Child, findAll, INode, render, text } from './render';

const trans = plainTrans as any;

function workerRow(
  worker: string,
  index: number,
  before: number,
  after: number,
  peak: number,
  reserved: number
): IHistoryCellDevice {
  // As core/history.py's _worker_rows writes them.
  return {
    index,
    allocated: after,
    allocated_delta: after - before,
    reserved,
    reserved_delta: null,
    peak_allocated: peak,
    peak_above_start: peak - before,
    kept_at: null,
    worker
  };
}

function kernelRow(index: number, kept: number): IHistoryCellDevice {
  return {
    index,
    allocated: 1 * GiB,
    allocated_delta: kept,
    reserved: 2 * GiB,
    reserved_delta: 0,
    peak_allocated: 1 * GiB,
    peak_above_start: kept,
    kept_at: null
  };
}

function cell(
  n: number,
  first_line: string,
  devices: IHistoryCellDevice[]
): IHistoryCell {
  return {
    execution_count: n,
    time: 1000 + n,
    first_line,
    wall_time: 1.5,
    failed: false,
    devices
  };
}

// The check: 2 ranks, rank r keeps (r+1) GiB and peaks at (r+3) GiB;
// the kernel itself touches no device (it must not initialise CUDA).
const LAUNCH = cell(12, 'notebook_launcher(train, num_processes=2)', [
  workerRow('rank 0 (pid 5001)', 0, 0, 1 * GiB, 3 * GiB, 3 * GiB),
  workerRow('rank 1 (pid 5002)', 1, 0, 2 * GiB, 4 * GiB, 4 * GiB)
]);
// The kernel on two devices, with a worker started in an earlier cell.
const MIXED = cell(13, 'step()', [
  kernelRow(1, 64 * MiB),
  kernelRow(0, 32 * MiB),
  workerRow('worker (pid 5003)', 0, 512 * MiB, 768 * MiB, 1 * GiB, 2 * GiB)
]);
const PLAIN = cell(14, 'x = torch.ones(1)', [kernelRow(0, 128 * MiB)]);
const CELLS = [LAUNCH, MIXED, PLAIN];

/** [class, data-cell, data-worker] of each body row, top to bottom. */
function bodyRows(table: Child[] | INode): [string, unknown, unknown][] {
  return findAll(table, n => n.type === 'tbody')
    .flatMap(b => findAll(b.children, n => n.type === 'tr'))
    .map(r => [
      r.props.className,
      r.props['data-cell'],
      r.props['data-worker']
    ]);
}

const figure = (row: INode, name: string) =>
  text(findAll(row, n => n.props['data-figure'] === name));

describe("a cell's worker processes in the History tab", () => {
  it('reads before, after, peak and reserved from the row', () => {
    const [rank0, rank1] = workerDevices(LAUNCH).map(workerFigures);
    expect(rank1).toEqual({
      worker: 'rank 1 (pid 5002)',
      index: 1,
      before: 0,
      after: 2 * GiB,
      kept: 2 * GiB,
      peak: 4 * GiB,
      peakAboveStart: 4 * GiB,
      reserved: 4 * GiB,
      ooms: 0,
      oom: null
    });
    expect(rank0.after).toBe(1 * GiB);
    const [late] = workerDevices(MIXED).map(workerFigures);
    expect(late.before).toBe(512 * MiB);
    expect(late.kept).toBe(256 * MiB);
    expect(late.peakAboveStart).toBe(512 * MiB);
    expect(workerDevices(PLAIN)).toEqual([]);
  });

  it("puts a cell's workers under it once: its first kernel device, else the cells without one", () => {
    const workers = (device: number | null) =>
      historyRows(CELLS, device).map(r => [
        r.executionCount,
        r.workers.map(w => w.worker)
      ]);
    expect(workers(0)).toEqual([
      [13, ['worker (pid 5003)']],
      [14, []]
    ]);
    expect(workers(1)).toEqual([[13, []]]);
    expect(workers(null)).toEqual([
      [12, ['rank 0 (pid 5001)', 'rank 1 (pid 5002)']]
    ]);
  });

  it('shows each rank with its exact figures under the cell, through the tab', () => {
    const model = {
      settings: { units: 'binary' },
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
        reply: okReply('history', { cells: CELLS } as any),
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
    expect(tables.map(t => t.props['data-device'])).toEqual([0, 1, 'none']);
    const none = tables[2];
    expect(none.props['aria-label']).toBe(
      "Measured cells that changed none of the kernel's GPU memory"
    );
    expect(text(byClass(nodes, 'jp-GpuMem-deviceTitle')[2])).toBe(
      "No change in the kernel's GPU memory; its workers below"
    );
    expect(bodyRows(none)).toEqual([
      ['jp-GpuMem-historyRow', 12, undefined],
      ['jp-GpuMem-historyWorker', 12, 'rank 0 (pid 5001)'],
      ['jp-GpuMem-historyWorker', 12, 'rank 1 (pid 5002)']
    ]);
    const [rank0, rank1] = byClass(none, 'jp-GpuMem-historyWorker');
    expect(text(byClass(rank0, 'jp-GpuMem-historyWorkerName'))).toBe(
      'Worker rank 0 (pid 5001) · cuda:0'
    );
    expect(figure(rank0, 'allocated')).toBe('allocated 0 B → 1.00 GiB');
    expect(figure(rank0, 'peak-allocated')).toBe('peak 3.00 GiB');
    expect(figure(rank0, 'reserved')).toBe('reserved 3.00 GiB');
    expect(figure(rank0, 'kept')).toBe('+1.00 GiB');
    expect(figure(rank0, 'peak')).toBe('3.00 GiB');
    expect(text(byClass(rank1, 'jp-GpuMem-historyWorkerName'))).toBe(
      'Worker rank 1 (pid 5002) · cuda:1'
    );
    expect(figure(rank1, 'allocated')).toBe('allocated 0 B → 2.00 GiB');
    expect(figure(rank1, 'peak-allocated')).toBe('peak 4.00 GiB');
    expect(figure(rank1, 'reserved')).toBe('reserved 4.00 GiB');
    expect(figure(rank1, 'kept')).toBe('+2.00 GiB');
    expect(figure(rank1, 'peak')).toBe('4.00 GiB');
    // The kernel's own row of the cell has no figures of its own.
    const [own] = byClass(none, 'jp-GpuMem-historyRow');
    expect(figure(own, 'kept')).toBe('–');

    // A worker of an earlier cell: its figures above what it held at the start.
    expect(bodyRows(tables[0])).toEqual([
      ['jp-GpuMem-historyRow', 14, undefined],
      ['jp-GpuMem-historyRow', 13, undefined],
      ['jp-GpuMem-historyWorker', 13, 'worker (pid 5003)']
    ]);
    const [late] = byClass(tables[0], 'jp-GpuMem-historyWorker');
    expect(text(late)).toContain('Worker worker (pid 5003) · cuda:0');
    expect(figure(late, 'allocated')).toBe('allocated 512 MiB → 768 MiB');
    expect(figure(late, 'kept')).toBe('+256 MiB');
    expect(figure(late, 'peak')).toBe('512 MiB');
    expect(figure(late, 'peak-allocated')).toBe('peak 1.00 GiB');
    // GPU 1's table shows cell 13 without its workers (they are under GPU 0).
    expect(bodyRows(tables[1])).toEqual([
      ['jp-GpuMem-historyRow', 13, undefined]
    ]);
    // Tables without workers keep their plain title.
    expect(text(byClass(nodes, 'jp-GpuMem-deviceTitle')[0])).toBe('GPU 0');
  });

  it('sorts by the cell: worker rows follow their cell in either direction', () => {
    const rows = historyRows(CELLS, 0);
    const order = (sort: IHistorySort) =>
      bodyRows(
        render(
          React.createElement(HistoryTable, {
            rows,
            device: 0,
            sort,
            onSort: vi.fn(),
            onGoTo: vi.fn(),
            trans
          })
        )
      ).map(([cls, n]) => (cls === 'jp-GpuMem-historyWorker' ? `${n}w` : n));
    // Cell 13 kept 32 MiB on GPU 0, cell 14 kept 128 MiB; the worker's
    // 256 MiB does not move its cell.
    expect(order({ column: 'kept', descending: true })).toEqual([
      14,
      13,
      '13w'
    ]);
    expect(order({ column: 'kept', descending: false })).toEqual([
      13,
      '13w',
      14
    ]);
  });

  it('names workers in the user words, unknown labels as they came', () => {
    expect(workerName('rank 3 (pid 77)', trans)).toBe('rank 3 (pid 77)');
    const french = {
      __: (s: string, ...a: unknown[]) =>
        s
          .replace('rank', 'rang')
          .replace(/%(\d)/g, (_, i) => String(a[Number(i) - 1]))
    };
    expect(workerName('rank 3 (pid 77)', french as any)).toBe(
      'rang 3 (pid 77)'
    );
    expect(workerName('worker (pid 9)', trans)).toBe('worker (pid 9)');
    expect(workerName('engine 2 on node7', trans)).toBe('engine 2 on node7');
  });

  it("shows the out-of-memory errors of a kernel's device and of a worker", () => {
    const failed = cell(15, 'train(batch=64)', [
      { ...kernelRow(0, 0), ooms: 1 },
      { ...workerRow('rank 1 (pid 5004)', 1, 0, 0, 6 * GiB, 6 * GiB), ooms: 2 }
    ]);
    const [rank1] = workerDevices(failed).map(workerFigures);
    expect(rank1.ooms).toBe(2);
    const [row] = historyRows([failed], 0);
    expect(row.ooms).toBe(1);
    // a kernel that says nothing of OOMs (before revision 8): none shown
    const older = cell(16, 'x', [{ ...kernelRow(0, 0) }]);
    expect(historyRows([older], 0)[0].ooms).toBe(0);
    const nodes = render(
      React.createElement(HistoryTable, {
        rows: historyRows([failed, older], 0),
        device: 0,
        trans,
        sort: DEFAULT_SORT,
        onSort: vi.fn(),
        onGoTo: vi.fn()
      } as any)
    );
    const oomFigures = findAll(nodes, n => n.props['data-figure'] === 'ooms');
    expect(oomFigures.map(n => text(n))).toEqual([
      '1 out-of-memory error',
      '· 2 out-of-memory errors'
    ]);
  });

  it("shows a worker's out-of-memory post-mortem in one line", () => {
    const line =
      'asked 3.00 GiB, largest free block 512.00 MiB, free 78.00 GiB, cap 4.00 GiB; best fix: cap (maybe)';
    const failed = cell(17, 'train()', [
      { ...kernelRow(0, 0) },
      {
        ...workerRow('rank 1 (pid 5004)', 0, 0, 0, 2 * GiB, 2 * GiB),
        ooms: 1,
        oom: line
      }
    ]);
    const [rank1] = workerDevices(failed).map(workerFigures);
    expect(rank1.oom).toBe(line);
    const nodes = render(
      React.createElement(HistoryTable, {
        rows: historyRows([failed], 0),
        device: 0,
        trans,
        sort: DEFAULT_SORT,
        onSort: vi.fn(),
        onGoTo: vi.fn()
      } as any)
    );
    const oom = findAll(nodes, n => n.props['data-figure'] === 'oom');
    expect(oom.map(n => text(n))).toEqual([`out of memory: ${line}`]);
  });
});
