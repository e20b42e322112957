/**
 * The "Who holds it" tab: which names of the kernel (and, with allocation
 * tracking on, which lines) hold the allocated memory of each device (each
 * owner with *Free*), and, after an out-of-memory error, why the request
 * failed and what would fix it.
 *
 * Read with the kernel's `who` action; kernel/client.ts says when (only while
 * this tab is shown in the visible panel). Every string the kernel sends is
 * rendered as text.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { availability, deviceLabel } from '../../present/messages';
import { IGpuMemState, IWhoState } from '../../state';
import { ActionButton } from '../common/actionButton';
import { OutOfMemory } from './outOfMemory';
import { Message, NoDeviceMessage, TooOldMessage } from '../common/message';
import { IViewProps } from '../props';
import { FreePanel } from './freePreview';
import { TRACEBACK_PREFIX, WhoTable } from './whoTable';

/**
 * The tab. While it is mounted (its tab selected) the model may read `who`.
 */
export function WhoHoldsIt(props: IViewProps): JSX.Element | null {
  const { model } = props;
  React.useEffect(() => {
    model.setWhoShown(true);
    return () => model.setWhoShown(false);
  }, [model]);
  return <WhoView {...props} />;
}

/**
 * What the tab shows for one state. No hooks: tests render it as a function.
 */
export function WhoView(props: IViewProps): JSX.Element | null {
  const { state, trans } = props;
  const kind = state.status.kind;
  if (kind !== 'ok' && kind !== 'not_initialized') {
    // The kernel's message above the tabs says why there is nothing to read.
    return null;
  }
  if (!state.actions.includes('who')) {
    return (
      <TooOldMessage
        state={state}
        trans={trans}
        title={trans.__('Who holds it')}
      />
    );
  }
  if (state.process.sample && state.process.sample.devices.length === 0) {
    return <NoDeviceMessage {...props} />;
  }
  const who = state.process.who;
  const data = who.data;
  const stale = data !== null && who.status !== 'ok';
  // A Free of an owner whose device left the reading (all of it was freed).
  const free = state.process.free;
  const gone =
    free !== null &&
    free.origin.kind === 'owner' &&
    data !== null &&
    !data.devices.some(d => d.index === free.origin.device);
  return (
    <div
      className="jp-GpuMem-who"
      data-who={who.status}
      aria-busy={who.status === 'loading'}
    >
      <WhoControls {...props} />
      <WhoStatus who={who} trans={trans} />
      {free !== null && gone && <FreePanel {...props} free={free} />}
      {data !== null && (
        <div
          className={
            stale ? 'jp-GpuMem-whoData jp-mod-stale' : 'jp-GpuMem-whoData'
          }
        >
          {data.devices.length === 0 && (
            <Message
              title={trans.__(
                "PyTorch's allocator holds no memory: nothing to attribute"
              )}
            />
          )}
          {data.devices.map(device => (
            <section
              key={device.index}
              className="jp-GpuMem-whoDevice"
              aria-label={trans.__(
                'Who holds the memory of %1',
                deviceLabel(device.index, trans)
              )}
              data-device={device.index}
            >
              <h3 className="jp-GpuMem-deviceTitle">
                <span>{deviceLabel(device.index, trans)}</span>
                <span className="jp-GpuMem-deviceName">
                  {deviceName(state, device.index)}
                </span>
              </h3>
              <WhoTable
                report={device.by_variable}
                trans={trans}
                free={props}
              />
              {device.by_line ? (
                <WhoTable report={device.by_line} trans={trans} />
              ) : (
                <p className="jp-GpuMem-whoHint">
                  {state.process.tracking
                    ? trans.__(
                        'Lines: tracking is on; blocks allocated from now on show their line at the next reading.'
                      )
                    : trans.__(
                        'Track allocation sites to see the lines that allocated it (blocks allocated after it is on).'
                      )}
                </p>
              )}
            </section>
          ))}
        </div>
      )}
      {state.process.postmortems.map((postmortem, i) => (
        <OutOfMemory
          key={`${postmortem.device}-${i}`}
          postmortem={postmortem}
          trans={trans}
          free={props}
        />
      ))}
    </div>
  );
}

function deviceName(state: IGpuMemState, index: number): string {
  const device = state.process.sample?.devices.find(d => d.index === index);
  return device ? device.name : '';
}

/**
 * Refresh, the tracking switch and, when a kept traceback holds memory,
 * Release traceback.
 */
function WhoControls(props: IViewProps): JSX.Element {
  const { model, state, trans } = props;
  // Asked for counts as on: recording starts once the notebook imports torch.
  const tracking =
    state.process.tracking === true || state.process.trackingWanted;
  const track = availability(state, 'track', trans);
  const data = state.process.who.data;
  const traceback =
    data !== null &&
    data.devices.some(d =>
      d.by_variable.rows.some(r => r.key.startsWith(TRACEBACK_PREFIX))
    );
  return (
    <div
      className="jp-GpuMem-controls jp-GpuMem-whoControls"
      role="group"
      aria-label={trans.__('Who holds it')}
    >
      <ActionButton
        label={trans.__('Refresh')}
        ariaLabel={trans.__('Refresh: read who holds the GPU memory now')}
        help={trans.__(
          "Read again: walks the kernel's names between cells (while a cell runs the kernel answers busy)"
        )}
        availability={availability(state, 'who', trans)}
        onClick={() => void model.who()}
        onRefused={reason => model.reportError('who', reason)}
      />
      <label
        className="jp-GpuMem-toggle"
        title={
          track.enabled
            ? trans.__(
                'Record the line that allocates each block from now on (a few microseconds per allocation)'
              )
            : track.reason
        }
      >
        <input
          type="checkbox"
          className="jp-GpuMem-toggleInput"
          checked={tracking}
          aria-disabled={!track.enabled}
          onChange={() => {
            if (track.enabled) {
              void model.setTracking(!tracking);
            } else {
              model.reportError('track', track.reason);
            }
          }}
        />
        {trans.__('Track allocation sites')}
      </label>
      {traceback && (
        <ActionButton
          label={trans.__('Release traceback')}
          ariaLabel={trans.__(
            "Release traceback: drop the last error's frames and the tensors they keep"
          )}
          help={trans.__(
            'The traceback of the last error keeps the variables of its frames alive: release it (sys.last_traceback and the frames)'
          )}
          availability={availability(state, 'release_traceback', trans)}
          onClick={() => void model.releaseTraceback()}
          onRefused={reason => model.reportError('release_traceback', reason)}
        />
      )}
    </div>
  );
}

/**
 * Where the reading stands: a message while there is none to show or when the
 * last try failed, else when it was read.
 */
function WhoStatus(props: {
  who: IWhoState;
  trans: TranslationBundle;
}): JSX.Element | null {
  const { who, trans } = props;
  switch (who.status) {
    case 'idle':
      return who.data === null ? (
        <Message
          title={trans.__('Not read yet')}
          detail={trans.__(
            "Refresh reads who holds the GPU memory: a walk of the kernel's names, between cells."
          )}
        />
      ) : (
        <ReadAt who={who} trans={trans} />
      );
    case 'loading':
      return who.data === null ? (
        <Message title={trans.__('Reading who holds the memory…')} />
      ) : (
        <p className="jp-GpuMem-whoMeta" role="status">
          {trans.__('Reading…')}
        </p>
      );
    case 'busy':
      return (
        <div className="jp-GpuMem-whoBusy" role="status">
          <Message
            // The kernel's words for `busy` (BUSY_MESSAGE), translated.
            title={trans.__('busy: available when the cell ends')}
            detail={
              who.data === null
                ? trans.__('This tab reads again when the cell ends.')
                : trans.__(
                    'This tab reads again when the cell ends; below: the reading of %1.',
                    clock(who.fetchedAt)
                  )
            }
          />
        </div>
      );
    case 'error':
      return (
        <div className="jp-GpuMem-whoError" role="alert">
          <Message {...errorMessage(who, trans)} />
        </div>
      );
    case 'ok':
      return <ReadAt who={who} trans={trans} />;
    default:
      return null;
  }
}

function errorMessage(
  who: IWhoState,
  trans: TranslationBundle
): { title: string; detail?: string } {
  const error = who.error;
  if (!error) {
    return { title: trans.__('Reading who holds the memory failed') };
  }
  switch (error.code) {
    case 'refused':
      // The kernel's reason is a sentence: "torch is not imported…".
      return {
        title: trans.__('Nothing to attribute'),
        detail: error.message
      };
    case 'timeout':
      return {
        title: trans.__('The kernel did not answer in time'),
        detail: trans.__('Refresh to try again.')
      };
    default:
      return {
        title: trans.__('Reading who holds the memory failed'),
        detail: error.message
      };
  }
}

function clock(time: number | null): string {
  return time === null ? '' : new Date(time).toLocaleTimeString();
}

function ReadAt(props: {
  who: IWhoState;
  trans: TranslationBundle;
}): JSX.Element | null {
  const { who, trans } = props;
  if (who.fetchedAt === null) {
    return null;
  }
  return (
    <p className="jp-GpuMem-whoMeta">
      {trans.__('Read at %1', clock(who.fetchedAt))}
    </p>
  );
}
