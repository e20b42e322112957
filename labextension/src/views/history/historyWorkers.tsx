/**
 * The History tab's worker rows: under a cell's row, each worker process's
 * own allocator figures in that cell (a `notebook_launcher` rank, a forked
 * worker), as the kernel's history keeps them: allocated before and after,
 * the exact peak, reserved. A worker that exited inside the cell is gone from
 * the Overview after the cell; here its figures stay.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { formatBytes, formatDelta } from '../../present/format';
import { IHistoryCell, IHistoryCellDevice } from '../../protocol';

/** A worker's device row of a history cell (one with `worker`). */
export type IHistoryWorkerDevice = IHistoryCellDevice & { worker: string };

/** The cell's device rows of its worker processes, in the kernel's order. */
export function workerDevices(cell: IHistoryCell): IHistoryWorkerDevice[] {
  return cell.devices.filter((d): d is IHistoryWorkerDevice => !!d.worker);
}

/** One worker device's figures, in bytes (null: the kernel did not say). */
export interface IWorkerFigures {
  /** The kernel's label of the worker: `rank 1 (pid 4242)`. */
  worker: string;
  /** The worker's own torch index (after its CUDA_VISIBLE_DEVICES). */
  index: number;
  before: number | null;
  after: number | null;
  kept: number | null;
  peak: number | null;
  peakAboveStart: number | null;
  reserved: number | null;
  /** The worker's out-of-memory errors at its last report (0: none or not said). */
  ooms: number;
  /** The worker's out-of-memory post-mortem on this device, in one line (none: null). */
  oom: string | null;
}

export function workerFigures(d: IHistoryWorkerDevice): IWorkerFigures {
  return {
    worker: d.worker,
    index: d.index,
    before:
      d.allocated === null || d.allocated_delta === null
        ? null
        : d.allocated - d.allocated_delta,
    after: d.allocated,
    kept: d.allocated_delta,
    peak: d.peak_allocated,
    peakAboveStart: d.peak_above_start,
    reserved: d.reserved,
    ooms: d.ooms ?? 0,
    oom: d.oom ?? null
  };
}

/**
 * The kernel's label (`rank 1 (pid 4242)`, `worker (pid 4242)`) in the
 * user's words; an unknown form as it came.
 */
export function workerName(label: string, trans: TranslationBundle): string {
  const ranked = /^rank (-?\d+) \(pid (\d+)\)$/.exec(label);
  if (ranked) {
    return trans.__('rank %1 (pid %2)', ranked[1], ranked[2]);
  }
  const bare = /^worker \(pid (\d+)\)$/.exec(label);
  if (bare) {
    return trans.__('worker (pid %1)', bare[1]);
  }
  return label;
}

function bytes(value: number | null): string {
  return value === null ? '–' : formatBytes(value);
}

/**
 * The rows of a cell's workers, each under the cell's row and in the table's
 * four columns: the figures of the cell's own columns (kept, peak above
 * start) line up; before, after, peak and reserved are spelled out.
 */
export function HistoryWorkerRows(props: {
  devices: readonly IHistoryWorkerDevice[];
  executionCount: number | null;
  trans: TranslationBundle;
}): JSX.Element {
  const { trans } = props;
  return (
    <>
      {props.devices.map(workerFigures).map(f => (
        <tr
          key={`${f.worker}:${f.index}`}
          className="jp-GpuMem-historyWorker"
          data-cell={props.executionCount ?? ''}
          data-worker={f.worker}
          data-index={f.index}
        >
          <td className="jp-GpuMem-num" aria-hidden="true">
            ↳
          </td>
          <td className="jp-GpuMem-historyCode">
            <span className="jp-GpuMem-historyWorkerName">
              {trans.__(
                'Worker %1 · cuda:%2',
                workerName(f.worker, trans),
                f.index
              )}
            </span>
            <span className="jp-GpuMem-historyMeta" data-figure="allocated">
              {trans.__('allocated %1 → %2', bytes(f.before), bytes(f.after))}
            </span>
            <span className="jp-GpuMem-historyMeta">
              <span
                data-figure="peak-allocated"
                title={trans.__(
                  "The worker's own peak counter: the cell's exact peak for a worker started in the cell, else the highest since it started"
                )}
              >
                {trans.__('peak %1', bytes(f.peak))}
              </span>
              {' · '}
              <span data-figure="reserved">
                {trans.__('reserved %1', bytes(f.reserved))}
              </span>
              {f.ooms > 0 && (
                <span data-figure="ooms">
                  {' · '}
                  {trans._n(
                    '%1 out-of-memory error',
                    '%1 out-of-memory errors',
                    f.ooms
                  )}
                </span>
              )}
            </span>
            {f.oom && (
              <span className="jp-GpuMem-historyMeta" data-figure="oom">
                {trans.__('out of memory: %1', f.oom)}
              </span>
            )}
          </td>
          <td className="jp-GpuMem-num" data-figure="kept">
            {f.kept === null ? '–' : formatDelta(f.kept)}
          </td>
          <td className="jp-GpuMem-num" data-figure="peak">
            {bytes(f.peakAboveStart)}
          </td>
        </tr>
      ))}
    </>
  );
}
