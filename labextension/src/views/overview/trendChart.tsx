/**
 * Where the trend chart of one device is drawn: allocated and reserved memory
 * and what this process uses on the device (NVML) over the last minutes (an
 * SVG scaled to its data), with the cap, a legend, and the cells run as
 * markers labelled `[N]`; a marker scrolls the notebook to its cell.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { formatBytes, formatDelta } from '../../present/format';
import { deviceLabel } from '../../present/messages';
import { ICellMarker, IDevice } from '../../protocol';
import { ITrendPoint } from '../../state';

const TREND_WIDTH = 300;
const TREND_HEIGHT = 64;

/** Markers closer than this share of the width share one label. */
const LABEL_GAP = 0.06;

export type TrendLine = 'allocated' | 'reserved' | 'process';

/**
 * Tooltips already worded, per translation and cell: a cell marker never
 * changes, and the trend is drawn again for every sample.
 */
const TOOLTIPS = new WeakMap<
  TranslationBundle,
  WeakMap<ICellMarker, Map<string, string>>
>();

/** The tooltip of a cell marker, worded once per cell and device. */
export function cachedTooltip(
  cell: ICellMarker,
  index: number,
  trans: TranslationBundle
): string {
  let byCell = TOOLTIPS.get(trans);
  if (!byCell) {
    byCell = new WeakMap();
    TOOLTIPS.set(trans, byCell);
  }
  let byKey = byCell.get(cell);
  if (!byKey) {
    byKey = new Map();
    byCell.set(cell, byKey);
  }
  const key = String(index);
  let text = byKey.get(key);
  if (text === undefined) {
    text = `${cellTooltip(cell, index, trans)}\n${trans.__(
      'Click: go to the cell'
    )}`;
    byKey.set(key, text);
  }
  return text;
}

export function cellTooltip(
  cell: ICellMarker,
  index: number,
  trans: TranslationBundle
): string {
  const lines = [
    cell.execution_count === null
      ? trans.__('Cell')
      : trans.__('Cell [%1]', cell.execution_count),
    cell.first_line,
    trans.__('Wall time %1 s', cell.wall_time.toFixed(2))
  ];
  if (cell.failed) {
    lines.push(trans.__('Failed'));
  }
  const device = cell.devices.find(d => d.index === index);
  if (device) {
    lines.push(trans.__('Allocated %1', formatDelta(device.allocated_delta)));
    lines.push(trans.__('Reserved %1', formatDelta(device.reserved_delta)));
    if (device.peak_allocated !== null) {
      lines.push(
        trans.__('Peak allocated %1', formatBytes(device.peak_allocated))
      );
    }
    // Tracking on: the cell's lines that allocated what it kept.
    for (const kept of device.kept_at ?? []) {
      lines.push(
        trans.__(
          'kept at line %1 `%2` %3',
          kept.line,
          kept.text,
          formatBytes(kept.bytes)
        )
      );
    }
  }
  for (const postmortem of cell.postmortems ?? []) {
    if (postmortem.device === index) {
      lines.push(
        trans.__(
          'Out of memory: asked for %1 (Who holds it explains)',
          formatBytes(postmortem.requested)
        )
      );
    }
  }
  return lines.join('\n');
}

function spanLabel(seconds: number, trans: TranslationBundle): string {
  if (seconds < 90) {
    return trans.__('-%1 s', Math.round(seconds));
  }
  const minutes = Math.round((seconds / 60) * 10) / 10;
  return trans.__('-%1 min', minutes);
}

function lineLabel(line: TrendLine, trans: TranslationBundle): string {
  switch (line) {
    case 'allocated':
      return trans.__('Allocated');
    case 'reserved':
      return trans.__('Reserved');
    case 'process':
      return trans.__('This process (NVML)');
  }
}

/** A marker's place on the chart, and whether it carries a label. */
export interface IMarkerPlace {
  cell: ICellMarker;
  /** 0..1 of the width. */
  x: number;
  /** Shown as `[N]`: not too close to the previous labelled one. */
  labelled: boolean;
}

/**
 * Place the markers of the cells inside the window; label each unless it
 * would overlap the label before it (the newest cells win: placed from the
 * right).
 */
export function placeMarkers(
  cells: readonly ICellMarker[],
  device: number,
  start: number,
  span: number,
  gap = LABEL_GAP
): IMarkerPlace[] {
  const places: IMarkerPlace[] = cells
    // A cell that changed no device's memory (no device figures) shows on each.
    .filter(
      c =>
        c.time >= start &&
        (c.devices.length === 0 || c.devices.some(d => d.index === device))
    )
    .map(cell => ({
      cell,
      x: Math.min(1, Math.max(0, (cell.time - start) / span)),
      labelled: false
    }));
  let lastX = Infinity;
  for (let i = places.length - 1; i >= 0; i--) {
    const place = places[i];
    if (place.cell.execution_count !== null && lastX - place.x >= gap) {
      place.labelled = true;
      lastX = place.x;
    }
  }
  return places;
}

/**
 * The points of one line as an SVG polyline: each value held until the next
 * (samples come only when a figure changed), with at most three points per
 * pixel column (held, the column's largest value, its last: a peak never
 * disappears) and none where nothing changed.
 */
export function stepLine(
  points: readonly ITrendPoint[],
  key: TrendLine,
  x: (time: number) => number,
  y: (bytes: number) => number,
  width: number
): string {
  const parts: string[] = [];
  const at = (px: number, bytes: number) =>
    parts.push(`${px},${y(bytes).toFixed(1)}`);
  let held: number | null = null;
  let column = -1;
  let columnMax = 0;
  let columnLast = 0;
  const close = () => {
    if (column < 0 || (columnMax === held && columnLast === held)) {
      return; // flat: the line goes on straight
    }
    if (held !== null) {
      at(column, held);
    }
    at(column, columnMax);
    if (columnLast !== columnMax) {
      at(column, columnLast);
    }
    held = columnLast;
  };
  for (const p of points) {
    const value = p[key];
    if (value === null || value === undefined) {
      continue;
    }
    const px = Math.min(width, Math.max(0, Math.round(x(p.time))));
    if (px !== column) {
      close();
      column = px;
      columnMax = value;
    } else {
      columnMax = Math.max(columnMax, value);
    }
    columnLast = value;
  }
  close();
  if (held !== null) {
    at(width, held);
  }
  return parts.join(' ');
}

interface IMarkerLabelsProps {
  cells: readonly ICellMarker[];
  device: number;
  /** Time the labels are placed from (see TrendChart). */
  origin: number;
  span: number;
  trans: TranslationBundle;
  onGoTo?: (executionCount: number) => void;
}

/**
 * The `[N]` buttons of the cells since `origin`, at fixed places from it: they
 * change only when a cell arrives or `origin` moves (once a window length),
 * not with every sample.
 */
function MarkerLabelsView(props: IMarkerLabelsProps): JSX.Element {
  const { cells, device, origin, span, trans, onGoTo } = props;
  const markers = placeMarkers(cells, device, origin, span);
  return (
    <>
      {markers.map(m => {
        const n = m.cell.execution_count;
        if (n === null) {
          return null;
        }
        return (
          <button
            key={`${m.cell.time}-${n}`}
            type="button"
            className={
              m.labelled
                ? 'jp-GpuMem-markerLabel'
                : 'jp-GpuMem-markerLabel jp-mod-unlabelled'
            }
            style={{
              left: `${(((m.cell.time - origin) / span) * 100).toFixed(3)}%`
            }}
            data-cell={n}
            title={cachedTooltip(m.cell, device, trans)}
            aria-label={trans.__('Go to cell [%1]', n)}
            onClick={() => onGoTo?.(n)}
          >
            {m.labelled ? `[${n}]` : ''}
          </button>
        );
      })}
    </>
  );
}

/** The latest `onGoTo` is used by the buttons; a new arrow is no change. */
const MarkerLabels = React.memo(
  MarkerLabelsView,
  (a, b) =>
    a.cells === b.cells &&
    a.device === b.device &&
    a.origin === b.origin &&
    a.span === b.span &&
    a.trans === b.trans &&
    (a.onGoTo === undefined) === (b.onGoTo === undefined)
);

export function TrendChart(props: {
  device: IDevice;
  points: readonly ITrendPoint[];
  cells: readonly ICellMarker[];
  now: number;
  minutes: number;
  trans: TranslationBundle;
  /** A marker was clicked: scroll the notebook to that cell. */
  onGoTo?: (executionCount: number) => void;
}): JSX.Element | null {
  const { device, points, cells, now, minutes, trans, onGoTo } = props;
  if (points.length === 0) {
    return null;
  }
  // Until the history fills the window, show what there is (at least 1 min).
  const span = Math.min(
    Math.max(1, minutes * 60),
    Math.max(60, now - points[0].time)
  );
  const start = now - span;
  const lines: TrendLine[] = ['allocated', 'reserved'];
  if (points.some(p => p.process !== null && p.process !== undefined)) {
    lines.push('process');
  }
  // Scaled to the data: a far-away cap would flatten the lines; it is drawn
  // only when it falls inside.
  const highest = Math.max(
    1,
    ...points.map(p => Math.max(p.reserved, p.allocated, p.process ?? 0))
  );
  const top = highest * 1.05;
  const limitBytes =
    device.limit && device.limit.bytes <= top ? device.limit.bytes : null;
  const x = (time: number) => ((time - start) / span) * TREND_WIDTH;
  const y = (bytes: number) =>
    TREND_HEIGHT - (bytes / top) * (TREND_HEIGHT - 2) - 1;
  const path = (key: TrendLine) => stepLine(points, key, x, y, TREND_WIDTH);
  const markers = placeMarkers(cells, device.index, start, span);
  // Labels are placed from a time that moves once a window length, not with
  // every sample (see the marker strip below).
  const origin = Math.floor(start / span) * span;
  const last = points[points.length - 1];
  return (
    <figure className="jp-GpuMem-trend">
      <div className="jp-GpuMem-trendPlot">
        <svg
          viewBox={`0 0 ${TREND_WIDTH} ${TREND_HEIGHT}`}
          preserveAspectRatio="none"
          role="img"
          aria-label={trans.__(
            'Allocated, reserved and process memory of %1, %2 until now',
            deviceLabel(device.index, trans),
            spanLabel(span, trans)
          )}
        >
          {limitBytes !== null && (
            <line
              className="jp-GpuMem-trendLimit"
              x1={0}
              x2={TREND_WIDTH}
              y1={y(limitBytes)}
              y2={y(limitBytes)}
            />
          )}
          {lines
            .slice()
            .reverse()
            .map(line => (
              <polyline
                key={line}
                className={`jp-GpuMem-trendLine jp-GpuMem-trend-${line}`}
                data-line={line}
                points={path(line)}
              />
            ))}
          {(['ok', 'failed'] as const).map(kind => {
            const d = markers
              .filter(m => m.cell.failed === (kind === 'failed'))
              .map(m => `M${(m.x * TREND_WIDTH).toFixed(1)} 0V${TREND_HEIGHT}`)
              .join('');
            return d ? (
              <path
                key={kind}
                className={
                  kind === 'failed'
                    ? 'jp-GpuMem-cellLine jp-mod-failed'
                    : 'jp-GpuMem-cellLine'
                }
                d={d}
              />
            ) : null;
          })}
        </svg>
        <div className="jp-GpuMem-markerWindow">
          <div
            className="jp-GpuMem-markerLabels"
            // The labels sit at fixed places from `origin`; as the window
            // slides only this one transform changes, not each label.
            style={{
              transform: `translateX(${(-((start - origin) / span) * 100).toFixed(3)}%)`
            }}
          >
            <MarkerLabels
              cells={cells}
              device={device.index}
              origin={origin}
              span={span}
              trans={trans}
              onGoTo={onGoTo}
            />
          </div>
        </div>
      </div>
      <figcaption className="jp-GpuMem-trendAxis">
        <span>{spanLabel(span, trans)}</span>
        <span>{trans.__('max %1', formatBytes(highest))}</span>
        <span>{trans.__('now')}</span>
      </figcaption>
      <ul className="jp-GpuMem-trendLegend">
        {lines.map(line => {
          const value = last[line];
          return (
            <li key={line} data-line={line}>
              <span
                className={`jp-GpuMem-trendSwatch jp-GpuMem-trend-${line}`}
                aria-hidden="true"
              />
              {lineLabel(line, trans)}
              {value !== null && value !== undefined && (
                <span className="jp-GpuMem-value">{formatBytes(value)}</span>
              )}
            </li>
          );
        })}
      </ul>
    </figure>
  );
}
