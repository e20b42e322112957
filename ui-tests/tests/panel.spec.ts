/**
 * The GPU memory panel in a real JupyterLab, against the real kernel side
 * (the jupyter_gpumem package the kernel imports).
 *
 * Registration (sidebar tab, palette), the "No kernel" and "not loaded"
 * states, Attach, then with figures: allocate, watch the bars move during a
 * long cell, press every button; the "Who holds it" tab against the
 * attribution recorded on a GPU (replay); a kernel restart, following the
 * active notebook. GPUMEM_UI_MODE says where the figures come from: a real
 * GPU, the replay backend (JUPYTER_GPUMEM_REPLAY), or neither (then only the
 * attach is checked).
 */
import { Browser, expect, Page, test } from '@playwright/test';
import * as fs from 'fs';
import * as path from 'path';

import {
  BODY,
  newPage,
  MODE,
  openNotebook,
  openPanel,
  PANEL,
  panelScreenshot,
  panelState,
  runCell,
  runCellAndWait,
  screenshot,
  setTheme as setLabTheme,
  statusLine,
  TOKEN,
  waitForKernelIdle,
  writeNotebook
} from './lab';

const NOTEBOOK = 'gpumem-ui.ipynb';

test.describe.configure({ mode: 'serial' });

let page: Page;

test.beforeAll(async ({ browser }: { browser: Browser }) => {
  page = await newPage(browser, NOTEBOOK, true);
});

test.afterAll(async () => {
  await page?.close();
});

/** Record every data-state the panel goes through, from now on. */
async function recordStates(): Promise<void> {
  await page.evaluate((selector: string) => {
    const w = window as any;
    w.__gpumemStates = [];
    const body = () => document.querySelector(selector);
    const note = () => {
      const state = body()?.getAttribute('data-state');
      const states: string[] = w.__gpumemStates;
      if (state && states[states.length - 1] !== state) {
        states.push(state);
      }
    };
    note();
    w.__gpumemObserver?.disconnect();
    w.__gpumemObserver = new MutationObserver(note);
    w.__gpumemObserver.observe(document.body, {
      subtree: true,
      attributes: true,
      attributeFilter: ['data-state'],
      childList: true
    });
    clearInterval(w.__gpumemPoll);
    w.__gpumemPoll = setInterval(note, 10);
    // Diagnostics only: the model's own states and the kernel's statuses.
    w.__gpumemDebug = [];
    const t0 = performance.now();
    const model = w.jupyterapp.pluginRegistry?._plugins?.get(
      'jupyter-gpumem:plugin'
    )?.service;
    model?.stateChanged.connect((_: any, s: any) =>
      w.__gpumemDebug.push(
        `${Math.round(performance.now() - t0)} model:${s.status.kind}`
      )
    );
    const kernel =
      w.jupyterapp.shell.currentWidget?.sessionContext?.session?.kernel;
    kernel?.statusChanged.connect((_: any, s: string) =>
      w.__gpumemDebug.push(`${Math.round(performance.now() - t0)} kernel:${s}`)
    );
  }, BODY);
}

async function recordedStates(): Promise<string[]> {
  return page.evaluate(() => (window as any).__gpumemStates ?? []);
}

test('the panel is in the right sidebar and its commands in the palette', async () => {
  await page.goto(`lab?token=${TOKEN}`);
  await page.waitForFunction(() => !!(window as any).jupyterapp, null, {
    timeout: 60_000
  });
  await page.locator('#jp-main-dock-panel').waitFor();
  const tab = page.locator(
    '.jp-SideBar.jp-mod-right .lm-TabBar-tab[title="GPU Memory"]'
  );
  await expect(tab).toHaveCount(1);

  await page.evaluate(() =>
    (window as any).jupyterapp.commands.execute(
      'apputils:activate-command-palette'
    )
  );
  const input = page.locator('.lm-CommandPalette-input');
  await expect(input).toBeVisible();
  await input.fill('GPU');
  const palette = page.locator('#command-palette');
  await expect(
    palette.locator('.lm-CommandPalette-header', { hasText: /gpu memory/i })
  ).toHaveCount(1);
  for (const label of [
    'Show GPU Memory',
    'Empty GPU Cache',
    'GPU Caching Allocator',
    'Reset GPU Memory Peak'
  ]) {
    await expect(
      palette.locator('.lm-CommandPalette-item', { hasText: label })
    ).toHaveCount(1);
  }
  await page.keyboard.press('Escape');

  // With no notebook open the panel still says something.
  await tab.click();
  await expect(page.locator(PANEL)).toBeVisible();
  await expect(page.locator(BODY)).toHaveAttribute('data-state', 'no_kernel');
  await expect(page.locator(`${PANEL} .jp-GpuMem-messageTitle`)).toHaveText(
    'No kernel'
  );
  await screenshot(page, 'no-kernel');
});

test('a kernel without the extension shows "not loaded" and Attach', async () => {
  await openNotebook(page, NOTEBOOK);
  await openPanel(page);
  await expect(page.locator(`${PANEL} .jp-GpuMem-source`)).toContainText(
    NOTEBOOK
  );
  // No reply to hello within ~1.5 s.
  await expect(page.locator(BODY)).toHaveAttribute('data-state', 'not_loaded', {
    timeout: 15_000
  });
  await expect(page.locator(`${PANEL} .jp-GpuMem-messageTitle`)).toHaveText(
    'The gpumem extension is not loaded in this kernel'
  );
  const attach = page.getByRole('button', { name: /^Attach/ });
  await expect(attach).toBeVisible();
  await expect(attach).toHaveAttribute('aria-disabled', 'false');
  await screenshot(page, 'not-loaded');
});

/**
 * How a test makes the kernel allocate: real tensors on a GPU, or nothing (the
 * replay backend moves by itself).
 */
interface IAllocator {
  mode: 'gpu' | 'replay';
  /** Code that allocates 1 GiB and keeps it in `x`. */
  allocate: string;
  /** Code that runs ~5 s, allocating as it goes. */
  longCell: string;
  /** Code that frees what the two above allocated. */
  free: string;
}

const ALLOCATORS: Record<IAllocator['mode'], IAllocator> = {
  gpu: {
    mode: 'gpu',
    allocate:
      "import torch, time\nx = torch.empty(2**30, dtype=torch.uint8, device='cuda')",
    longCell: [
      'xs = []',
      'for i in range(10):',
      "    xs.append(torch.empty(128 * 2**20, dtype=torch.uint8, device='cuda'))",
      '    time.sleep(0.5)'
    ].join('\n'),
    free: 'del x, xs'
  },
  replay: {
    mode: 'replay',
    allocate: 'import time',
    longCell: 'time.sleep(6)',
    free: 'pass'
  }
};

async function press(name: RegExp | string): Promise<string> {
  await page.getByRole('button', { name }).first().click();
  await expect(statusLine(page)).not.toHaveText(/^$|Waiting/, {
    timeout: 15_000
  });
  return (await statusLine(page).textContent()) ?? '';
}

function figureTests(allocator: IAllocator): void {
  const { mode } = allocator;

  test(`${mode}: an allocation shows on the bar and the trend`, async () => {
    await runCellAndWait(page, allocator.allocate);
    await expect(page.locator(BODY)).toHaveAttribute('data-state', 'ok', {
      timeout: 30_000
    });
    const allocated = page
      .locator(`${PANEL} .jp-GpuMem-segment-allocated`)
      .first();
    await expect(allocated).toBeVisible();
    if (mode !== 'replay') {
      await expect
        .poll(async () => Number(await allocated.getAttribute('data-bytes')))
        .toBeGreaterThanOrEqual(2 ** 30);
    }
    await expect(
      page.locator(`${PANEL} [data-figure="allocated"]`).first()
    ).toContainText(/B$/);
    await expect(
      page.locator(`${PANEL} .jp-GpuMem-trend svg`).first()
    ).toBeVisible();
    await screenshot(page, `${mode}-allocated`);
  });

  test(`${mode}: a worker process the cell forks shows with its own figures`, async () => {
    // The worker reports through the kernel's channel; its allocator is the
    // counting test backend (3 GiB on cuda:1), whatever the kernel's own is.
    await runCellAndWait(
      page,
      [
        '%%gpumem -q',
        'import os, time, multiprocessing as mp',
        "os.environ['JUPYTER_GPUMEM_BACKEND'] = 'jupyter_gpumem.testing.counting:backend'",
        'from jupyter_gpumem.testing import counting',
        'def worker(r):',
        "    os.environ['RANK'] = str(r)",
        '    counting.allocate(3 * 2**30, device=1)',
        '    time.sleep(120)',
        "w = mp.get_context('fork').Process(target=worker, args=(1,), daemon=True)",
        'w.start()',
        "os.environ.pop('JUPYTER_GPUMEM_BACKEND')"
      ].join('\n')
    );
    const row = page.locator(
      `${PANEL} .jp-GpuMem-workerList li[data-status="running"]`
    );
    await expect(row).toContainText(/rank 1 \(pid \d+\)/, { timeout: 15_000 });
    await expect(row).toContainText('cuda:1');
    await expect(row).toContainText('3.00 GiB');
    await screenshot(page, `${mode}-workers`);
    // Killed: no last report; the panel says so, and the next measured cell
    // reports it once, then it goes.
    await runCellAndWait(page, 'w.kill(); w.join()');
    await runCellAndWait(page, '%%gpumem -q\npass');
    await expect(page.locator(`${PANEL} .jp-GpuMem-workers`)).toHaveCount(0, {
      timeout: 15_000
    });
    // Gone from the live list, its figures stay in the History tab, under the
    // measured cell that last heard from it (the killed worker's last figures
    // came with the `pass` cell; it started too late in its own cell to report
    // there).
    const last = await executionCountOf('%%gpumem -q\npass');
    expect(last).toBeGreaterThan(0);
    const panel = page.locator(PANEL);
    await panel.getByRole('tab', { name: 'History' }).click();
    const workerRow = panel.locator(
      `.jp-GpuMem-historyWorker[data-cell="${last}"]`
    );
    await expect(workerRow).toHaveCount(1, { timeout: 15_000 });
    await expect(workerRow).toHaveAttribute(
      'data-worker',
      /^rank 1 \(pid \d+\)$/
    );
    await expect(workerRow).toHaveAttribute('data-index', '1');
    await expect(workerRow.locator('[data-figure="allocated"]')).toHaveText(
      'allocated 3.00 GiB → 3.00 GiB'
    );
    await expect(
      workerRow.locator('[data-figure="peak-allocated"]')
    ).toHaveText('peak 3.00 GiB');
    await expect(workerRow.locator('[data-figure="reserved"]')).toHaveText(
      'reserved 3.00 GiB'
    );
    await panel.getByRole('tab', { name: 'Overview' }).click();
  });

  test(`${mode}: the bars move while a long cell runs`, async () => {
    await runCell(page, allocator.longCell);
    await expect(page.locator(`${PANEL} .jp-GpuMem-busy`)).toBeVisible({
      timeout: 10_000
    });
    const seen = new Set<string>();
    const segments = page
      .locator(`${PANEL} .jp-GpuMem-device`)
      .first()
      .locator('.jp-GpuMem-segment');
    for (let i = 0; i < 16; i++) {
      seen.add(
        await segments.evaluateAll(nodes =>
          nodes.map(n => n.getAttribute('data-bytes')).join(',')
        )
      );
      if (i === 8) {
        await screenshot(page, `${mode}-long-cell`);
      }
      await page.waitForTimeout(250);
    }
    // Still running while we looked: the figures came over the comm.
    await expect(page.locator(`${PANEL} .jp-GpuMem-busy`)).toBeVisible();
    expect(seen.size).toBeGreaterThanOrEqual(2);
    await waitForKernelIdle(page);
  });

  test(`${mode}: buttons answer during a running cell and the kernel stays busy`, async () => {
    // Record the notebook kernel's status as JupyterLab sees it (what the busy
    // indicator shows), every 20 ms, while buttons are pressed during a cell.
    await runCell(page, "__import__('time').sleep(6)");
    await page.waitForFunction(
      () =>
        (window as any).jupyterapp.shell.currentWidget.sessionContext.session
          ?.kernel?.status === 'busy',
      null,
      { timeout: 10_000 }
    );
    await page.evaluate(() => {
      const w = window as any;
      const kernel =
        w.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
      w.__gpumemStatuses = [];
      w.__gpumemStatusTimer = setInterval(
        () => w.__gpumemStatuses.push(kernel.status),
        20
      );
    });
    const started = Date.now();
    expect(await press('Reset the peak counters')).toMatch(/[Pp]eak/);
    const firstAnswer = Date.now() - started;
    const dismiss = page.getByRole('button', { name: 'Dismiss the message' });
    if ((await dismiss.count()) > 0) {
      await dismiss.click();
    }
    expect(await press(/^Empty the cache/)).toMatch(
      /Released .* to the driver|Nothing to release/
    );
    await page.waitForTimeout(500);
    const statuses: string[] = await page.evaluate(() => {
      const w = window as any;
      clearInterval(w.__gpumemStatusTimer);
      return w.__gpumemStatuses;
    });
    // The cell (6 s) is still running: every status seen must be busy.
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(firstAnswer).toBeLessThan(2_000);
    expect(statuses.length).toBeGreaterThan(20);
    expect(new Set(statuses)).toEqual(new Set(['busy']));
    await waitForKernelIdle(page);
  });

  test(`${mode}: the whole panel with figures (panel-${mode}.png)`, async () => {
    // The picture of the README: light theme, bars, trend, buttons, no
    // leftover message; before the buttons change the figures.
    await expect(page.locator('body')).toHaveAttribute(
      'data-jp-theme-light',
      'true'
    );
    await expect(page.locator(BODY)).toHaveAttribute('data-state', 'ok');
    const dismiss = page.getByRole('button', { name: 'Dismiss the message' });
    if ((await dismiss.count()) > 0) {
      await dismiss.click();
    }
    await expect(statusLine(page)).toHaveText('');
    // Count the panel's requests from now on.
    await page.evaluate(() => {
      const w = window as any;
      const kernel =
        w.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
      w.__gpumemSent = [];
      kernel.anyMessage.connect((_: any, args: any) => {
        if (
          args.direction === 'send' &&
          args.msg.header.msg_type === 'gpumem_request'
        ) {
          w.__gpumemSent.push(args.msg.content.action);
        }
      });
    });
    const t0 = Date.now();
    // A trend longer than the lease of a subscription (60 s): the panel
    // renewed it, or the stream would have stopped.
    const span = () =>
      page.evaluate(() => {
        const model = (window as any).jupyterapp.pluginRegistry?._plugins?.get(
          'jupyter-gpumem:plugin'
        )?.service;
        const points = model?.state.process.history[0] ?? [];
        return points.length > 1
          ? points[points.length - 1].time - points[0].time
          : -1;
      });
    await expect
      .poll(span, { timeout: 90_000, intervals: [1000] })
      .toBeGreaterThanOrEqual(65);
    // Renewed every 20 s, with no re-subscribe loop (a comm closed under
    // the stream made one).
    const sent: string[] = await page.evaluate(
      () => (window as any).__gpumemSent
    );
    const subscribes = sent.filter(action => action === 'subscribe').length;
    const renewals = (Date.now() - t0) / 20_000;
    expect(subscribes).toBeGreaterThanOrEqual(Math.floor(renewals) - 1);
    expect(subscribes).toBeLessThanOrEqual(Math.ceil(renewals) + 1);
    expect(sent.filter(action => action !== 'subscribe')).toEqual([]);
    for (const selector of [
      '.jp-GpuMem-segment-allocated',
      '.jp-GpuMem-trend svg polyline',
      '.jp-GpuMem-controls button'
    ]) {
      await expect(page.locator(`${PANEL} ${selector}`).first()).toBeVisible();
    }
    await panelScreenshot(page, `panel-${mode}`);
  });

  test(`${mode}: every button answers in the status line`, async () => {
    await runCellAndWait(page, allocator.free);
    expect(await press(/^Empty the cache/)).toMatch(
      mode === 'replay'
        ? /Released .* to the driver|Nothing to release/
        : /Released .* to the driver/
    );
    await screenshot(page, `${mode}-emptied`);

    const off = page.getByRole('button', {
      name: 'Switch the caching allocator off'
    });
    if ((await off.getAttribute('aria-disabled')) === 'false') {
      expect(await press('Switch the caching allocator off')).toMatch(
        /Caching is off|Caching is still on|refused/
      );
      const on = page.getByRole('button', {
        name: 'Switch the caching allocator on'
      });
      if ((await on.count()) > 0) {
        await screenshot(page, `${mode}-caching-off`);
        expect(await press('Switch the caching allocator on')).toMatch(
          /Caching is on|Caching is still off|refused/
        );
      }
    }

    expect(
      await press('Reset the peak counters to the current figures')
    ).toMatch(/Peak reset|refused/);

    const input = page.getByRole('textbox', { name: 'Memory cap for GPU 0' });
    await input.fill('12XB');
    await input.press('Enter');
    await expect(statusLine(page)).toContainText('"XB" is not a unit');
    await screenshot(page, `${mode}-bad-cap`);

    await input.fill('0.5');
    await input.press('Enter');
    await expect(statusLine(page)).toHaveText(
      /Capped GPU 0 at .* \(50% of the device\)|refused/,
      {
        timeout: 15_000
      }
    );
    if (/Capped/.test((await statusLine(page).textContent()) ?? '')) {
      await expect(
        page.locator(`${PANEL} .jp-GpuMem-limit`).first()
      ).toBeVisible();
      await screenshot(page, `${mode}-capped`);
      expect(await press('Clear the memory cap of GPU 0')).toMatch(
        /Cap removed on GPU 0|refused/
      );
      await expect(page.locator(`${PANEL} .jp-GpuMem-limit`)).toHaveCount(0);
    }
    await screenshot(page, `${mode}-after-actions`);
  });

  test(`${mode}: the panel follows the dark theme`, async () => {
    await setTheme('JupyterLab Dark');
    await page.waitForTimeout(500);
    await screenshot(page, `${mode}-dark`);
    await setTheme('JupyterLab Light');
  });
}

/** Switch JupyterLab's theme (the page of these tests). */
async function setTheme(theme: 'JupyterLab Light' | 'JupyterLab Dark') {
  await setLabTheme(page, theme);
}

/**
 * What the replay kernel answers `who` from: recorded on an H200 beside the
 * replayed readings (tests/gpu/record_attribution.py); `cells.truth` holds the
 * bytes each owner and line really took.
 */
const ATTRIBUTION = process.env.JUPYTER_GPUMEM_REPLAY
  ? path.join(
      path.dirname(process.env.JUPYTER_GPUMEM_REPLAY),
      'attribution.json'
    )
  : '';

interface ITruth {
  owners: Record<string, number>;
  lines: Record<string, number>;
}

/** A size as the kernel writes it (jupyter_gpumem/units.py): "64.00 MiB". */
function kernelSize(bytes: number): string {
  const units: [string, number][] = [
    ['TiB', 2 ** 40],
    ['GiB', 2 ** 30],
    ['MiB', 2 ** 20],
    ['KiB', 2 ** 10]
  ];
  for (const [name, size] of units) {
    if (bytes >= size) {
      return `${(bytes / size).toFixed(2)} ${name}`;
    }
  }
  return `${bytes} B`;
}

/** Count the panel's `who` requests from now on. */
async function countWhoRequests(): Promise<void> {
  await page.evaluate(() => {
    const w = window as any;
    const kernel =
      w.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    w.__gpumemWho = 0;
    if (w.__gpumemWhoKernel !== kernel) {
      w.__gpumemWhoKernel = kernel;
      kernel.anyMessage.connect((_: any, args: any) => {
        if (
          args.direction === 'send' &&
          args.msg.header.msg_type === 'gpumem_request' &&
          args.msg.content.action === 'who'
        ) {
          w.__gpumemWho += 1;
        }
      });
    }
  });
}

async function whoRequests(): Promise<number> {
  return page.evaluate(() => (window as any).__gpumemWho);
}

function whoTests(): void {
  const panel = () => page.locator(PANEL);
  const who = () => page.locator(`${PANEL} .jp-GpuMem-who`);
  const table = (by: 'variable' | 'line') =>
    page.locator(`${PANEL} table.jp-GpuMem-whoTable[data-by="${by}"]`);
  const row = (by: 'variable' | 'line', key: string) =>
    table(by).locator(`tr[data-key="${key}"]`);
  const truth = (): ITruth =>
    JSON.parse(fs.readFileSync(ATTRIBUTION, 'utf8')).cells.truth;

  test('replay: Who holds it shows the recorded owners with their sizes', async () => {
    await countWhoRequests();
    const tab = panel().getByRole('tab', { name: 'Who holds it' });
    await expect(
      panel().getByRole('tab', { name: 'Overview' })
    ).toHaveAttribute('aria-selected', 'true');
    await tab.click();
    await expect(tab).toHaveAttribute('aria-selected', 'true');
    // Shown: read at once.
    await expect(who()).toHaveAttribute('data-who', 'ok');
    expect(await whoRequests()).toBe(1);
    // Refresh reads again.
    await panel()
      .getByRole('button', { name: /^Refresh/ })
      .click();
    await expect.poll(whoRequests).toBe(2);
    await expect(who()).toHaveAttribute('data-who', 'ok');
    await expect(
      row('variable', 'base').locator('.jp-GpuMem-whoBytes')
    ).toHaveText('64.00 MiB');
    await expect(
      row('variable', 'a').locator('.jp-GpuMem-whoBytes')
    ).toHaveText('3.00 MiB');
    // Every owner recorded, with the bytes its tensors took on the GPU.
    for (const [owner, bytes] of Object.entries(truth().owners)) {
      const [key, how] = owner.split('|');
      const found = row('variable', key).filter({
        has: page.locator('.jp-GpuMem-whoDetail', { hasText: how })
      });
      await expect(found, owner).toHaveCount(1);
      await expect(found).toHaveAttribute('data-bytes', String(bytes));
      await expect(found.locator('.jp-GpuMem-whoBytes')).toHaveText(
        kernelSize(bytes)
      );
    }
    await expect(
      page.locator(`${PANEL} .jp-GpuMem-whoExplained`).first()
    ).toHaveText(/^names explain .+ of 207\.05 MiB \(\d+(\.\d)?%\)$/);
    // No lines until tracking is on.
    await expect(table('line')).toHaveCount(0);
  });

  test('replay: with tracking on, the lines that allocated it appear', async () => {
    const track = panel().getByRole('checkbox', {
      name: 'Track allocation sites'
    });
    await expect(track).not.toBeChecked();
    // Keyboard-reachable: focus and press Space.
    await track.focus();
    await page.keyboard.press('Space');
    await expect(track).toBeChecked();
    await expect(statusLine(page)).toHaveText(
      'Allocation tracking is on (recorded data)'
    );
    await expect(table('line')).toBeVisible();
    for (const [key, bytes] of Object.entries(truth().lines)) {
      if ((await row('line', key).count()) === 0) {
        continue; // summed into the "N more lines" row
      }
      await expect(row('line', key)).toHaveAttribute(
        'data-bytes',
        String(bytes)
      );
    }
    await expect(row('line', 'In[8] line 1')).toHaveAttribute(
      'data-bytes',
      String(64 << 20)
    );
    await expect(
      row('line', 'In[8] line 1').locator('.jp-GpuMem-whoBytes')
    ).toHaveText('64.00 MiB');
    await expect(row('line', 'In[3] line 3')).toHaveCount(1);
    // The rows add up to the allocated bytes.
    const sum = await table('line')
      .locator('tbody tr')
      .evaluateAll(rows =>
        rows.reduce((s, r) => s + Number(r.getAttribute('data-bytes')), 0)
      );
    expect(sum).toBe(217111552);
    // With tracking, an owner says which line allocated it.
    await expect(row('variable', 'base')).toContainText(
      'allocated at In[8] line 1'
    );
  });

  test('replay: the out-of-memory block puts the fragmentation fix first', async () => {
    const oom = page.locator(`${PANEL} .jp-GpuMem-oom`);
    await expect(oom).toHaveCount(1);
    await expect(oom.locator('.jp-GpuMem-oomTitle')).toHaveText(
      'Out of memory on GPU 0'
    );
    const figure = (name: string) => oom.locator(`[data-figure="oom_${name}"]`);
    await expect(figure('requested')).toHaveText('128.00 MiB');
    await expect(figure('largest_free_block')).toHaveText('64.00 MiB');
    await expect(figure('free_pieces')).toHaveText('13 pieces, 531.98 MiB');
    await expect(figure('cap')).toHaveText('1.13 GiB');
    const fixes = oom.locator('.jp-GpuMem-fix');
    await expect(fixes.first()).toHaveAttribute('data-fix', 'fragmentation');
    await expect(fixes.first()).toContainText(
      'largest free block 64.00 MiB < 128.00 MiB requested'
    );
    // Judged against what the cell needed so far (the recording knows no more): it
    // covers that, "maybe".
    await expect(fixes.first().locator('.jp-GpuMem-fits')).toHaveText('maybe');
    await expect(figure('need')).toHaveText('128.00 MiB');
    // Best first: first steps, then fits, maybe, no (the advice to shrink the step last).
    const fits = await fixes.evaluateAll(items =>
      items.map(i => i.getAttribute('data-fits'))
    );
    expect(fits.length).toBeGreaterThan(1);
    const order = ['first', 'yes', 'maybe', 'no'];
    const ranks = fits.slice(0, -1).map(f => order.indexOf(f ?? ''));
    expect(ranks).toEqual([...ranks].sort((a, b) => a - b));
    // The pictures, light and dark.
    const dismiss = page.getByRole('button', { name: 'Dismiss the message' });
    if ((await dismiss.count()) > 0) {
      await dismiss.click();
    }
    await oom.scrollIntoViewIfNeeded();
    await panelScreenshot(page, 'panel-who-replay-oom');
    const top = () => page.locator(PANEL).evaluate(el => el.scrollTo(0, 0));
    await top();
    await panelScreenshot(page, 'panel-who-replay');
    await setTheme('JupyterLab Dark');
    await page.waitForTimeout(500);
    await top();
    await panelScreenshot(page, 'panel-who-replay-dark');
    await oom.scrollIntoViewIfNeeded();
    await panelScreenshot(page, 'panel-who-replay-oom-dark');
    await setTheme('JupyterLab Light');
  });

  test('replay: busy while a cell runs, the rows come back when it ends', async () => {
    await countWhoRequests();
    await runCell(page, 'import time; time.sleep(4)');
    await expect(page.locator(`${PANEL} .jp-GpuMem-busy`)).toBeVisible({
      timeout: 10_000
    });
    await panel()
      .getByRole('button', { name: /^Refresh/ })
      .click();
    const busy = page.locator(`${PANEL} .jp-GpuMem-whoBusy`);
    await expect(busy).toContainText('busy: available when the cell ends');
    await expect(who()).toHaveAttribute('data-who', 'busy');
    // The older reading stays, dimmed.
    await expect(page.locator(`${PANEL} .jp-GpuMem-whoData`)).toHaveClass(
      /jp-mod-stale/
    );
    // Answered busy at once (asked again when the panel's busy state
    // flickers: a heartbeat measured just before the cell started can arrive
    // after the cell's busy status).
    const asked = await whoRequests();
    expect(asked).toBeGreaterThanOrEqual(1);
    await page.locator(PANEL).evaluate(el => el.scrollTo(0, 0));
    await panelScreenshot(page, 'panel-who-replay-busy');
    await waitForKernelIdle(page);
    // Read again once the cell ended, with no press.
    await expect(who()).toHaveAttribute('data-who', 'ok');
    await expect(busy).toHaveCount(0);
    expect(await whoRequests()).toBeGreaterThan(asked);
    await expect(page.locator(`${PANEL} .jp-GpuMem-whoData`)).not.toHaveClass(
      /jp-mod-stale/
    );
    await expect(
      row('variable', 'base').locator('.jp-GpuMem-whoBytes')
    ).toHaveText('64.00 MiB');
  });

  test('replay: a measured cell reads again; the Overview tab reads nothing', async () => {
    await countWhoRequests();
    await runCellAndWait(page, '%%gpumem -q\nq = 1');
    await expect.poll(whoRequests).toBeGreaterThanOrEqual(1);
    await expect(who()).toHaveAttribute('data-who', 'ok');
    // Tracking off again: the lines go.
    const track = panel().getByRole('checkbox', {
      name: 'Track allocation sites'
    });
    await track.click();
    await expect(track).not.toBeChecked();
    await expect(table('line')).toHaveCount(0);
    await panel().getByRole('tab', { name: 'Overview' }).click();
    await countWhoRequests();
    await runCellAndWait(page, '%%gpumem -q\nq = 2');
    await page.waitForTimeout(1000);
    expect(await whoRequests()).toBe(0);
    await expect(
      page.locator(`${PANEL} .jp-GpuMem-segment-allocated`).first()
    ).toBeVisible();
  });
}

/** Where the notebook stands: its active cell and whether it is in view. */
async function notebookAt(): Promise<{
  active: number | null;
  inView: boolean;
}> {
  return page.evaluate(() => {
    const notebook = (window as any).jupyterapp.shell.currentWidget.content;
    const cell = notebook.activeCell;
    if (!cell) {
      return { active: null, inView: false };
    }
    const box = cell.node.getBoundingClientRect();
    const view = notebook.node.getBoundingClientRect();
    return {
      active: cell.model.executionCount ?? null,
      inView: box.height > 0 && box.bottom > view.top && box.top < view.bottom
    };
  });
}

/** Scroll the notebook to its last cell and make that one active. */
async function toLastCell(): Promise<void> {
  await page.evaluate(async () => {
    const notebook = (window as any).jupyterapp.shell.currentWidget.content;
    const last = notebook.widgets.length - 1;
    notebook.activeCellIndex = last;
    await notebook.scrollToItem(last, 'end');
  });
}

/** Execution count of the cell whose source starts with `start`. */
async function executionCountOf(start: string): Promise<number> {
  return page.evaluate((prefix: string) => {
    const notebook = (window as any).jupyterapp.shell.currentWidget.content;
    for (const cell of notebook.widgets) {
      if (cell.model.sharedModel.getSource().startsWith(prefix)) {
        return cell.model.executionCount;
      }
    }
    return -1;
  }, start);
}

/**
 * The History and Segments tabs, the [N] markers of the trend and the bar
 * scale, against the replay kernel (its segments: the H200 recording of
 * jupyter_gpumem/testing/recorded/attribution.json; its cells: the ones run here).
 */
function viewTests(): void {
  const panel = () => page.locator(PANEL);
  const tab = (name: string) => panel().getByRole('tab', { name });

  test('replay: measured cells fill the History tab; a row scrolls to its cell', async () => {
    // Enough cells that the first measured one scrolls out of view.
    await runCellAndWait(page, "%%gpumem -q\nmark = 'first'");
    for (let i = 0; i < 12; i++) {
      await runCellAndWait(page, `filler_${i} = ${i}`);
    }
    // The replayed figures move with time: cells that last a while show
    // changes (for the screenshot).
    for (const seconds of [1.5, 2]) {
      await runCellAndWait(page, `%%gpumem -q\ntime.sleep(${seconds})`);
    }
    await runCellAndWait(page, "%%gpumem -q\nmark = 'last'");
    const first = await executionCountOf("%%gpumem -q\nmark = 'first'");
    const last = await executionCountOf("%%gpumem -q\nmark = 'last'");
    expect(first).toBeGreaterThan(0);
    expect(last).toBeGreaterThan(first);
    await tab('History').click();
    const history = panel().locator('.jp-GpuMem-history');
    await expect(history).toHaveAttribute('data-reading', 'ok');
    // Each table (a device, or the cells that changed no memory) newest
    // first until sorted.
    const lastRow = panel().locator(
      `.jp-GpuMem-historyRow[data-cell="${last}"]`
    );
    await expect(lastRow).toHaveCount(1);
    const table = panel().locator('.jp-GpuMem-historyTable', {
      has: page.locator(`tr[data-cell="${last}"]`)
    });
    const rows = table.locator('.jp-GpuMem-historyRow');
    await expect(rows.first()).toHaveAttribute('data-cell', String(last));
    await expect(
      panel().locator(`.jp-GpuMem-historyRow[data-cell="${first}"]`)
    ).toContainText("mark = 'first'");
    // Sorting by cell flips the order (of every table).
    await table.locator('th[data-column="cell"] button').click();
    await expect(table.locator('th[data-column="cell"]')).toHaveAttribute(
      'aria-sort',
      'ascending'
    );
    const counts = (await rows.evaluateAll(els =>
      els.map(el => Number(el.getAttribute('data-cell')))
    )) as number[];
    expect(counts).toEqual([...counts].sort((a, b) => a - b));
    expect(counts[counts.length - 1]).toBe(last);
    await toLastCell();
    expect((await notebookAt()).active).not.toBe(first);
    await panel()
      .locator(`.jp-GpuMem-historyRow[data-cell="${first}"]`)
      .first()
      .click();
    await expect.poll(notebookAt).toEqual({ active: first, inView: true });
    await panelScreenshot(page, 'tab-history');
    await setTheme('JupyterLab Dark');
    await page.waitForTimeout(300);
    await panelScreenshot(page, 'tab-history-dark');
    await setTheme('JupyterLab Light');
  });

  test('replay: a [N] marker of the trend scrolls to its cell', async () => {
    const last = await executionCountOf("%%gpumem -q\nmark = 'last'");
    await tab('Overview').click();
    // The newest marker always carries its label.
    const marker = panel()
      .locator(`.jp-GpuMem-markerLabel[data-cell="${last}"]`)
      .first();
    await expect(marker).toHaveText(`[${last}]`);
    await expect(
      panel().locator('.jp-GpuMem-trendLegend').first()
    ).toContainText('Allocated');
    await page.evaluate(async () => {
      const notebook = (window as any).jupyterapp.shell.currentWidget.content;
      notebook.activeCellIndex = 0;
      await notebook.scrollToItem(0, 'start');
    });
    expect(await notebookAt()).not.toEqual({ active: last, inView: true });
    await marker.click();
    await expect.poll(notebookAt).toEqual({ active: last, inView: true });
    // A cell the notebook no longer has: said in the status line.
    await page.evaluate(() =>
      (window as any).jupyterapp.pluginRegistry?._plugins
        ?.get('jupyter-gpumem:plugin')
        ?.service.scrollToCell(99999)
    );
    await expect(statusLine(page)).toContainText(
      'Cell [99999] is not in the notebook'
    );
  });

  test('replay: the bars fit the kernel, and show the device total on request', async () => {
    await tab('Overview').click();
    const bar = panel().locator('.jp-GpuMem-bar').first();
    await expect(bar).toHaveAttribute('data-scale-total', 'false');
    await expect(panel().locator('.jp-GpuMem-scaleText').first()).toContainText(
      'fitted to this kernel'
    );
    const fitted = Number(
      await panel()
        .locator('.jp-GpuMem-segment-allocated')
        .first()
        .evaluate(el => parseFloat((el as HTMLElement).style.width))
    );
    await panel()
      .getByRole('button', { name: 'Show the device total' })
      .first()
      .click();
    await expect(bar).toHaveAttribute('data-scale-total', 'true');
    const whole = Number(
      await panel()
        .locator('.jp-GpuMem-segment-allocated')
        .first()
        .evaluate(el => parseFloat((el as HTMLElement).style.width))
    );
    // The recorded kernel holds under 1 GiB of a 140 GiB H200: a sliver of
    // the total (in % of the bar), a good part of the fitted bar.
    expect(whole).toBeLessThan(2);
    expect(fitted).toBeGreaterThan(20);
    await panel()
      .getByRole('button', { name: 'Fit to this kernel' })
      .first()
      .click();
    await expect(bar).toHaveAttribute('data-scale-total', 'false');
    const dismiss = page.getByRole('button', { name: 'Dismiss the message' });
    if ((await dismiss.count()) > 0) {
      await dismiss.click();
    }
    await panelScreenshot(page, 'tab-overview');
    await setTheme('JupyterLab Dark');
    await page.waitForTimeout(300);
    await panelScreenshot(page, 'tab-overview-dark');
    await setTheme('JupyterLab Light');
  });

  test('replay: the Segments tab draws the recorded fragmentation', async () => {
    await tab('Segments').click();
    const segments = panel().locator('.jp-GpuMem-segments');
    await expect(segments).toHaveAttribute('data-reading', 'ok');
    const rec = JSON.parse(fs.readFileSync(ATTRIBUTION, 'utf8'))
      .oom_fragmentation.truth;
    // The recording freed every other one of 16 blocks of 64 MiB.
    const biggest = panel().locator('.jp-GpuMem-segmentRow').first();
    await expect(biggest.locator('.jp-GpuMem-block')).toHaveCount(16);
    await expect(biggest.locator('.jp-GpuMem-block-piece')).toHaveCount(
      rec.pieces_64mib
    );
    await expect(
      panel().locator('.jp-GpuMem-block.jp-mod-largest')
    ).toHaveAttribute('data-bytes', String(rec.largest_free_block));
    await expect(panel().locator('[data-figure="largest"]')).toHaveText(
      '64.0 MiB'
    );
    // A block's title names the line that allocated it.
    await expect(
      biggest.locator('.jp-GpuMem-block-allocated').first()
    ).toHaveAttribute('title', /In\[14\] line 2/);
    await panelScreenshot(page, 'tab-segments');
    await setTheme('JupyterLab Dark');
    await page.waitForTimeout(300);
    await panelScreenshot(page, 'tab-segments-dark');
    await setTheme('JupyterLab Light');
    await tab('Overview').click();
  });
}

test.describe('with the kernel side', () => {
  test('Attach loads the extension and the panel shows figures', async () => {
    expect(await panelState(page)).toBe('not_loaded');
    // Keyboard-reachable: focus and press Enter.
    await page.getByRole('button', { name: /^Attach/ }).focus();
    await page.keyboard.press('Enter');
    await expect(page.locator(BODY)).not.toHaveAttribute(
      'data-state',
      /not_loaded|loading/,
      {
        timeout: 30_000
      }
    );
    const state = await panelState(page);
    expect([
      'ok',
      'no_torch',
      'cpu_only',
      'no_gpu',
      'not_initialized'
    ]).toContain(state);
    await screenshot(page, 'attached');
  });

  test.describe('with figures', () => {
    test.skip(MODE === 'none', 'no GPU and no replay fixture');
    figureTests(ALLOCATORS[MODE === 'gpu' ? 'gpu' : 'replay']);
  });

  test.describe('who holds it', () => {
    test.skip(
      MODE !== 'replay' || !fs.existsSync(ATTRIBUTION),
      'needs the replay kernel and jupyter_gpumem/testing/recorded/attribution.json'
    );
    whoTests();
  });

  test.describe('history, segments, markers and scale', () => {
    test.skip(
      MODE !== 'replay' || !fs.existsSync(ATTRIBUTION),
      'needs the replay kernel and jupyter_gpumem/testing/recorded/attribution.json'
    );
    viewTests();
  });
});

test('a kernel restart shows "restarting", then the panel reconnects', async () => {
  await recordStates();
  await page.evaluate(() =>
    (
      window as any
    ).jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()
  );
  await waitForKernelIdle(page);
  await expect(page.locator(BODY)).not.toHaveAttribute(
    'data-state',
    /restarting|loading/,
    {
      timeout: 15_000
    }
  );
  const states = await recordedStates();
  if (!states.includes('restarting')) {
    console.log(
      (await page.evaluate(() => (window as any).__gpumemDebug ?? [])).join(
        ' | '
      )
    );
  }
  expect(states).toContain('restarting');
  // Nothing loads the extension at start: the new process does not have it.
  expect(states[states.length - 1]).toBe('not_loaded');
  await screenshot(page, 'after-restart');
});

test('the panel follows the active notebook', async () => {
  writeNotebook('second.ipynb');
  await openNotebook(page, 'second.ipynb');
  await expect(page.locator(`${PANEL} .jp-GpuMem-source`)).toContainText(
    'second.ipynb'
  );
  await expect(page.locator(BODY)).toHaveAttribute('data-state', 'not_loaded', {
    timeout: 15_000
  });
  await page.evaluate((name: string) => {
    const shell = (window as any).jupyterapp.shell;
    for (const widget of shell.widgets('main')) {
      if (widget.context?.path === name) {
        shell.activateById(widget.id);
      }
    }
  }, NOTEBOOK);
  await expect(page.locator(`${PANEL} .jp-GpuMem-source`)).toContainText(
    NOTEBOOK
  );
  // Close both notebooks without the save prompts.
  await page.evaluate(() => {
    const shell = (window as any).jupyterapp.shell;
    for (const widget of Array.from(shell.widgets('main')) as any[]) {
      if (widget.context) {
        widget.dispose();
      }
    }
  });
  await expect(page.locator(BODY)).toHaveAttribute('data-state', 'no_kernel');
});
