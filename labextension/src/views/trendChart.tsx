/**
 * Where the trend chart of one device is drawn: allocated and reserved memory
 * and what this process uses on the device (NVML) over the last minutes (an
 * SVG scaled to its data), with the cap, a legend, and the cells run as
 * markers labelled `[N]`; a marker scrolls the notebook to its cell.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { formatBytes, formatDelta, Units } from '../format';
import { deviceLabel } from '../messages';
import { ICellMarker, IDevice } from '../protocol';
import { ITrendPoint } from '../reducer';

const TREND_WIDTH = 300;
const TREND_HEIGHT = 64;

/** Markers closer than this share of the width share one label. */
const LABEL_GAP = 0.06;

export type TrendLine = 'allocated' | 'reserved' | 'process';

export function cellTooltip(
  cell: ICellMarker,
  index: number,
  units: Units,
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
    lines.push(
      trans.__('Allocated %1', formatDelta(device.allocated_delta, units))
    );
    lines.push(
      trans.__('Reserved %1', formatDelta(device.reserved_delta, units))
    );
    if (device.peak_allocated !== null) {
      lines.push(
        trans.__('Peak allocated %1', formatBytes(device.peak_allocated, units))
      );
    }
    // Tracking on: the cell's lines that allocated what it kept.
    for (const kept of device.kept_at ?? []) {
      lines.push(
        trans.__(
          'kept at line %1 `%2` %3',
          kept.line,
          kept.text,
          formatBytes(kept.bytes, units)
        )
      );
    }
  }
  for (const postmortem of cell.postmortems ?? []) {
    if (postmortem.device === index) {
      lines.push(
        trans.__(
          'Out of memory: asked for %1 (Who holds it explains)',
          formatBytes(postmortem.requested, units)
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

export function TrendChart(props: {
  device: IDevice;
  points: readonly ITrendPoint[];
  cells: readonly ICellMarker[];
  now: number;
  minutes: number;
  units: Units;
  trans: TranslationBundle;
  /** A marker was clicked: scroll the notebook to that cell. */
  onGoTo?: (executionCount: number) => void;
}): JSX.Element | null {
  const { device, points, cells, now, minutes, units, trans, onGoTo } = props;
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
  const path = (key: TrendLine) => {
    // Samples come only when a figure changed: hold each value until the next.
    const parts: string[] = [];
    let previous: number | null = null;
    for (const p of points) {
      const value = p[key];
      if (value === null || value === undefined) {
        continue;
      }
      const px = Math.max(0, x(p.time)).toFixed(1);
      if (previous !== null) {
        parts.push(`${px},${y(previous).toFixed(1)}`);
      }
      parts.push(`${px},${y(value).toFixed(1)}`);
      previous = value;
    }
    if (previous !== null) {
      parts.push(`${TREND_WIDTH},${y(previous).toFixed(1)}`);
    }
    return parts.join(' ');
  };
  const markers = placeMarkers(cells, device.index, start, span);
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
          {markers.map((m, i) => (
            <g key={`${m.cell.time}-${i}`} className="jp-GpuMem-cellMarker">
              <title>{cellTooltip(m.cell, device.index, units, trans)}</title>
              <line
                className={
                  m.cell.failed
                    ? 'jp-GpuMem-cellLine jp-mod-failed'
                    : 'jp-GpuMem-cellLine'
                }
                x1={m.x * TREND_WIDTH}
                x2={m.x * TREND_WIDTH}
                y1={0}
                y2={TREND_HEIGHT}
              />
            </g>
          ))}
        </svg>
        <div className="jp-GpuMem-markerLabels">
          {markers.map((m, i) => {
            const n = m.cell.execution_count;
            if (n === null) {
              return null;
            }
            return (
              <button
                key={`${m.cell.time}-${i}`}
                type="button"
                className={
                  m.labelled
                    ? 'jp-GpuMem-markerLabel'
                    : 'jp-GpuMem-markerLabel jp-mod-unlabelled'
                }
                style={{ left: `${(m.x * 100).toFixed(2)}%` }}
                data-cell={n}
                title={`${cellTooltip(m.cell, device.index, units, trans)}\n${trans.__(
                  'Click: go to the cell'
                )}`}
                aria-label={trans.__('Go to cell [%1]', n)}
                onClick={() => onGoTo?.(n)}
              >
                {m.labelled ? `[${n}]` : ''}
              </button>
            );
          })}
        </div>
      </div>
      <figcaption className="jp-GpuMem-trendAxis">
        <span>{spanLabel(span, trans)}</span>
        <span>{trans.__('max %1', formatBytes(highest, units))}</span>
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
                <span className="jp-GpuMem-value">
                  {formatBytes(value, units)}
                </span>
              )}
            </li>
          );
        })}
      </ul>
    </figure>
  );
}
