/**
 * The Overview's worker processes: each worker's own figures per device, its
 * status, nothing when the kernel reports no worker; the History tab keeps
 * worker rows out of the kernel's device tables.
 */
import * as React from 'react';
import { describe, expect, it } from 'vitest';

import { plainTrans } from '../src/present/trans';
import { IHistoryCell, IWorker } from '../src/protocol';
import { historyDevices, historyRows } from '../src/views/history/historyTable';
import { WorkersSection } from '../src/views/overview/workersSection';
import { GiB, MiB, sample } from './fixtures';
import { findAll, INode, render, text } from './render';

const trans = plainTrans as any;

function worker(overrides: Partial<IWorker> = {}): IWorker {
  return {
    pid: 4242,
    rank: 1,
    host: 'node-1',
    status: 'exited',
    started_in_cell: true,
    age: 0.2,
    devices: [
      {
        index: 1,
        name: 'NVIDIA H200',
        allocated: 2 * GiB,
        reserved: 4 * GiB,
        peak_allocated: 4 * GiB,
        peak_reserved: 4 * GiB,
        ooms: 0
      }
    ],
    ...overrides
  };
}

function view(workers: IWorker[] | undefined) {
  const model = { settings: { units: 'binary' } } as any;
  return render(
    React.createElement(WorkersSection, {
      model,
      state: {} as any,
      trans,
      sample: sample(workers ? { workers } : {})
    })
  );
}

function rows(nodes: ReturnType<typeof view>): INode[] {
  return findAll(nodes, n => n.type === 'li' && 'data-pid' in n.props);
}

describe('WorkersSection', () => {
  it('draws nothing without workers', () => {
    expect(view(undefined)).toEqual([]);
    expect(view([])).toEqual([]);
  });

  it("shows each worker's own figures per device", () => {
    const nodes = view([
      worker({
        rank: 0,
        pid: 10,
        devices: [
          {
            ...worker().devices[0],
            index: 0,
            allocated: 1 * GiB,
            peak_allocated: 3 * GiB
          }
        ]
      }),
      worker()
    ]);
    const [r0, r1] = rows(nodes);
    expect(text(r0)).toBe(
      'rank 0 (pid 10) · cuda:0 allocated 1.00 GiB · peak 3.00 GiB · reserved 4.00 GiB exited'
    );
    expect(text(r1)).toBe(
      'rank 1 (pid 4242) · cuda:1 allocated 2.00 GiB · peak 4.00 GiB · reserved 4.00 GiB exited'
    );
    expect(text(nodes)).toContain('Worker processes');
  });

  it('says which stopped reporting, which ran out of memory, and old peaks', () => {
    const nodes = view([
      worker({ status: 'silent', rank: null, started_in_cell: false }),
      worker({
        pid: 7,
        status: 'running',
        age: 12.4,
        devices: [{ ...worker().devices[0], ooms: 2, allocated: 5 * MiB }]
      })
    ]);
    const [silent, running] = rows(nodes);
    expect(silent.props['data-status']).toBe('silent');
    expect(text(silent)).toContain('worker (pid 4242)');
    expect(text(silent)).toContain('stopped reporting (killed or hung)');
    expect(text(silent)).toContain('peak 4.00 GiB (since it started)');
    expect(text(running)).toContain('5.00 MiB');
    expect(text(running)).toContain('running; last report 12 s ago · 2 OOMs');
  });
});

describe('History with workers', () => {
  const cell: IHistoryCell = {
    execution_count: 3,
    time: 1,
    first_line: 'launch()',
    wall_time: 2,
    failed: false,
    devices: [
      {
        index: 1,
        allocated: 2 * GiB,
        allocated_delta: 2 * GiB,
        reserved: 4 * GiB,
        reserved_delta: null,
        peak_allocated: 4 * GiB,
        peak_above_start: 4 * GiB,
        kept_at: null,
        worker: 'rank 1 (pid 4242)'
      }
    ]
  };

  it("keeps worker rows out of the kernel's device tables", () => {
    expect(historyDevices([cell])).toEqual([]);
    expect(historyRows([cell], 1)).toEqual([]);
    // the cell touched none of the kernel's own devices
    expect(historyRows([cell], null).map(r => r.executionCount)).toEqual([3]);
  });
});
