/**
 * The top of the panel: the replay banner when the figures are replayed,
 * title, the notebook or console shown, torch version and host memory, and
 * the kernel's remark on its figures.
 */
import * as React from 'react';

import { formatBytes } from '../../present/format';
import { gpuMemIcon } from './icon';
import { IViewProps } from '../props';
import { ReplayBanner } from './replayBanner';

export function Header(props: IViewProps): JSX.Element {
  const { state, trans } = props;
  const details: string[] = [];
  const newest = state.process.sample;
  if (newest && newest.torch_version) {
    details.push(trans.__('torch %1', newest.torch_version));
  }
  if (newest && newest.host_rss !== null) {
    details.push(trans.__('host RSS %1', formatBytes(newest.host_rss)));
  }
  const sample = state.status.kind === 'ok' ? state.status.sample : null;
  // The banner says a replay's sentence: not twice.
  const note =
    sample && sample.message !== sample.replay?.description
      ? sample.message
      : '';
  return (
    <header className="jp-GpuMem-header">
      <ReplayBanner replay={newest?.replay} trans={trans} />
      <h2 className="jp-GpuMem-title">
        <gpuMemIcon.react tag="span" className="jp-GpuMem-titleIcon" />
        {trans.__('GPU memory')}
      </h2>
      <div className="jp-GpuMem-source" title={trans.__('Kernel shown')}>
        {state.source ?? trans.__('No notebook or console')}
        {state.process.busy && (
          <span className="jp-GpuMem-busy">{trans.__('running')}</span>
        )}
      </div>
      {details.length > 0 && (
        <div className="jp-GpuMem-details">{details.join(' · ')}</div>
      )}
      {note && (
        // The kernel's remark on figures it shows anyway.
        <div className="jp-GpuMem-note">{note}</div>
      )}
    </header>
  );
}
