/**
 * The banner at the top of the panel when the kernel replays recorded figures
 * (`sample.replay`): none of them is measured on this machine.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { replayBody } from '../../present/replay';
import { IReplay } from '../../protocol';

export function ReplayBanner(props: {
  replay: IReplay | null | undefined;
  trans: TranslationBundle;
}): JSX.Element | null {
  const { replay, trans } = props;
  if (!replay) {
    return null;
  }
  return (
    <div
      className="jp-GpuMem-replayBanner"
      role="note"
      data-gpu={replay.gpu}
      data-torch={replay.torch_version ?? ''}
    >
      <strong className="jp-GpuMem-replayLabel">{trans.__('Replay')}</strong>{' '}
      <span className="jp-GpuMem-replayText">{replayBody(replay, trans)}</span>
    </div>
  );
}
