/**
 * The comm messages of a kernel with 8 GPUs (H200s, 140 GiB), fed to the
 * panel's store by the benchmark (bench.spec.ts) and the many-devices test
 * (manyDevices.spec.ts): samples whose figures change every time, and cells;
 * and a panel ready to be fed them.
 */
import { expect, Page } from '@playwright/test';

import {
  BODY,
  checkEnvironment,
  openNotebook,
  openPanel,
  runCellAndWait,
  writeNotebook
} from './lab';

export const GiB = 2 ** 30;
export const MiB = 2 ** 20;
export const DEVICES = 8;
export const INTERVAL_S = 0.5;
/** A measured cell every this many samples: 100 over 5 minutes of history. */
export const CELL_EVERY = 6;

/** formatBytes of labextension/src/present/format.ts, binary units. */
export function formatBytes(bytes: number): string {
  const names = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  const decimals = (v: number) => (v < 10 ? 2 : v < 100 ? 1 : 0);
  const sign = bytes < 0 ? '-' : '';
  let value = Math.abs(bytes);
  if (value < 1024) {
    return `${sign}${Math.round(value)} B`;
  }
  let unit = 0;
  while (value >= 1024 && unit < names.length - 1) {
    value /= 1024;
    unit += 1;
  }
  let text = value.toFixed(decimals(value));
  if (Number(text) >= 1024 && unit < names.length - 1) {
    value /= 1024;
    unit += 1;
    text = value.toFixed(decimals(value));
  }
  return `${sign}${text} ${names[unit]}`;
}

/**
 * Device `d` at sample `k`, shaped as labextension/test/fixtures.ts `device()`
 * (an H200, 140 GiB). Allocated saws between 20 + 4d and 60 + 4d GiB in steps
 * of 0.7 GiB, so every sample changes the figure each device shows.
 */
export function device(d: number, k: number): Record<string, unknown> {
  const allocated =
    Math.round((20 + 4 * d + ((7 * k + 13 * d) % 400) / 10) * GiB) +
    ((k * 37 + d) % 64) * MiB;
  const reserved = allocated + (2 + (k % 5)) * GiB + 20 * MiB;
  const peakAllocated = (60 + 4 * d) * GiB;
  return {
    index: d,
    name: 'NVIDIA H200',
    backend: 'cuda',
    initialized: true,
    allocated,
    reserved,
    active: allocated,
    requested: allocated - MiB,
    inactive_split: (20 + (k % 9) * 20) * MiB,
    peak_allocated: peakAllocated,
    peak_reserved: peakAllocated + 8 * GiB,
    device_allocs: 1000 + 12 * k,
    device_frees: 990 + 12 * k,
    alloc_retries: 0,
    ooms: 0,
    total: 140 * GiB,
    device_used: reserved + 1.5 * GiB,
    process_used: reserved + 0.5 * GiB,
    limit: null,
    error: null
  };
}

export function sample(k: number, t0: number): Record<string, unknown> {
  const devices = [];
  for (let d = 0; d < DEVICES; d++) {
    devices.push(device(d, k));
  }
  return {
    time: t0 + k * INTERVAL_S,
    state: 'ok',
    message: '',
    torch_version: '2.11.0',
    host_rss: 12 * GiB,
    caching: true,
    devices
  };
}

/** The measured cell that ends just after sample `k`. */
export function cell(
  k: number,
  t0: number,
  n: number
): Record<string, unknown> {
  const devices = [];
  for (let d = 0; d < DEVICES; d++) {
    devices.push({
      index: d,
      allocated_delta: (((n + d) % 7) - 3) * 256 * MiB,
      reserved_delta: ((n + d) % 3) * 512 * MiB,
      peak_allocated: (60 + 4 * d) * GiB
    });
  }
  return {
    execution_count: n,
    time: t0 + k * INTERVAL_S + INTERVAL_S / 2,
    wall_time: CELL_EVERY * INTERVAL_S - 0.1,
    failed: false,
    first_line: `loss = train_step(model, batch[${n}])`,
    devices
  };
}

/** Where the panel stands once its kernel's stream is stopped. */
export interface IPanelToFeed {
  commId: string;
  lastSeq: number;
  time: number;
  subscribed: boolean;
  jupyterlab: string;
}

/**
 * A notebook whose kernel has the extension loaded (replay mode: 1 device),
 * the panel open on it, then the kernel's stream stopped the way the panel
 * stops it when hidden (unsubscribe, no watchdog, no renewal), so that the
 * test can feed the model's store comm messages of its own. The comm
 * messages that still arrive from the kernel are counted in
 * `window.__gpumemBenchKernelComm` (none should).
 */
export async function panelToFeed(
  page: Page,
  notebook: string,
  workspace: string
): Promise<IPanelToFeed> {
  checkEnvironment();
  writeNotebook(notebook);
  await openNotebook(page, notebook, workspace);
  await openPanel(page);
  // The first hello goes unanswered; once the panel says so, the end of the
  // cell that loads the extension makes it greet the kernel again.
  await expect(page.locator(BODY)).toHaveAttribute('data-state', 'not_loaded', {
    timeout: 30_000
  });
  await runCellAndWait(page, '%load_ext jupyter_gpumem');
  await expect(page.locator(BODY)).toHaveAttribute('data-state', 'ok', {
    timeout: 30_000
  });
  await expect(page.locator(`${BODY} .jp-GpuMem-device`)).toHaveCount(1);
  // First let the subscribe that followed the hello come back, or it would
  // start the stream again.
  await page.waitForFunction(
    () => {
      // The kernel client's sample subscription (kernel/subscription.ts).
      const sub = (window as any).jupyterapp.pluginRegistry._plugins.get(
        'jupyter-gpumem:plugin'
      ).service._client._subscription;
      return sub._subscribed === true && sub._subscribing === 0;
    },
    null,
    { timeout: 30_000 }
  );
  return page.evaluate(async () => {
    const w = window as any;
    const model = w.jupyterapp.pluginRegistry._plugins.get(
      'jupyter-gpumem:plugin'
    ).service;
    model._client._subscription.stop();
    await new Promise(resolve => setTimeout(resolve, 1500));
    const kernel =
      w.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    w.__gpumemBenchKernelComm = 0;
    kernel.anyMessage.connect((_: unknown, args: any) => {
      if (
        args.direction === 'recv' &&
        args.msg.header.msg_type === 'comm_msg'
      ) {
        w.__gpumemBenchKernelComm += 1;
      }
    });
    const state = model.state;
    return {
      commId: state.process.commId as string,
      lastSeq: (state.process.lastSeq ?? 0) as number,
      time: state.process.sample.time as number,
      subscribed: model._client._subscription._subscribed as boolean,
      jupyterlab: w.jupyterapp.version as string
    };
  });
}
