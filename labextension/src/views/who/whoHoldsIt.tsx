/**
 * The "Who holds it" tab: which names of the kernel (and, with allocation
 * tracking on, which lines) hold the allocated memory of each device, and,
 * after an out-of-memory error, why the request failed and what would fix it.
 *
 * Read with the kernel's `who` action; kernel/client.ts says when (only while
 * this tab is shown in the visible panel). Every string the kernel sends is
 * rendered as text.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { formatPercent, formatSize } from '../../present/format';
import { availability, deviceLabel } from '../../present/messages';
import { IWhoReport } from '../../protocol';
import { IGpuMemState, IWhoState } from '../../state';
import { ActionButton } from '../common/actionButton';
import { OutOfMemory } from './outOfMemory';
import { Message, NoDeviceMessage, TooOldMessage } from '../common/message';
import { IViewProps } from '../props';

/** Prefix of the owners a kept traceback holds (`traceback: frame: name`). */
const TRACEBACK_PREFIX = 'traceback:';

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
  return (
    <div
      className="jp-GpuMem-who"
      data-who={who.status}
      aria-busy={who.status === 'loading'}
    >
      <WhoControls {...props} />
      <WhoStatus who={who} trans={trans} />
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
              <WhoTable report={device.by_variable} trans={trans} />
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

/**
 * One report as a compact table: a row per owner or line with its share of
 * the allocated bytes as a small bar, then how much the names explain and the
 * kernel's notes.
 */
export function WhoTable(props: {
  report: IWhoReport;
  trans: TranslationBundle;
}): JSX.Element {
  const { report, trans } = props;
  const byLine = report.by === 'line';
  const title = byLine ? trans.__('Lines') : trans.__('Owners');
  const allocated = report.allocated;
  const share = (bytes: number) =>
    allocated > 0 ? Math.min(1, Math.max(0, bytes / allocated)) : 0;
  return (
    <div className="jp-GpuMem-whoReport" data-by={report.by}>
      <table className="jp-GpuMem-whoTable" data-by={report.by}>
        <caption className="jp-GpuMem-whoCaption">{title}</caption>
        <thead>
          <tr>
            <th scope="col">{byLine ? trans.__('Line') : trans.__('Name')}</th>
            <th scope="col" className="jp-GpuMem-whoBytes">
              {trans.__('Size')}
            </th>
          </tr>
        </thead>
        <tbody>
          {report.rows.map((row, i) => (
            <tr
              key={`${i}-${row.key}`}
              className={`jp-GpuMem-whoRow jp-GpuMem-whoRow-${row.kind}`}
              data-key={row.key}
              data-kind={row.kind}
              data-bytes={row.bytes}
            >
              <td className="jp-GpuMem-whoName">
                <span className="jp-GpuMem-whoKey">{row.key}</span>
                {row.detail !== '' && (
                  <span className="jp-GpuMem-whoDetail">{row.detail}</span>
                )}
                {!byLine && row.site && (
                  <span className="jp-GpuMem-whoSite">
                    {trans.__('allocated at %1', row.site)}
                  </span>
                )}
                {row.example !== '' && row.example !== row.key && (
                  <span className="jp-GpuMem-whoExample">
                    {byLine ? row.example : trans.__('e.g. %1', row.example)}
                  </span>
                )}
                <span className="jp-GpuMem-share" aria-hidden="true">
                  <span
                    className="jp-GpuMem-shareFill"
                    style={{ width: `${(share(row.bytes) * 100).toFixed(2)}%` }}
                  />
                </span>
              </td>
              <td
                className="jp-GpuMem-whoBytes"
                title={trans._n(
                  '%2 of allocated, %1 block',
                  '%2 of allocated, %1 blocks',
                  row.blocks,
                  formatPercent(share(row.bytes))
                )}
              >
                {formatSize(row.bytes)}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      <p className="jp-GpuMem-whoExplained">{explainedText(report, trans)}</p>
      {report.outside_allocator > 0 && (
        <p className="jp-GpuMem-whoNote">
          {trans.__(
            "%1 more is outside PyTorch's allocator",
            formatSize(report.outside_allocator)
          )}
        </p>
      )}
      {report.notes.length > 0 && (
        <ul className="jp-GpuMem-whoNotes">
          {report.notes.map((note, i) => (
            <li key={i}>{note}</li>
          ))}
        </ul>
      )}
    </div>
  );
}

function explainedText(report: IWhoReport, trans: TranslationBundle): string {
  const allocated = report.allocated;
  if (allocated <= 0) {
    return trans.__('Nothing is allocated on this device.');
  }
  const explained = formatSize(report.explained);
  const total = formatSize(allocated);
  const percent = formatPercent(report.explained / allocated);
  return report.by === 'line'
    ? trans.__('lines explain %1 of %2 (%3)', explained, total, percent)
    : trans.__('names explain %1 of %2 (%3)', explained, total, percent);
}
