/**
 * The Overview's worker processes: each worker's own figures per device, its
 * status, nothing when the kernel reports no worker, the last cell's ended
 * workers marked so; the History tab keeps worker rows out of the kernel's
 * device tables.
 */
import * as React from 'react';
import { describe, expect, it } from 'vitest';

import { plainTrans } from '../src/lab/trans';
import { IHistoryCell, ISample, IWorker } from '../src/protocol';
import { applySample, initialState, reduce } from '../src/state';
import { historyDevices, historyRows } from '../src/views/historyTable';
import { WorkersSection } from '../src/views/workersSection';
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

describe('workers a measured cell ended', () => {
  // The kernel lists a notebook_launcher cell's ranks, exited, until the
  // cell ends; the next sample lists none.
  const at = (time: number, workers: IWorker[], base = sample()): ISample => ({
    ...base,
    time,
    workers
  });
  const rank0 = worker({ rank: 0, pid: 10 });
  const rank1 = worker();

  it('are kept from the samples already received, until others end', () => {
    let state = applySample(initialState(), at(1, [rank0, rank1]));
    expect(state.endedWorkers).toEqual([]);
    state = applySample(state, at(2, []));
    expect(state.endedWorkers.map(w => w.pid)).toEqual([10, 4242]);
    // Samples without workers keep them (the same array).
    const kept = state.endedWorkers;
    state = applySample(state, at(3, []));
    expect(state.endedWorkers).toBe(kept);
    // The next cell's worker ends: it replaces them.
    const next = worker({ pid: 77, rank: null });
    state = applySample(state, at(4, [next]));
    expect(state.endedWorkers.map(w => w.pid)).toEqual([10, 4242]);
    state = applySample(state, at(5, []));
    expect(state.endedWorkers.map(w => w.pid)).toEqual([77]);
  });

  it('are shown after the live ones, marked ended, with their last figures', () => {
    const model = { settings: { units: 'binary' } } as any;
    const state = applySample(
      applySample(
        initialState(),
        at(1, [rank0, worker({ status: 'running' })])
      ),
      at(2, [worker({ pid: 99, rank: 2, status: 'running', age: 0 })])
    );
    const nodes = render(
      React.createElement(WorkersSection, {
        model,
        state,
        trans,
        sample: state.sample!
      })
    );
    const [live, ended0, ended1] = rows(nodes);
    expect(rows(nodes)).toHaveLength(3);
    expect(live.props['data-ended']).toBeUndefined();
    expect(text(live)).toContain('rank 2 (pid 99)');
    expect(text(live)).toMatch(/running$/);
    expect(ended0.props['data-ended']).toBe('true');
    expect(text(ended0)).toBe(
      'rank 0 (pid 10) · cuda:1 allocated 2.00 GiB · peak 4.00 GiB · reserved 4.00 GiB exited (ended)'
    );
    // Last seen running: ended without a last word in the panel.
    expect(text(ended1)).toMatch(/rank 1 \(pid 4242\) .* \(ended\)$/);
    expect(text(ended1)).not.toContain('running');
  });

  it('are forgotten with the kernel process', () => {
    const state = applySample(
      applySample(initialState(), at(1, [rank0])),
      at(2, [])
    );
    expect(state.endedWorkers).toHaveLength(1);
    const restarted = reduce(state, {
      type: 'kernel_status',
      status: 'restarting'
    });
    expect(restarted.endedWorkers).toEqual([]);
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
