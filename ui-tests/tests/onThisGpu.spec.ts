/**
 * The panel's "On this GPU" tab in a real JupyterLab, against the server's
 * real GPU table (api/gpumem/devices): real kernels, real PIDs, the real
 * process table and session manager. Only NVML is fake: run.sh points the
 * server at a file (GPUMEM_FAKE_NVML) that this test rewrites with the PIDs
 * of the kernels it starts, as tests/test_server_gpus.py does.
 *
 * Neither kernel loads the IPython extension: the tab reads the server only.
 */
import {
  APIRequestContext,
  Browser,
  expect,
  Page,
  test
} from '@playwright/test';
import * as fs from 'fs';

import {
  BODY,
  newPage,
  openNotebook,
  openPanel,
  PANEL,
  panelScreenshot,
  runCellAndWait,
  setTheme,
  TOKEN,
  writeNotebook
} from './lab';

const FAKE_NVML = process.env.GPUMEM_FAKE_NVML ?? '';
const GiB = 2 ** 30;
/** A workspace of its own: the default one stays as the other tests expect it. */
const WORKSPACE = 'gpumem-on-this-gpu';
/** Idle, and the one shut down from the tab. */
const OTHER = 'gpu-other.ipynb';
/** The notebook the panel follows (opened last). */
const FOLLOWED = 'gpu-followed.ipynb';

interface IKernel {
  notebook: string;
  id: string;
  pid: number;
}

/** The process name the process table shows, as NVML would name it. */
function comm(pid: number): string {
  return fs.readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
}

/** Rewrite the fake NVML: one H200 with these processes. */
function writeFakeNvml(processes: { pid: number; used: number }[]): void {
  const used = processes.reduce((sum, p) => sum + p.used, 0);
  const data = {
    driver: 'fake',
    devices: [
      {
        name: 'NVIDIA H200',
        uuid: 'GPU-00000000-0000-4000-8000-000000000200',
        total: 150109880320,
        used,
        processes: processes.map(p => ({ ...p, name: comm(p.pid) }))
      }
    ]
  };
  fs.writeFileSync(FAKE_NVML, JSON.stringify(data));
}

async function serverKernels(
  request: APIRequestContext
): Promise<{ id: string; execution_state: string }[]> {
  const response = await request.get('api/kernels', {
    headers: { Authorization: `token ${TOKEN}` }
  });
  expect(response.status()).toBe(200);
  return response.json();
}

/** The text of the newest execute_result of the active notebook. */
async function lastResult(page: Page, notebook: string): Promise<string> {
  return page.evaluate((name: string) => {
    const widget = (window as any).jupyterapp.shell.currentWidget;
    if (widget.context.path !== name) {
      throw new Error(`${widget.context.path} is active, not ${name}`);
    }
    const cells = widget.content.model.cells;
    for (let i = cells.length - 1; i >= 0; i--) {
      const outputs = cells.get(i).toJSON().outputs ?? [];
      const result = outputs.find(
        (o: any) => o.output_type === 'execute_result'
      );
      if (result) {
        return String(result.data['text/plain']);
      }
    }
    throw new Error(`no result in ${name}`);
  }, notebook);
}

/** Open a notebook, start its kernel and ask it for its PID. */
async function startKernel(page: Page, notebook: string): Promise<IKernel> {
  writeNotebook(notebook);
  await openNotebook(page, notebook, WORKSPACE);
  await runCellAndWait(page, 'import os; os.getpid()');
  const pid = Number(await lastResult(page, notebook));
  const id: string = await page.evaluate(
    () =>
      (window as any).jupyterapp.shell.currentWidget.sessionContext.session
        .kernel.id
  );
  return { notebook, id, pid };
}

test.describe('On this GPU', () => {
  test.describe.configure({ mode: 'serial' });
  test.skip(!FAKE_NVML, 'needs the fake NVML of ui-tests/run.sh');

  let page: Page;
  let other: IKernel;
  let followed: IKernel;
  const tabPanel = () => page.locator(`${PANEL} [data-tab="gpu"]`);
  const kernelRow = (k: IKernel) =>
    tabPanel().locator(`tr[data-kernel-id="${k.id}"]`);

  test.beforeAll(async ({ browser }: { browser: Browser }) => {
    page = await newPage(browser);
  });

  test.afterAll(async () => {
    if (!page) {
      return;
    }
    // Leave no kernel and no open notebook to the tests that follow.
    const response = await page.request.get('api/sessions', {
      headers: { Authorization: `token ${TOKEN}` }
    });
    for (const session of await response.json()) {
      if ([OTHER, FOLLOWED].includes(session.path)) {
        await page.request.delete(`api/sessions/${session.id}`, {
          headers: { Authorization: `token ${TOKEN}` }
        });
      }
    }
    await page.close();
  });

  test('On this GPU lists both notebooks and another process with their memory', async () => {
    other = await startKernel(page, OTHER);
    followed = await startKernel(page, FOLLOWED);
    expect(other.pid).toBeGreaterThan(0);
    expect(followed.pid).not.toBe(other.pid);
    // The fake NVML is the server's alone (run.sh): kernels read the real one.
    await runCellAndWait(
      page,
      "os.environ.get('JUPYTER_GPUMEM_FAKE_NVML', 'unset')"
    );
    expect(await lastResult(page, FOLLOWED)).toMatch(/^'(unset)?'$/);
    // The test runner stands for a process that is no kernel of this server.
    writeFakeNvml([
      { pid: other.pid, used: 2 * GiB },
      { pid: followed.pid, used: 5 * GiB },
      { pid: process.pid, used: 1 * GiB }
    ]);

    await openPanel(page);
    const tab = page.locator(PANEL).getByRole('tab', { name: 'On this GPU' });
    await tab.click();
    await expect(tab).toHaveAttribute('aria-selected', 'true');
    await expect(
      tabPanel().locator('.jp-GpuMem-gpuDevice .jp-GpuMem-deviceTitle')
    ).toContainText('NVIDIA H200');
    // The file may have changed within the server's 1 s cache: Refresh.
    await expect(async () => {
      await tabPanel()
        .getByRole('button', { name: /^Refresh/ })
        .click();
      await expect(kernelRow(followed)).toHaveCount(1, { timeout: 2000 });
    }).toPass({ timeout: 20_000 });
    await expect(tabPanel().locator('.jp-GpuMem-gpuUsage')).toHaveText(
      '8.00 GiB of 140 GiB used'
    );

    await expect(kernelRow(other).locator('.jp-GpuMem-gpuLabel')).toHaveText(
      OTHER
    );
    await expect(kernelRow(other).locator('.jp-GpuMem-gpuBytes')).toHaveText(
      '2.00 GiB'
    );
    await expect(kernelRow(followed).locator('.jp-GpuMem-gpuLabel')).toHaveText(
      FOLLOWED
    );
    await expect(kernelRow(followed).locator('.jp-GpuMem-gpuBytes')).toHaveText(
      '5.00 GiB'
    );
    // The followed notebook is marked, and never offered a shutdown.
    await expect(kernelRow(followed).locator('.jp-GpuMem-gpuThis')).toHaveText(
      'this notebook'
    );
    await expect(kernelRow(followed).getByRole('button')).toHaveCount(0);
    const runner = tabPanel().locator(`tr[data-pid="${process.pid}"]`);
    await expect(runner).toHaveAttribute('data-kind', 'other');
    await expect(runner.locator('.jp-GpuMem-gpuLabel')).toHaveText(
      comm(process.pid)
    );
    await expect(runner.locator('.jp-GpuMem-gpuBytes')).toHaveText('1.00 GiB');
    await expect(runner.locator('.jp-GpuMem-gpuState')).toHaveText(
      'other process'
    );
    // Largest first.
    await expect(tabPanel().locator('tbody tr .jp-GpuMem-gpuBytes')).toHaveText(
      ['5.00 GiB', '2.00 GiB', '1.00 GiB']
    );

    // The kernel's message above the tabs settled ("not loaded": the tab
    // needs no kernel extension).
    await expect(page.locator(BODY)).toHaveAttribute(
      'data-state',
      'not_loaded',
      { timeout: 15_000 }
    );
    await panelScreenshot(page, 'panel-gpu');
    await setTheme(page, 'JupyterLab Dark');
    await page.waitForTimeout(500);
    await expect(page.locator(BODY)).toHaveAttribute(
      'data-state',
      'not_loaded',
      { timeout: 15_000 }
    );
    await panelScreenshot(page, 'panel-gpu-dark');
    await setTheme(page, 'JupyterLab Light');
  });

  test('On this GPU shuts down an idle kernel of another notebook after asking', async () => {
    // The other notebook's kernel is idle for the server too.
    await expect
      .poll(
        async () =>
          (await serverKernels(page.request)).find(k => k.id === other.id)
            ?.execution_state
      )
      .toBe('idle');
    const before = (await serverKernels(page.request)).map(k => k.id);
    expect(before).toEqual(expect.arrayContaining([other.id, followed.id]));
    await expect(kernelRow(other)).toHaveAttribute('data-activity', 'idle');
    await expect(kernelRow(other).locator('.jp-GpuMem-gpuActivity')).toHaveText(
      /^idle \d+ (s|min)$/
    );
    const shutDown = kernelRow(other).getByRole('button', {
      name: `Shut down the kernel of ${OTHER}`
    });

    // Asked first: Cancel leaves the kernel running.
    await shutDown.click();
    const dialog = page.locator('.jp-Dialog');
    await expect(dialog).toBeVisible();
    await expect(dialog.locator('.jp-Dialog-header')).toHaveText(
      `Shut down the kernel of ${OTHER}?`
    );
    await expect(dialog.locator('.jp-Dialog-body')).toContainText(
      `${OTHER} holds 2.00 GiB on this GPU and is idle`
    );
    await dialog.getByRole('button', { name: 'Cancel' }).click();
    await expect(dialog).toHaveCount(0);
    await page.waitForTimeout(1000);
    expect((await serverKernels(page.request)).map(k => k.id)).toEqual(
      expect.arrayContaining([other.id, followed.id])
    );

    // Accepted: exactly that kernel goes.
    await shutDown.click();
    await expect(dialog).toBeVisible();
    await dialog.getByRole('button', { name: 'Shut down' }).click();
    await expect(dialog).toHaveCount(0);
    await expect
      .poll(async () => (await serverKernels(page.request)).map(k => k.id))
      .not.toContain(other.id);
    const after = (await serverKernels(page.request)).map(k => k.id).sort();
    expect(after).toEqual(before.filter(id => id !== other.id).sort());
    expect(after).toContain(followed.id);
    await expect(
      tabPanel().locator('.jp-GpuMem-gpuMeta[role="status"]')
    ).toHaveText(`Shut down the kernel of ${OTHER}`);

    // NVML still names its PID (the fake file was not changed): the process
    // is gone, so the row says ended, no longer a notebook.
    await expect(async () => {
      await tabPanel()
        .getByRole('button', { name: /^Refresh/ })
        .click();
      await expect(kernelRow(other)).toHaveCount(0, { timeout: 2000 });
    }).toPass({ timeout: 20_000 });
    await expect(
      tabPanel().locator(`tr[data-pid="${other.pid}"]`)
    ).toHaveAttribute('data-kind', 'ended');
    await expect(kernelRow(followed)).toHaveCount(1);
  });
});
