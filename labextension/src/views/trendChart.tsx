/**
 * Where the trend chart of one device is drawn: allocated and reserved memory
 * over the last minutes (an SVG), with the cap and the cells run as markers.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { formatBytes, formatDelta, Units } from '../format';
import { deviceLabel } from '../messages';
import { ICellMarker, IDevice } from '../protocol';
import { ITrendPoint } from '../reducer';

const TREND_WIDTH = 300;
const TREND_HEIGHT = 64;

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

export function TrendChart(props: {
  device: IDevice;
  points: readonly ITrendPoint[];
  cells: readonly ICellMarker[];
  now: number;
  minutes: number;
  units: Units;
  trans: TranslationBundle;
}): JSX.Element | null {
  const { device, points, cells, now, minutes, units, trans } = props;
  if (points.length === 0) {
    return null;
  }
  // Until the history fills the window, show what there is (at least 1 min).
  const span = Math.min(
    Math.max(1, minutes * 60),
    Math.max(60, now - points[0].time)
  );
  const start = now - span;
  // Scaled to the data: a far-away cap would flatten the lines; it is drawn
  // only when it falls inside.
  const highest = Math.max(
    1,
    ...points.map(p => Math.max(p.reserved, p.allocated))
  );
  const top = highest * 1.05;
  const limitBytes =
    device.limit && device.limit.bytes <= top ? device.limit.bytes : null;
  const x = (time: number) => ((time - start) / span) * TREND_WIDTH;
  const y = (bytes: number) =>
    TREND_HEIGHT - (bytes / top) * (TREND_HEIGHT - 2) - 1;
  const path = (key: 'allocated' | 'reserved') => {
    // Samples come only when a figure changed: hold each value until the next.
    const parts: string[] = [];
    points.forEach((p, i) => {
      const px = Math.max(0, x(p.time)).toFixed(1);
      if (i > 0) {
        parts.push(`${px},${y(points[i - 1][key]).toFixed(1)}`);
      }
      parts.push(`${px},${y(p[key]).toFixed(1)}`);
    });
    const last = points[points.length - 1];
    parts.push(`${TREND_WIDTH},${y(last[key]).toFixed(1)}`);
    return parts.join(' ');
  };
  const visibleCells = cells.filter(
    c => c.time >= start && c.devices.some(d => d.index === device.index)
  );
  return (
    <figure className="jp-GpuMem-trend">
      <svg
        viewBox={`0 0 ${TREND_WIDTH} ${TREND_HEIGHT}`}
        preserveAspectRatio="none"
        role="img"
        aria-label={trans.__(
          'Allocated and reserved memory of %1, %2 until now',
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
        <polyline
          className="jp-GpuMem-trendReserved"
          points={path('reserved')}
        />
        <polyline
          className="jp-GpuMem-trendAllocated"
          points={path('allocated')}
        />
        {visibleCells.map((cell, i) => (
          <g key={`${cell.time}-${i}`} className="jp-GpuMem-cellMarker">
            <title>{cellTooltip(cell, device.index, units, trans)}</title>
            <line
              className={
                cell.failed
                  ? 'jp-GpuMem-cellLine jp-mod-failed'
                  : 'jp-GpuMem-cellLine'
              }
              x1={x(cell.time)}
              x2={x(cell.time)}
              y1={0}
              y2={TREND_HEIGHT}
            />
            <rect
              x={x(cell.time) - 3}
              y={0}
              width={6}
              height={TREND_HEIGHT}
              fill="transparent"
            />
          </g>
        ))}
      </svg>
      <figcaption className="jp-GpuMem-trendAxis">
        <span>{spanLabel(span, trans)}</span>
        <span>{trans.__('max %1', formatBytes(highest, units))}</span>
        <span>{trans.__('now')}</span>
      </figcaption>
    </figure>
  );
}
