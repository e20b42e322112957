/**
 * The status bar item and the replay banner in a real JupyterLab, against the
 * replay kernel (allocator readings recorded on an H200, JUPYTER_GPUMEM_REPLAY):
 * the item shows the replayed kernel's figures with the panel closed, the
 * same figures as the panel once it is open, opens the panel on a click,
 * warns near the cap and hides with the `statusBar` setting; the panel's
 * banner names the GPU and torch of the recording.
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
  runCellAndWait,
  SCREENSHOTS,
  setSetting,
  setTheme,
  statusItem,
  statusLine
} from './lab';
import { formatBytes } from './eightGpus';

const NOTEBOOK = 'status-bar.ipynb';
const FIXTURE = process.env.JUPYTER_GPUMEM_REPLAY ?? '';

test.skip(
  MODE !== 'replay' || !fs.existsSync(FIXTURE),
  'needs the replay kernel (JUPYTER_GPUMEM_REPLAY)'
);
test.describe.configure({ mode: 'serial' });

/** The recording the kernel replays: where, and its figures frame by frame. */
interface IRecording {
  gpu: string;
  torch: string;
  /** Every "allocated / reserved" of device 0 the replay can show. */
  figures: Set<string>;
}

function recording(): IRecording {
  const data = JSON.parse(fs.readFileSync(FIXTURE, 'utf8'));
  const figures = new Set<string>();
  for (const frame of data.timeline) {
    const stats = frame.devices[0].memory_stats;
    figures.add(
      `${formatBytes(stats['allocated_bytes.all.current'])} / ${formatBytes(
        stats['reserved_bytes.all.current']
      )}`
    );
  }
  return { gpu: data.meta.device, torch: data.meta.torch, figures };
}

let page: Page;

test.beforeAll(async ({ browser }: { browser: Browser }) => {
  page = await newPage(browser, NOTEBOOK);
  // Its own workspace: the default one is what other test files' Lab restores.
  await openNotebook(page, NOTEBOOK, 'status-bar');
  await closeSidebar();
});

test.afterAll(async () => {
  await page?.close();
});

/** Close the right sidebar, and with it the panel. */
async function closeSidebar(): Promise<void> {
  await page.evaluate(() => (window as any).jupyterapp.shell.collapseRight());
  await expect(page.locator(PANEL)).toBeHidden();
}

/** Count the panel's requests to the kernel from now on, by action. */
async function countRequests(): Promise<() => Promise<string[]>> {
  await page.evaluate(() => {
    const w = window as any;
    const kernel =
      w.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    w.__gpumemSent = [];
    if (!w.__gpumemCounting) {
      w.__gpumemCounting = true;
      kernel.anyMessage.connect((_: any, args: any) => {
        if (
          args.direction === 'send' &&
          args.msg.header.msg_type === 'gpumem_request'
        ) {
          w.__gpumemSent.push(args.msg.content.action);
        }
      });
    }
  });
  return () => page.evaluate(() => (window as any).__gpumemSent as string[]);
}

test('with the panel closed, the status bar shows the replayed figures', async () => {
  const rec = recording();
  // A kernel without the extension: nothing in the status bar.
  await page.waitForTimeout(3000);
  await expect(statusItem(page)).toHaveCount(0);
  // Loading it (the cell names gpumem) brings the figures, panel still closed.
  await runCellAndWait(page, '%load_ext jupyter_gpumem');
  // the first reading comes with the kernel's first poll after the load: 15 s on a busy
  // 2-core machine
  await expect(statusItem(page)).toBeVisible({ timeout: 60_000 });
  await expect(page.locator(PANEL)).toBeHidden();
  const text = (await statusItem(page).textContent()) ?? '';
  const match = /^GPU (.+ \/ .+) \(replay\)$/.exec(text);
  expect(match, text).not.toBeNull();
  // Figures of the recording's device 0, as the fixture has them.
  expect([...rec.figures]).toContain(match![1]);
  // The tooltip explains the figures and where they were recorded.
  const title = (await statusItem(page).getAttribute('title')) ?? '';
  expect(title).toContain('Allocated');
  expect(title).toContain("PyTorch's caching allocator");
  expect(title).toContain(rec.gpu);
  expect(title).toContain(rec.torch);
  await expect(statusItem(page)).toHaveAttribute('data-replay', 'true');
  // Its cost with the panel closed: one `sample` every 5 s, nothing else.
  const sent = await countRequests();
  await page.waitForTimeout(11_000);
  const actions = await sent();
  expect(actions.filter(a => a !== 'sample')).toEqual([]);
  expect(actions.length).toBeGreaterThanOrEqual(1);
  expect(actions.length).toBeLessThanOrEqual(3);
  fs.mkdirSync(SCREENSHOTS, { recursive: true });
  await page
    .locator('#jp-main-statusbar')
    .screenshot({ path: path.join(SCREENSHOTS, 'status-bar.png') });
});

test('a click opens the panel, which shows the same figures', async () => {
  await statusItem(page).click();
  await expect(page.locator(PANEL)).toBeVisible();
  await expect(page.locator(BODY)).toHaveAttribute('data-state', 'ok', {
    timeout: 20_000
  });
  // Both drawn from the same sample: equal once both have drawn it (the
  // replay moves every 0.1 s, the stream every 0.5 s).
  const pair = () =>
    page.evaluate((panel: string) => {
      const figure = (name: string) =>
        document
          .querySelector(`${panel} [data-figure="${name}"]`)
          ?.textContent?.trim() ?? '';
      const item = document
        .querySelector('#jp-main-statusbar .jp-GpuMem-statusItem')
        ?.textContent?.trim();
      return {
        item,
        panel: `GPU ${figure('allocated')} / ${figure('reserved')} (replay)`
      };
    }, PANEL);
  await expect
    .poll(
      async () => {
        const { item, panel } = await pair();
        return item === panel;
      },
      { timeout: 15_000, intervals: [50] }
    )
    .toBe(true);
});

test('the replay banner names the GPU and torch of the recording', async () => {
  const rec = recording();
  const banner = page.locator(`${PANEL} .jp-GpuMem-replayBanner`);
  await expect(banner).toBeVisible();
  await expect(banner).toContainText(/replay/i);
  await expect(banner).toContainText(rec.gpu);
  await expect(banner).toContainText(rec.torch);
  // At the top: above the panel's title.
  const bannerBox = await banner.boundingBox();
  const titleBox = await page
    .locator(`${PANEL} .jp-GpuMem-title`)
    .boundingBox();
  expect(bannerBox!.y).toBeLessThan(titleBox!.y);
  await panelScreenshot(page, 'replay-banner');
  await setTheme(page, 'JupyterLab Dark');
  await page.waitForTimeout(300);
  await panelScreenshot(page, 'replay-banner-dark');
  await setTheme(page, 'JupyterLab Light');
});

test('near the cap, the item takes the warning colour', async () => {
  await expect(statusItem(page)).toHaveAttribute('data-near', 'none');
  // A cap below what the recording reserves: reserved is over 90 % of it.
  const input = page.getByRole('textbox', { name: 'Memory cap for GPU 0' });
  await input.fill('256 MiB');
  await input.press('Enter');
  await expect(statusLine(page)).toHaveText(/Capped GPU 0|refused/, {
    timeout: 15_000
  });
  test.skip(
    !/Capped/.test((await statusLine(page).textContent()) ?? ''),
    'the kernel refused the cap'
  );
  await expect(statusItem(page)).toHaveAttribute('data-near', 'cap');
  await expect(statusItem(page)).toHaveClass(/jp-mod-warn/);
  // The theme's warning colour, not a colour of ours.
  const colours = await statusItem(page).evaluate(el => ({
    item: getComputedStyle(el).color,
    warn: (() => {
      const probe = document.createElement('span');
      probe.style.color = 'var(--jp-warn-color0)';
      document.body.appendChild(probe);
      const colour = getComputedStyle(probe).color;
      probe.remove();
      return colour;
    })()
  }));
  expect(colours.item).toBe(colours.warn);
  expect(await statusItem(page).getAttribute('title')).toContain(
    'Near the cap'
  );
  await page
    .getByRole('button', { name: 'Clear the memory cap of GPU 0' })
    .first()
    .click();
  await expect(statusItem(page)).toHaveAttribute('data-near', 'none', {
    timeout: 15_000
  });
});

test('the statusBar setting hides the item, and nothing is read for it', async () => {
  test.skip(
    !(await setSetting(page, 'statusBar', false)),
    'no access to the setting registry'
  );
  await expect(statusItem(page)).toBeHidden();
  // With the panel closed too, the kernel hears nothing.
  await closeSidebar();
  const sent = await countRequests();
  await page.waitForTimeout(8000);
  expect(await sent()).toEqual([]);
  await setSetting(page, 'statusBar', true);
  await expect(statusItem(page)).toBeVisible({ timeout: 15_000 });
});
