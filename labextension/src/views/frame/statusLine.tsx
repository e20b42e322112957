/**
 * The line at the bottom of the panel: the outcome of the last action, its
 * error, or that the kernel has not answered yet.
 */
import * as React from 'react';

import { errorText, noticeText } from '../../present/messages';
import { IViewProps } from '../props';

export function StatusLine(props: IViewProps): JSX.Element {
  const { model, state, trans } = props;
  let text = '';
  let kind = '';
  if (state.lastError) {
    text = errorText(state.lastError, trans);
    kind = 'jp-mod-error';
  } else if (state.notice) {
    text = noticeText(state.notice, trans);
  } else if (state.process.pending) {
    text = trans.__('Waiting for the kernel…');
  }
  return (
    <div
      className={`jp-GpuMem-statusLine ${kind}`}
      role="status"
      aria-live="polite"
    >
      <span className="jp-GpuMem-statusText">{text}</span>
      {text !== '' && !state.process.pending && (
        <button
          type="button"
          className="jp-GpuMem-dismiss"
          aria-label={trans.__('Dismiss the message')}
          onClick={() => model.dismiss()}
        >
          ×
        </button>
      )}
    </div>
  );
}
