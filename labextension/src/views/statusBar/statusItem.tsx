/**
 * The status bar's item: allocated / reserved of the busiest GPU of the
 * followed kernel, in the warning colour near the cap or the device's end,
 * marked when replayed. A click opens the panel.
 */
import * as React from 'react';

import { IStatusSummary } from '../../present/statusSummary';

export function StatusItem(props: {
  summary: IStatusSummary;
  onOpen: () => void;
}): JSX.Element {
  const { summary } = props;
  return (
    <button
      type="button"
      className={`jp-StatusBar-TextItem jp-GpuMem-statusItem${summary.near ? ' jp-mod-warn' : ''}`}
      title={summary.tooltip}
      data-device={summary.index}
      data-near={summary.near ?? 'none'}
      data-replay={summary.replay ? 'true' : 'false'}
      onClick={props.onOpen}
    >
      <span className="jp-GpuMem-statusFigures">{summary.text}</span>
    </button>
  );
}
