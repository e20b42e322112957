/**
 * The forecast before the OOM in the Overview: its words (present/forecast.ts),
 * the view (views/overview/forecastLine.tsx) and what the state keeps of the last
 * cell's marker.
 */
import * as React from 'react';
import { describe, expect, it } from 'vitest';

import { plainTrans } from '../src/present/trans';
import {
  forecastDetail,
  forecastText,
  formatDuration
} from '../src/present/forecast';
import { ICellMarker, IForecast } from '../src/protocol';
import { GpuMemEvent, initialState, reduce } from '../src/state';
import { ForecastLines } from '../src/views/overview/forecastLine';
import { GiB, MiB } from './fixtures';
import { byClass, findAll, render, text } from './render';

const trans = plainTrans as any;

function forecast(overrides: Partial<IForecast> = {}): IForecast {
  return {
    device: 0,
    worker: null,
    bytes_per_cell: 64 * MiB,
    cells_left: 112,
    seconds_left: 3.5 * 3600,
    limit: 8 * GiB,
    limit_kind: 'cap',
    allocated: 1 * GiB,
    cells: 5,
    first_cell: 12,
    who: null,
    ...overrides
  };
}

function view(forecasts: IForecast[], cell: number | null = 16) {
  return render(React.createElement(ForecastLines, { forecasts, cell, trans }));
}

describe('forecast words', () => {
  it('says durations as people do', () => {
    expect(formatDuration(0.2)).toBe('1 s');
    expect(formatDuration(45)).toBe('45 s');
    expect(formatDuration(12 * 60)).toBe('12 min');
    expect(formatDuration(3.5 * 3600)).toBe('3.5 h');
    expect(formatDuration(60 * 3600)).toBe('2.5 days');
  });

  it('says the cells left, the time and the limit', () => {
    expect(forecastText(forecast(), trans)).toBe(
      'at this rate, out of memory in about 112 cells (about 3.5 h)'
    );
    expect(forecastText(forecast({ cells_left: 1 }), trans)).toBe(
      'at this rate, out of memory in about 1 cell (about 3.5 h)'
    );
    expect(forecastText(forecast({ cells_left: 0 }), trans)).toBe(
      'at this rate, out of memory in the next cell'
    );
    expect(forecastText(forecast({ seconds_left: null }), trans)).toBe(
      'at this rate, out of memory in about 112 cells'
    );
    expect(forecastDetail(forecast(), trans)).toBe(
      '+64.00 MiB a cell over the last 5 cells (1.00 GiB allocated), against the cap of 8.00 GiB'
    );
    expect(
      forecastDetail(
        forecast({
          limit_kind: 'device',
          who: 'In[14] line 2 `keep.append(x)`'
        }),
        trans
      )
    ).toBe(
      "+64.00 MiB a cell over the last 5 cells (1.00 GiB allocated), against 8.00 GiB, reserved + the device's free memory; grows at In[14] line 2 `keep.append(x)`"
    );
  });
});

describe('ForecastLines', () => {
  it('draws nothing without a forecast', () => {
    expect(view([])).toEqual([]);
  });

  it('draws one line per forecast, a worker named by its label', () => {
    const nodes = view([
      forecast(),
      forecast({ device: 1, worker: 'rank 1 (pid 4242)', cells_left: 3 })
    ]);
    const [section] = byClass(nodes, 'jp-GpuMem-forecast');
    expect(section.props.role).toBe('note');
    expect(section.props['data-cell']).toBe(16);
    const items = findAll(nodes, n => n.type === 'li');
    expect(items.map(i => i.props['data-cells-left'])).toEqual([112, 3]);
    expect(text(byClass(items[0], 'jp-GpuMem-forecastText'))).toBe(
      'cuda:0 after [16]: at this rate, out of memory in about 112 cells (about 3.5 h)'
    );
    expect(text(byClass(items[1], 'jp-GpuMem-forecastText'))).toBe(
      'rank 1 (pid 4242) cuda:1 after [16]: at this rate, out of memory in about 3 cells (about 3.5 h)'
    );
    expect(items[1].props['data-worker']).toBe('rank 1 (pid 4242)');
    expect(text(byClass(items[0], 'jp-GpuMem-forecastDetail'))).toContain(
      'against the cap of 8.00 GiB'
    );
  });
});

describe("the state keeps the last cell's forecast", () => {
  const follow: GpuMemEvent = {
    type: 'follow',
    kernelId: 'k',
    source: 'n.ipynb'
  };
  let seq = 0;
  const marker = (cell: Partial<ICellMarker>): GpuMemEvent => {
    seq += 1;
    return {
      type: 'comm',
      commId: 'c',
      data: {
        protocol: 1,
        type: 'cell',
        seq,
        cell: {
          execution_count: seq,
          time: 1000 + seq,
          wall_time: 0.1,
          failed: false,
          first_line: 'keep.append(x)',
          devices: [
            {
              index: 0,
              allocated_delta: 64 * MiB,
              reserved_delta: 64 * MiB,
              peak_allocated: 2 * GiB
            }
          ],
          ...cell
        }
      }
    } as GpuMemEvent;
  };

  it('replaces it with each cell that touched a device, keeps it otherwise', () => {
    let state = reduce(initialState(), follow);
    expect(state.process.forecast).toBeNull();
    state = reduce(state, marker({ forecasts: [forecast()] }));
    expect(state.process.forecast?.cell).toBe(seq);
    expect(state.process.forecast?.forecasts).toEqual([forecast()]);
    const made = state.process.forecast;
    // a cell that touched no device (a print) changes nothing
    state = reduce(state, marker({ devices: [] }));
    expect(state.process.forecast).toBe(made);
    // a cell that touched a device without a forecast (it freed memory) clears it
    state = reduce(state, marker({}));
    expect(state.process.forecast?.forecasts).toEqual([]);
    // a kernel restart forgets it
    state = reduce(reduce(state, marker({ forecasts: [forecast()] })), {
      type: 'kernel_status',
      status: 'restarting'
    });
    expect(state.process.forecast).toBeNull();
  });
});
