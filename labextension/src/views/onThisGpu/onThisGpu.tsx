/**
 * The "On this GPU" tab: every process on the server's GPUs, as notebooks
 * where they are kernels of this server, with their memory and how long they
 * have been idle; an idle kernel of another notebook can be shut down.
 *
 * Read from the server's REST API (server/gpuTable.ts), not from a kernel:
 * it works for kernels that never loaded the IPython extension. Read when the
 * tab is shown, on Refresh, and every 5 s while the panel is visible
 * (server/gpuTablePoll.ts). Every
 * string from the server (notebook paths, process names) is rendered as text.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { formatBytes } from '../../present/format';
import { activityText, IKernelRow } from '../../server/gpuRows';
import { fetchGpuTable } from '../../server/gpuTable';
import { pollGpuTable, stopPoll } from '../../server/gpuTablePoll';
import { IServerApi } from '../../server/serverApi';
import { GpuTableView, IGpuTableReading, IShutdownState } from './gpuTableView';
import { IViewProps } from '../props';

export const INITIAL_READING: IGpuTableReading = {
  table: null,
  error: null,
  fetchedAt: null,
  reading: false,
  shutdown: null
};

/**
 * Ask before shutting the kernel of another notebook down, then shut it down
 * through JupyterLab. 'cancelled' when the user said no.
 */
export async function confirmAndShutDown(
  server: IServerApi,
  row: IKernelRow,
  trans: TranslationBundle,
  onAccepted: () => void = () => undefined
): Promise<'cancelled' | 'done'> {
  const accepted = await server.confirm({
    title: trans.__('Shut down the kernel of %1?', row.label),
    body: trans.__(
      '%1 holds %2 on this GPU and is %3. Shutting its kernel down frees that memory; its variables are lost, the notebook file stays.',
      row.label,
      formatBytes(row.bytes),
      activityText(row.activity, trans)
    ),
    accept: trans.__('Shut down')
  });
  if (!accepted) {
    return 'cancelled';
  }
  onAccepted();
  await server.shutdownKernel(row.kernelId);
  return 'done';
}

/**
 * The tab. While it is mounted (selected) it reads the server's table.
 */
export function OnThisGpu(props: IViewProps): JSX.Element {
  const { model, state, trans } = props;
  const server = model.server;
  const [reading, setReading] =
    React.useState<IGpuTableReading>(INITIAL_READING);
  // Reads are numbered: a reply older than the one shown is dropped; none is
  // applied once the tab is closed.
  const started = React.useRef(0);
  const applied = React.useRef(0);
  const inFlight = React.useRef(0);
  const mounted = React.useRef(false);

  const read = React.useCallback(async () => {
    if (!server) {
      return;
    }
    const mine = ++started.current;
    inFlight.current += 1;
    setReading(r => ({ ...r, reading: true }));
    const result = await fetchGpuTable(server.settings);
    inFlight.current -= 1;
    if (!mounted.current || mine < applied.current) {
      return;
    }
    applied.current = mine;
    const reading = inFlight.current > 0;
    setReading(r =>
      result.ok
        ? {
            ...r,
            table: result.table,
            error: null,
            fetchedAt: Date.now(),
            reading
          }
        : { ...r, error: result.error, fetchedAt: Date.now(), reading }
    );
  }, [server]);

  React.useEffect(() => {
    mounted.current = true;
    void read();
    const poll = pollGpuTable({
      read,
      visible: () => model.visible,
      inFlight: () => inFlight.current
    });
    return () => {
      stopPoll(poll);
      mounted.current = false;
    };
  }, [read, model]);

  const shutDown = React.useCallback(
    async (row: IKernelRow) => {
      if (!server) {
        return;
      }
      const shutdown = (
        status: IShutdownState['status'],
        error: string | null = null
      ) =>
        setReading(r => ({
          ...r,
          shutdown: { kernelId: row.kernelId, label: row.label, status, error }
        }));
      try {
        const outcome = await confirmAndShutDown(server, row, trans, () =>
          shutdown('running')
        );
        if (outcome === 'cancelled') {
          return;
        }
        shutdown('done');
      } catch (reason) {
        shutdown(
          'error',
          reason instanceof Error ? reason.message : String(reason)
        );
      }
      await read();
    },
    [server, trans, read]
  );

  return (
    <GpuTableView
      reading={reading}
      connected={server !== null}
      followedKernelId={state.kernelId}
      trans={trans}
      onRefresh={() => void read()}
      onShutDown={row => void shutDown(row)}
    />
  );
}
