/**
 * What the Segments and History tabs share: reading while shown, the Refresh
 * button, and a message for every state of the reading (never blank).
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { availability, errorText } from '../../present/messages';
import { IActionError, IReading, ReadingView } from '../../state';
import { ActionButton } from './actionButton';
import { Message, NoDeviceMessage, TooOldMessage } from './message';
import { IViewProps } from '../props';

/** Read the view while its tab is mounted. */
export function useReading(props: IViewProps, view: ReadingView): void {
  const { model } = props;
  React.useEffect(() => {
    model.setReadingShown(view, true);
    return () => model.setReadingShown(view, false);
  }, [model, view]);
}

function clock(at: number | null): string {
  return at === null ? '' : new Date(at).toLocaleTimeString();
}

/**
 * The frame of a reading view: null when the kernel's message above the tabs
 * already says why there is nothing; else the controls, the reading's status
 * and, once read, `children(data)`.
 */
export function ReadingFrame<T>(
  props: IViewProps & {
    view: ReadingView;
    /** What Refresh reads, for its tooltip. */
    help: string;
    /** What the view is called in its messages. */
    title: string;
    /** More controls beside Refresh (the Segments tab's process chooser). */
    controls?: React.ReactNode;
    /** The words of a failed reading, when the view has its own; null: the usual. */
    errorTitle?: (error: IActionError) => string | null;
    children: (data: T) => React.ReactNode;
  }
): JSX.Element | null {
  const { model, state, trans, view } = props;
  const kind = state.status.kind;
  if (kind !== 'ok' && kind !== 'not_initialized') {
    return null;
  }
  if (state.actions.length > 0 && !state.actions.includes(view)) {
    return <TooOldMessage state={state} trans={trans} title={props.title} />;
  }
  if (state.process.sample && state.process.sample.devices.length === 0) {
    return <NoDeviceMessage {...props} />;
  }
  const reading = state.process.readings[view] as IReading<T>;
  const stale = reading.data !== null && reading.status !== 'ok';
  return (
    <div
      className={`jp-GpuMem-reading jp-GpuMem-${view}`}
      data-reading={reading.status}
      aria-busy={reading.status === 'loading'}
    >
      <div className="jp-GpuMem-controls" role="group" aria-label={props.title}>
        {props.controls}
        <ActionButton
          label={trans.__('Refresh')}
          ariaLabel={trans.__('Refresh: read %1 now', props.title)}
          help={props.help}
          availability={availability(state, view, trans)}
          onClick={() => void model.fetchReading(view)}
          onRefused={reason => model.reportError(view, reason)}
        />
        <span className="jp-GpuMem-readingMeta" role="status">
          {reading.status === 'loading'
            ? trans.__('Reading…')
            : reading.fetchedAt !== null
              ? trans.__('Read at %1', clock(reading.fetchedAt))
              : ''}
        </span>
      </div>
      <ReadingStatus
        reading={reading}
        trans={trans}
        title={props.title}
        errorTitle={props.errorTitle}
      />
      {reading.data !== null && (
        <div
          className={
            stale
              ? 'jp-GpuMem-readingData jp-mod-stale'
              : 'jp-GpuMem-readingData'
          }
        >
          {props.children(reading.data)}
        </div>
      )}
    </div>
  );
}

function ReadingStatus(props: {
  reading: IReading<unknown>;
  title: string;
  trans: TranslationBundle;
  errorTitle?: (error: IActionError) => string | null;
}): JSX.Element | null {
  const { reading, trans } = props;
  if (reading.status === 'error' && reading.error) {
    return (
      <div className="jp-GpuMem-readingError" role="alert">
        <Message
          title={
            props.errorTitle?.(reading.error) ?? errorText(reading.error, trans)
          }
          detail={
            reading.data === null
              ? ''
              : trans.__('Below: the reading of %1.', clock(reading.fetchedAt))
          }
        />
      </div>
    );
  }
  if (reading.data === null) {
    return (
      <Message
        title={
          reading.status === 'loading'
            ? trans.__('Reading %1…', props.title)
            : trans.__('Not read yet')
        }
      />
    );
  }
  return null;
}
