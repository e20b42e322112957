/**
 * The figures of one device under its bar: peaks, cached free, fragmentation,
 * caching, cap, allocation retries and out-of-memory errors.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { cachedFree } from '../../present/bar';
import { formatBytes, formatPercent } from '../../present/format';
import { IDevice } from '../../protocol';

/** One figure: its label (with help on hover) and its value. */
export function Figure(props: {
  label: string;
  value: string;
  help: string;
  name: string;
  warn?: boolean;
}): JSX.Element {
  return (
    <>
      <dt title={props.help}>{props.label}</dt>
      <dd
        data-figure={props.name}
        className={props.warn ? 'jp-GpuMem-warn' : undefined}
      >
        {props.value}
      </dd>
    </>
  );
}

export function Figures(props: {
  device: IDevice;
  caching: boolean | null;
  trans: TranslationBundle;
}): JSX.Element {
  const { device, caching, trans } = props;
  const free = cachedFree(device);
  return (
    <dl className="jp-GpuMem-figures">
      {device.initialized && device.peak_allocated !== null && (
        <Figure
          name="peak_allocated"
          label={trans.__('Peak allocated')}
          value={formatBytes(device.peak_allocated)}
          help={trans.__(
            'Highest allocation since the last peak reset (the solid mark on the bar)'
          )}
        />
      )}
      {device.initialized && device.peak_reserved !== null && (
        <Figure
          name="peak_reserved"
          label={trans.__('Peak reserved')}
          value={formatBytes(device.peak_reserved)}
          help={trans.__('Highest reservation since the last peak reset')}
        />
      )}
      {free !== null && (
        <Figure
          name="cached_free"
          label={trans.__('Cached, free')}
          value={formatBytes(free)}
          help={trans.__('Reserved but not allocated: blocks kept for reuse')}
        />
      )}
      {device.initialized && device.inactive_split !== null && (
        <Figure
          name="inactive_split"
          label={trans.__('Non-releasable')}
          value={formatBytes(device.inactive_split)}
          help={trans.__(
            'Fragmentation: free parts of split blocks that Empty cache cannot return (inactive_split)'
          )}
        />
      )}
      {device.initialized && (
        <Figure
          name="caching"
          label={trans.__('Caching')}
          value={
            caching === null
              ? trans.__('unknown')
              : caching
                ? trans.__('on')
                : trans.__('off')
          }
          help={trans.__("State of PyTorch's caching allocator in this kernel")}
          warn={caching === false}
        />
      )}
      <Figure
        name="limit"
        label={trans.__('Cap')}
        value={
          device.limit
            ? trans.__(
                '%1 (%2)',
                formatBytes(device.limit.bytes),
                formatPercent(device.limit.fraction)
              )
            : trans.__('none')
        }
        help={trans.__(
          'Memory cap set with set_per_process_memory_fraction (the dashed mark on the bar)'
        )}
      />
      {(device.alloc_retries ?? 0) > 0 && (
        <Figure
          name="alloc_retries"
          label={trans.__('Allocation retries')}
          value={String(device.alloc_retries)}
          help={trans.__(
            'cudaMalloc failed, the cache was flushed and the allocation retried: slow'
          )}
          warn
        />
      )}
      {(device.ooms ?? 0) > 0 && (
        <Figure
          name="ooms"
          label={trans.__('Out of memory errors')}
          value={String(device.ooms)}
          help={trans.__(
            'OutOfMemoryError raised by the allocator on this device'
          )}
          warn
        />
      )}
    </dl>
  );
}
