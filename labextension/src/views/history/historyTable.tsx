/**
 * The History tab: the table of measured cells (execution count, first line,
 * kept, peak above start, time), sortable by any column; a row scrolls the
 * notebook to its cell. A cell's worker processes get a row each under it
 * (historyWorkers.tsx).
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { formatBytes, formatDelta } from '../../present/format';
import { deviceLabel } from '../../present/messages';
import { IHistoryCell, IHistoryResult } from '../../protocol';
import {
  HistoryWorkerRows,
  IHistoryWorkerDevice,
  workerDevices
} from './historyWorkers';
import { IViewProps } from '../props';
import { ReadingFrame, useReading } from '../common/readingFrame';

/** One row: a cell and its figures on one device. */
export interface IHistoryRow {
  cell: IHistoryCell;
  executionCount: number | null;
  firstLine: string;
  kept: number | null;
  peakAboveStart: number | null;
  reservedDelta: number | null;
  wallTime: number;
  failed: boolean;
  keptAt: string | null;
  /** Out-of-memory errors on the device in the cell (0: none or not said). */
  ooms: number;
  /**
   * The cell's worker processes' device rows, shown under this row: in the
   * table of the cell's first kernel device, or in the table of cells that
   * changed none of the kernel's devices; empty in the cell's other tables.
   */
  workers: IHistoryWorkerDevice[];
}

export type HistoryColumn =
  'cell' | 'code' | 'kept' | 'peak' | 'reserved' | 'time';

export interface IHistorySort {
  column: HistoryColumn;
  descending: boolean;
}

/** Newest cell first until the user sorts. */
export const DEFAULT_SORT: IHistorySort = { column: 'cell', descending: true };

/**
 * The kernel's own device rows of a cell (rows with `worker` are its worker
 * processes' devices: shown under the cell's row, see `historyRows`).
 */
export function kernelDevices(cell: IHistoryCell): IHistoryCell['devices'] {
  return cell.devices.filter(d => !d.worker);
}

/** The devices the cells measured, in order. */
export function historyDevices(cells: readonly IHistoryCell[]): number[] {
  const seen = new Set<number>();
  for (const cell of cells) {
    for (const device of kernelDevices(cell)) {
      seen.add(device.index);
    }
  }
  return [...seen].sort((a, b) => a - b);
}

/**
 * The rows of one device, oldest first (the kernel's order); with `null`, the
 * cells without any device figures (the kernel lists a device only when the
 * cell changed its memory).
 */
export function historyRows(
  cells: readonly IHistoryCell[],
  device: number | null
): IHistoryRow[] {
  const rows: IHistoryRow[] = [];
  for (const cell of cells) {
    const own = kernelDevices(cell);
    if (device === null) {
      if (own.length === 0) {
        rows.push({
          cell,
          executionCount: cell.execution_count,
          firstLine: cell.first_line,
          kept: null,
          peakAboveStart: null,
          reservedDelta: null,
          wallTime: cell.wall_time,
          failed: cell.failed,
          keptAt: null,
          ooms: 0,
          workers: workerDevices(cell)
        });
      }
      continue;
    }
    const d = own.find(x => x.index === device);
    if (!d) {
      continue;
    }
    const first = Math.min(...own.map(x => x.index));
    rows.push({
      cell,
      executionCount: cell.execution_count,
      firstLine: cell.first_line,
      kept: d.allocated_delta,
      peakAboveStart: d.peak_above_start,
      reservedDelta: d.reserved_delta,
      wallTime: cell.wall_time,
      failed: cell.failed,
      keptAt: d.kept_at,
      ooms: d.ooms ?? 0,
      workers: device === first ? workerDevices(cell) : []
    });
  }
  return rows;
}

function sortValue(
  row: IHistoryRow,
  column: HistoryColumn
): number | string | null {
  switch (column) {
    case 'cell':
      // Unnumbered cells (run with store_history off) by their time.
      return row.executionCount ?? null;
    case 'code':
      return row.firstLine;
    case 'kept':
      return row.kept;
    case 'peak':
      return row.peakAboveStart;
    case 'reserved':
      return row.reservedDelta;
    case 'time':
      return row.wallTime;
  }
}

/**
 * Sort rows by a column; unknown figures last whatever the direction, ties in
 * the order the cells ran.
 */
export function sortHistory(
  rows: readonly IHistoryRow[],
  sort: IHistorySort
): IHistoryRow[] {
  const order = rows.map((row, i) => ({ row, i }));
  order.sort((a, b) => {
    const va = sortValue(a.row, sort.column);
    const vb = sortValue(b.row, sort.column);
    if (va === null || vb === null) {
      if (va === vb) {
        return a.i - b.i;
      }
      return va === null ? 1 : -1;
    }
    let c =
      typeof va === 'string' || typeof vb === 'string'
        ? String(va).localeCompare(String(vb))
        : va - vb;
    if (c === 0) {
      c = a.row.cell.time - b.row.cell.time || a.i - b.i;
      return c;
    }
    return sort.descending ? -c : c;
  });
  return order.map(o => o.row);
}

function columnLabel(column: HistoryColumn, trans: TranslationBundle): string {
  switch (column) {
    case 'cell':
      return trans.__('Cell');
    case 'code':
      return trans.__('First line');
    case 'kept':
      return trans.__('Kept');
    case 'peak':
      return trans.__('Peak above start');
    case 'reserved':
      return trans.__('Reserved');
    case 'time':
      return trans.__('Time');
  }
}

function columnHelp(column: HistoryColumn, trans: TranslationBundle): string {
  switch (column) {
    case 'cell':
      return trans.__('Execution count');
    case 'code':
      return trans.__("The cell's first line");
    case 'kept':
      return trans.__('Allocated after the cell minus before: what it kept');
    case 'peak':
      return trans.__(
        "The cell's exact peak allocated, above what was allocated when it started (the Overview's Peak allocated counts from zero)"
      );
    case 'reserved':
      return trans.__("Change of the caching allocator's reserved memory");
    case 'time':
      return trans.__('Wall time of the cell');
  }
}

/**
 * The columns of the narrow sidebar; reserved and time (sortable through
 * `sortHistory` too) are shown under the line.
 */
const COLUMNS: readonly HistoryColumn[] = ['cell', 'code', 'kept', 'peak'];

const NUMERIC: ReadonlySet<HistoryColumn> = new Set([
  'cell',
  'kept',
  'peak',
  'reserved',
  'time'
]);

function delta(value: number | null): string {
  return value === null ? '–' : formatDelta(value);
}

/**
 * The table of one device's cells; pure, for tests.
 */
export function HistoryTable(props: {
  rows: readonly IHistoryRow[];
  /** null: the cells that changed no device's memory. */
  device: number | null;
  sort: IHistorySort;
  onSort: (sort: IHistorySort) => void;
  onGoTo: (executionCount: number) => void;
  trans: TranslationBundle;
}): JSX.Element {
  const { rows, sort, onSort, onGoTo, trans } = props;
  const sorted = sortHistory(rows, sort);
  return (
    <table
      className="jp-GpuMem-historyTable"
      data-device={props.device ?? 'none'}
      aria-label={
        props.device === null
          ? rows.some(r => r.workers.length > 0)
            ? trans.__(
                "Measured cells that changed none of the kernel's GPU memory"
              )
            : trans.__('Measured cells that changed no GPU memory')
          : trans.__('Measured cells on %1', deviceLabel(props.device, trans))
      }
    >
      <thead>
        <tr>
          {COLUMNS.map(column => {
            const active = sort.column === column;
            return (
              <th
                key={column}
                scope="col"
                className={NUMERIC.has(column) ? 'jp-GpuMem-num' : ''}
                aria-sort={
                  active
                    ? sort.descending
                      ? 'descending'
                      : 'ascending'
                    : 'none'
                }
                data-column={column}
              >
                <button
                  type="button"
                  className="jp-GpuMem-sortButton"
                  title={columnHelp(column, trans)}
                  onClick={() =>
                    onSort({
                      column,
                      // A new column starts with the largest (or newest) first.
                      descending: active ? !sort.descending : column !== 'code'
                    })
                  }
                >
                  {columnLabel(column, trans)}
                  <span aria-hidden="true" className="jp-GpuMem-sortMark">
                    {active ? (sort.descending ? ' ▾' : ' ▴') : ''}
                  </span>
                </button>
              </th>
            );
          })}
        </tr>
      </thead>
      <tbody>
        {sorted.map((row, i) => {
          const n = row.executionCount;
          const go = () => {
            if (n !== null) {
              onGoTo(n);
            }
          };
          return (
            <React.Fragment key={`${row.cell.time}-${i}`}>
              <tr
                className={
                  row.failed
                    ? 'jp-GpuMem-historyRow jp-mod-failed'
                    : 'jp-GpuMem-historyRow'
                }
                data-cell={n ?? ''}
                tabIndex={n === null ? undefined : 0}
                title={
                  n === null
                    ? undefined
                    : trans.__('Go to cell [%1] in the notebook', n)
                }
                onClick={go}
                onKeyDown={event => {
                  if (event.key === 'Enter' || event.key === ' ') {
                    event.preventDefault();
                    go();
                  }
                }}
              >
                <td className="jp-GpuMem-num">
                  {n === null ? '[ ]' : `[${n}]`}
                </td>
                <td className="jp-GpuMem-historyCode">
                  <code>{row.firstLine}</code>
                  {row.failed && (
                    <span className="jp-GpuMem-historyFailed">
                      {trans.__('failed')}
                    </span>
                  )}
                  {row.ooms > 0 && (
                    <span
                      className="jp-GpuMem-historyFailed"
                      data-figure="ooms"
                    >
                      {trans._n(
                        '%1 out-of-memory error',
                        '%1 out-of-memory errors',
                        row.ooms
                      )}
                    </span>
                  )}
                  {row.keptAt && (
                    <span className="jp-GpuMem-historyKeptAt">
                      {trans.__('kept at %1', row.keptAt)}
                    </span>
                  )}
                  <span className="jp-GpuMem-historyMeta">
                    {trans.__('%1 s', row.wallTime.toFixed(2))}
                    {row.reservedDelta !== null && row.reservedDelta !== 0 && (
                      <span data-figure="reserved">
                        {' · '}
                        {trans.__('reserved %1', delta(row.reservedDelta))}
                      </span>
                    )}
                  </span>
                </td>
                <td className="jp-GpuMem-num" data-figure="kept">
                  {delta(row.kept)}
                </td>
                <td className="jp-GpuMem-num" data-figure="peak">
                  {row.peakAboveStart === null
                    ? '–'
                    : formatBytes(row.peakAboveStart)}
                </td>
              </tr>
              {row.workers.length > 0 && (
                <HistoryWorkerRows
                  devices={row.workers}
                  executionCount={n}
                  trans={trans}
                />
              )}
            </React.Fragment>
          );
        })}
      </tbody>
    </table>
  );
}

/**
 * What the tab shows for one reading; pure (the sort comes in), for tests.
 */
export function HistoryView(
  props: IViewProps & {
    sort: IHistorySort;
    onSort: (sort: IHistorySort) => void;
  }
): JSX.Element | null {
  const { model, trans } = props;
  return (
    <ReadingFrame<IHistoryResult>
      {...props}
      view="history"
      title={trans.__('History')}
      help={trans.__('Read the measured cells the kernel keeps')}
    >
      {data => {
        if (data.cells.length === 0) {
          return (
            <p className="jp-GpuMem-whoHint">
              {trans.__(
                'No measured cells yet: run a cell with %1, or switch on %2 to measure every cell.',
                '%%gpumem',
                '%gpumem auto'
              )}
            </p>
          );
        }
        const section = (device: number | null, rows: IHistoryRow[]) => (
          <section
            key={device ?? 'none'}
            className="jp-GpuMem-historyDevice"
            data-device={device ?? 'none'}
          >
            <h3 className="jp-GpuMem-deviceTitle">
              <span>
                {device === null
                  ? rows.some(r => r.workers.length > 0)
                    ? trans.__(
                        "No change in the kernel's GPU memory; its workers below"
                      )
                    : trans.__('No GPU memory change')
                  : deviceLabel(device, trans)}
              </span>
            </h3>
            <HistoryTable
              rows={rows}
              device={device}
              sort={props.sort}
              onSort={props.onSort}
              onGoTo={n => void model.scrollToCell(n)}
              trans={trans}
            />
          </section>
        );
        const bare = historyRows(data.cells, null);
        return (
          <>
            {historyDevices(data.cells).map(device =>
              section(device, historyRows(data.cells, device))
            )}
            {bare.length > 0 && section(null, bare)}
          </>
        );
      }}
    </ReadingFrame>
  );
}

/** The History tab. */
export function History(props: IViewProps): JSX.Element | null {
  useReading(props, 'history');
  const [sort, setSort] = React.useState<IHistorySort>(DEFAULT_SORT);
  return <HistoryView {...props} sort={sort} onSort={setSort} />;
}
