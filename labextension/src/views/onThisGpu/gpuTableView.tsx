/**
 * What the "On this GPU" tab draws for one reading of the server's table:
 * per GPU its notebooks (this one marked), their children and the other
 * processes, with memory and idle time, and the last shutdown's outcome. No
 * hooks: tests render it as a function. Every string from the server is
 * rendered as text.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { formatBytes } from '../../present/format';
import { deviceLabel } from '../../present/messages';
import {
  activityText,
  GpuRow,
  gpuTableView,
  IDeviceRows,
  IKernelRow,
  IProcessRow,
  IReportedRow,
  IUnseenRow
} from '../../server/gpuRows';
import {
  gpuTableErrorText,
  IGpuTable,
  IGpuTableError
} from '../../server/gpuTable';
import { Message } from '../common/message';

/** The last reading of the table, and the last shutdown. */
export interface IGpuTableReading {
  /** The last table read; kept (dimmed) when a later read fails. */
  table: IGpuTable | null;
  /** Why the last read failed; null after a good one. */
  error: IGpuTableError | null;
  /** When the last read ended, ms since the epoch. */
  fetchedAt: number | null;
  /** A read is under way. */
  reading: boolean;
  shutdown: IShutdownState | null;
}

export interface IShutdownState {
  kernelId: string;
  label: string;
  status: 'running' | 'done' | 'error';
  error: string | null;
}

export interface IGpuTableViewProps {
  reading: IGpuTableReading;
  /** The panel has a server API (false in other front ends). */
  connected: boolean;
  /** The kernel of the notebook the panel follows. */
  followedKernelId: string | null;
  trans: TranslationBundle;
  onRefresh: () => void;
  onShutDown: (row: IKernelRow) => void;
}

/**
 * What the tab shows for one reading. No hooks: tests render it as a
 * function. Never blank: each state has its message.
 */
export function GpuTableView(props: IGpuTableViewProps): JSX.Element {
  const { reading, connected, trans } = props;
  if (!connected) {
    return (
      <div className="jp-GpuMem-gpu" data-gpu="no_server">
        <Message
          title={trans.__('No connection to the Jupyter server')}
          detail={trans.__(
            'This tab reads the GPUs from the server this page came from.'
          )}
        />
      </div>
    );
  }
  const { table, error } = reading;
  const status = error ? 'error' : table ? 'ok' : 'loading';
  return (
    <div
      className="jp-GpuMem-gpu"
      data-gpu={status}
      aria-busy={reading.reading}
    >
      <div
        className="jp-GpuMem-controls jp-GpuMem-gpuControls"
        role="group"
        aria-label={trans.__('On this GPU')}
      >
        <button
          type="button"
          className="jp-GpuMem-button jp-mod-styled"
          aria-label={trans.__('Refresh: read the GPUs of the server now')}
          title={trans.__(
            "Read the server's GPUs and the processes on them again (every 5 s while shown)"
          )}
          onClick={() => props.onRefresh()}
        >
          {trans.__('Refresh')}
        </button>
        {reading.fetchedAt !== null && (
          <span className="jp-GpuMem-gpuMeta">
            {trans.__(
              'Read at %1',
              new Date(reading.fetchedAt).toLocaleTimeString()
            )}
          </span>
        )}
      </div>
      {status === 'loading' && (
        <Message title={trans.__('Reading the GPUs of the server…')} />
      )}
      {error && (
        <div className="jp-GpuMem-gpuError" role="alert">
          <Message {...gpuTableErrorText(error, trans)} />
        </div>
      )}
      <ShutdownLine {...props} />
      {table && (
        <div
          className={
            error ? 'jp-GpuMem-gpuData jp-mod-stale' : 'jp-GpuMem-gpuData'
          }
        >
          <TableBody {...props} table={table} />
        </div>
      )}
    </div>
  );
}

function ShutdownLine(props: IGpuTableViewProps): JSX.Element | null {
  const { reading, trans } = props;
  const shutdown = reading.shutdown;
  if (!shutdown) {
    return null;
  }
  if (shutdown.status === 'error') {
    return (
      <div className="jp-GpuMem-gpuError" role="alert">
        <Message
          title={trans.__(
            'Shutting down the kernel of %1 failed',
            shutdown.label
          )}
          detail={shutdown.error ?? undefined}
        />
      </div>
    );
  }
  return (
    <p className="jp-GpuMem-gpuMeta" role="status">
      {shutdown.status === 'running'
        ? trans.__('Shutting down the kernel of %1…', shutdown.label)
        : trans.__('Shut down the kernel of %1', shutdown.label)}
    </p>
  );
}

function TableBody(
  props: IGpuTableViewProps & { table: IGpuTable }
): JSX.Element {
  const { table, followedKernelId, trans } = props;
  const view = gpuTableView(table, followedKernelId);
  if (view.kind === 'nvml_unavailable') {
    return (
      <Message
        title={trans.__('NVML is not available on the server')}
        detail={
          view.nvmlError ??
          trans.__('The server cannot read its GPUs (no NVIDIA driver?).')
        }
      />
    );
  }
  if (view.kind === 'no_gpu') {
    return (
      <Message
        title={trans.__('The server has no GPU')}
        detail={trans.__('NVML answers but lists no device.')}
      />
    );
  }
  return (
    <>
      {view.note !== null && (
        <div className="jp-GpuMem-gpuNote" data-namespace={view.namespace}>
          <Message
            title={trans.__('Processes are not matched with notebooks')}
            detail={view.note}
          />
        </div>
      )}
      {view.nvmlError !== null && (
        <p className="jp-GpuMem-gpuWarning" role="status">
          {trans.__('NVML failed in part: %1', view.nvmlError)}
        </p>
      )}
      {view.devices.map(device => (
        <DeviceTable key={device.index} {...props} device={device} />
      ))}
    </>
  );
}

function DeviceTable(
  props: IGpuTableViewProps & { device: IDeviceRows }
): JSX.Element {
  const { device, trans } = props;
  const label = deviceLabel(device.index, trans);
  const share =
    device.total > 0 ? Math.min(1, Math.max(0, device.used / device.total)) : 0;
  return (
    <section
      className="jp-GpuMem-gpuDevice"
      aria-label={trans.__('Processes on %1', label)}
      data-device={device.index}
    >
      <h3 className="jp-GpuMem-deviceTitle">
        <span>{label}</span>
        <span className="jp-GpuMem-deviceName">{device.name}</span>
        {device.cudaIndex !== device.index && (
          <span
            className="jp-GpuMem-gpuCuda"
            title={trans.__(
              "This device's index for the server's kernels (CUDA_VISIBLE_DEVICES)"
            )}
          >
            {device.cudaIndex === null
              ? trans.__('not visible to kernels')
              : trans.__('cuda:%1', device.cudaIndex)}
          </span>
        )}
      </h3>
      <p className="jp-GpuMem-gpuUsage">
        {trans.__(
          '%1 of %2 used',
          formatBytes(device.used),
          formatBytes(device.total)
        )}
        <span className="jp-GpuMem-share" aria-hidden="true">
          <span
            className="jp-GpuMem-shareFill"
            style={{ width: `${(share * 100).toFixed(2)}%` }}
          />
        </span>
      </p>
      {device.rows.length === 0 ? (
        <p className="jp-GpuMem-gpuEmpty">
          {trans.__('No process uses this GPU')}
        </p>
      ) : (
        <table className="jp-GpuMem-gpuTable">
          <thead>
            <tr>
              <th scope="col">{trans.__('Notebook or process')}</th>
              <th scope="col" className="jp-GpuMem-gpuBytes">
                {trans.__('Memory')}
              </th>
            </tr>
          </thead>
          <tbody>
            {device.rows.map(row => (
              <Row key={rowKey(row)} {...props} row={row} />
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}

function rowKey(row: GpuRow): string {
  switch (row.kind) {
    case 'kernel':
      return `k-${row.kernelId}`;
    case 'reported':
      return `r-${row.kernelId}`;
    case 'unseen':
      return 'unseen';
    default:
      return `p-${row.pid}`;
  }
}

function Row(props: IGpuTableViewProps & { row: GpuRow }): JSX.Element {
  const { row } = props;
  switch (row.kind) {
    case 'kernel':
      return <KernelRows {...props} row={row} />;
    case 'reported':
      return <ReportedRow {...props} row={row} />;
    case 'unseen':
      return <UnseenRow {...props} row={row} />;
    default:
      return <ProcessRow {...props} row={row} />;
  }
}

/**
 * A notebook named from its kernel's own figures (NVML's PIDs are foreign,
 * so no process is matched with it): what PyTorch reserves for it.
 */
function ReportedRow(
  props: IGpuTableViewProps & { row: IReportedRow }
): JSX.Element {
  const { row, trans } = props;
  return (
    <tr
      className={`jp-GpuMem-gpuRow jp-GpuMem-gpuRow-reported${row.thisNotebook ? ' jp-mod-this' : ''}`}
      data-kind="reported"
      data-kernel-id={row.kernelId}
      data-bytes={row.bytes}
    >
      <NameCell
        label={row.label}
        title={row.path ?? row.label}
        state={activityText(row.activity, trans)}
        stateClass="jp-GpuMem-gpuActivity"
        detail={trans.__(
          'as its kernel reports: PyTorch reserves %1, %2 allocated',
          formatBytes(row.bytes),
          formatBytes(row.allocated)
        )}
      >
        {row.thisNotebook && (
          <span className="jp-GpuMem-gpuThis">{trans.__('this notebook')}</span>
        )}
      </NameCell>
      <td className="jp-GpuMem-gpuBytes">{formatBytes(row.bytes)}</td>
    </tr>
  );
}

/** Memory no process NVML lists holds: processes outside this server. */
function UnseenRow(
  props: IGpuTableViewProps & { row: IUnseenRow }
): JSX.Element {
  const { row, trans } = props;
  return (
    <tr
      className="jp-GpuMem-gpuRow jp-GpuMem-gpuRow-unseen"
      data-kind="unseen"
      data-bytes={row.bytes}
    >
      <NameCell
        label={trans.__('Not visible from this server')}
        title={trans.__(
          'Used on the GPU, but by no process the driver lists here: processes outside this server’s PID namespace (another container, another user’s job)'
        )}
        state={trans.__('unseen processes')}
        detail={
          row.driverExcluded
            ? trans.__('the driver’s own reservation excluded')
            : trans.__('includes the driver’s own reservation')
        }
      />
      <td className="jp-GpuMem-gpuBytes">{formatBytes(row.bytes)}</td>
    </tr>
  );
}

/**
 * A row's name cell: the notebook or process, then its state (idle time,
 * busy, other process, ended) and PID on a second line; the sidebar is narrow.
 */
function NameCell(props: {
  label: string;
  title?: string;
  state: string;
  stateClass?: string;
  detail: string;
  /** Shown after the state line (Shut down). */
  action?: React.ReactNode;
  children?: React.ReactNode;
}): JSX.Element {
  return (
    <td className="jp-GpuMem-gpuName">
      <span className="jp-GpuMem-gpuLabel" title={props.title}>
        {props.label}
      </span>
      {props.children}
      <span className="jp-GpuMem-gpuDetail">
        <span className={`jp-GpuMem-gpuState ${props.stateClass ?? ''}`}>
          {props.state}
        </span>
        {props.detail !== '' && ` · ${props.detail}`}
      </span>
      {props.action}
    </td>
  );
}

function KernelRows(
  props: IGpuTableViewProps & { row: IKernelRow }
): JSX.Element {
  const { row, trans } = props;
  const detail =
    row.pid === null
      ? trans.__('kernel not on this GPU itself')
      : trans.__('kernel, PID %1', row.pid);
  return (
    <>
      <tr
        className={`jp-GpuMem-gpuRow jp-GpuMem-gpuRow-kernel${row.thisNotebook ? ' jp-mod-this' : ''}`}
        data-kind="kernel"
        data-kernel-id={row.kernelId}
        data-bytes={row.bytes}
        data-activity={row.activity.kind}
      >
        <NameCell
          label={row.label}
          title={row.path ?? row.label}
          state={activityText(row.activity, trans)}
          stateClass="jp-GpuMem-gpuActivity"
          detail={detail}
          action={
            row.canShutDown && (
              <button
                type="button"
                className="jp-GpuMem-button jp-mod-styled jp-GpuMem-shutDown"
                aria-label={trans.__('Shut down the kernel of %1', row.label)}
                title={trans.__(
                  'Shut this idle kernel down to free its GPU memory (asks first)'
                )}
                onClick={() => props.onShutDown(row)}
              >
                {trans.__('Shut down')}
              </button>
            )
          }
        >
          {row.thisNotebook && (
            <span className="jp-GpuMem-gpuThis">
              {trans.__('this notebook')}
            </span>
          )}
        </NameCell>
        <td className="jp-GpuMem-gpuBytes">{formatBytes(row.bytes)}</td>
      </tr>
      {row.children.map(child => (
        <tr
          key={child.pid}
          className="jp-GpuMem-gpuRow jp-GpuMem-gpuRow-child"
          data-kind="child"
          data-pid={child.pid}
          data-bytes={child.bytes}
        >
          <NameCell
            label={child.name ?? trans.__('PID %1', child.pid)}
            state={trans.__('child of %1', row.label)}
            detail={trans.__('PID %1', child.pid)}
          />
          <td className="jp-GpuMem-gpuBytes">{formatBytes(child.bytes)}</td>
        </tr>
      ))}
    </>
  );
}

function ProcessRow(
  props: IGpuTableViewProps & { row: IProcessRow }
): JSX.Element {
  const { row, trans } = props;
  // Without a name the label is the PID already.
  const pid = row.name === null ? '' : trans.__('PID %1', row.pid);
  const detail = [pid, row.user ?? ''].filter(s => s !== '').join(', ');
  return (
    <tr
      className={`jp-GpuMem-gpuRow jp-GpuMem-gpuRow-${row.role}`}
      data-kind={row.role}
      data-pid={row.pid}
      data-bytes={row.bytes}
    >
      <NameCell
        label={row.name ?? trans.__('PID %1', row.pid)}
        state={
          row.role === 'ended' ? trans.__('ended') : trans.__('other process')
        }
        detail={detail}
      />
      <td className="jp-GpuMem-gpuBytes">{formatBytes(row.bytes)}</td>
    </tr>
  );
}
