/**
 * The stacked bar of one device (allocated, reserved, this process, all
 * processes; the peak and cap marks) and its legend.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { barGeometry, BarScale, SegmentKey } from '../../present/bar';
import { formatBytes, formatPercent } from '../../present/format';
import { IDevice } from '../../protocol';

function segmentLabel(key: SegmentKey, trans: TranslationBundle): string {
  switch (key) {
    case 'allocated':
      return trans.__('Allocated');
    case 'reserved':
      return trans.__('Reserved');
    case 'process':
      return trans.__('This process');
    case 'device':
      return trans.__('All processes');
  }
}

function segmentHelp(key: SegmentKey, trans: TranslationBundle): string {
  switch (key) {
    case 'allocated':
      return trans.__('Memory held by live tensors');
    case 'reserved':
      return trans.__(
        "Memory PyTorch's caching allocator holds: allocated plus cached free blocks"
      );
    case 'process':
      return trans.__(
        'Memory this kernel process uses on the device (reserved plus the CUDA context), from NVML'
      );
    case 'device':
      return trans.__('Memory used on the device by all processes');
  }
}

export function DeviceBar(props: {
  device: IDevice;
  trans: TranslationBundle;
  scale?: BarScale;
}): JSX.Element {
  const { device, trans } = props;
  const geometry = barGeometry(device, props.scale ?? 'total');
  const described = geometry.segments
    .slice()
    .reverse()
    .map(s => `${segmentLabel(s.key, trans)} ${formatBytes(s.bytes)}`);
  if (device.total !== null) {
    described.push(trans.__('of %1', formatBytes(device.total)));
  }
  return (
    <div
      className="jp-GpuMem-bar"
      role="img"
      aria-label={described.join(', ')}
      data-scale={geometry.scale}
      data-scale-total={geometry.scaleIsTotal}
    >
      {geometry.segments.map(segment => (
        <div
          key={segment.key}
          className={`jp-GpuMem-segment jp-GpuMem-segment-${segment.key}${
            segment.clipped ? ' jp-mod-clipped' : ''
          }`}
          style={{ width: `${(segment.fraction * 100).toFixed(3)}%` }}
          data-bytes={segment.bytes}
          title={`${segmentLabel(segment.key, trans)}: ${formatBytes(segment.bytes)}${
            segment.clipped ? ` (${trans.__('beyond the scale')})` : ''
          }`}
        />
      ))}
      {geometry.peak !== null && (
        <div
          className="jp-GpuMem-peak"
          style={{ left: `${(geometry.peak * 100).toFixed(3)}%` }}
          title={trans.__(
            'Peak allocated since the last reset: %1',
            formatBytes(device.peak_allocated ?? 0)
          )}
        />
      )}
      {geometry.limit !== null && device.limit && (
        <div
          className="jp-GpuMem-limit"
          style={{ left: `${(geometry.limit * 100).toFixed(3)}%` }}
          title={trans.__(
            'Cap: %1 (%2)',
            formatBytes(device.limit.bytes),
            formatPercent(device.limit.fraction)
          )}
        />
      )}
    </div>
  );
}

export function Legend(props: {
  device: IDevice;
  trans: TranslationBundle;
}): JSX.Element {
  const { device, trans } = props;
  const geometry = barGeometry(device);
  const rows = geometry.segments.slice().reverse();
  return (
    <ul className="jp-GpuMem-legend">
      {rows.map(segment => (
        <li key={segment.key} title={segmentHelp(segment.key, trans)}>
          <span
            className={`jp-GpuMem-swatch jp-GpuMem-segment-${segment.key}`}
            aria-hidden="true"
          />
          <span className="jp-GpuMem-legendLabel">
            {segmentLabel(segment.key, trans)}
          </span>
          <span className="jp-GpuMem-value" data-figure={segment.key}>
            {formatBytes(segment.bytes)}
          </span>
        </li>
      ))}
      {device.total !== null && (
        <li title={trans.__('Capacity of the device')}>
          <span
            className="jp-GpuMem-swatch jp-GpuMem-segment-total"
            aria-hidden="true"
          />
          <span className="jp-GpuMem-legendLabel">{trans.__('Total')}</span>
          <span className="jp-GpuMem-value" data-figure="total">
            {formatBytes(device.total)}
          </span>
        </li>
      )}
    </ul>
  );
}
