/**
 * Sizes in the panel: one spelling (B, KiB, MiB, GiB; never kB, KB or GB) and
 * never wrapped ("64.00" above "MiB") nor spilling out of their cell, in the
 * narrowest sidebar the panel allows, on every tab that shows them. Against
 * the replay kernel: its Who tab has the recorded out-of-memory block.
 */
import { Browser, expect, Page, test } from '@playwright/test';

import {
  BODY,
  newPage,
  MODE,
  openNotebook,
  openPanel,
  PANEL,
  runCellAndWait
} from './lab';

const NOTEBOOK = 'sizes.ipynb';

test.skip(MODE !== 'replay', 'needs the replay kernel (JUPYTER_GPUMEM_REPLAY)');
test.describe.configure({ mode: 'serial' });

let page: Page;

test.beforeAll(async ({ browser }: { browser: Browser }) => {
  page = await newPage(browser, NOTEBOOK);
  // Its own workspace: the default one is what other test files' Lab restores.
  await openNotebook(page, NOTEBOOK, 'sizes');
  await runCellAndWait(page, '%load_ext jupyter_gpumem');
  await runCellAndWait(page, '%%gpumem -q\nimport time; time.sleep(1)');
  await openPanel(page);
  await expect(page.locator(BODY)).toHaveAttribute('data-state', 'ok', {
    timeout: 20_000
  });
});

test.afterAll(async () => {
  await page?.close();
});

/** Where sizes are shown as figures. */
const SIZES = [
  '.jp-GpuMem-figures dd',
  '.jp-GpuMem-value',
  '.jp-GpuMem-num',
  '.jp-GpuMem-segmentSummary dd',
  '.jp-GpuMem-workerFigure',
  '.jp-GpuMem-whoBytes',
  '.jp-GpuMem-gpuBytes'
].join(', ');

/**
 * The sizes of the shown tab that wrap or spill out of their cell with the
 * panel at its min-width (240px).
 */
async function badSizes(): Promise<string[]> {
  return page.locator(PANEL).evaluate(async (root: HTMLElement, selector) => {
    const width = root.style.width;
    root.style.width = '240px';
    await new Promise(resolve => requestAnimationFrame(resolve));
    const lines = (el: Element) => {
      const range = document.createRange();
      range.selectNodeContents(el);
      return new Set(
        Array.from(range.getClientRects())
          .filter(r => r.width > 0)
          .map(r => Math.round(r.top))
      ).size;
    };
    const bad = Array.from(root.querySelectorAll(selector))
      .filter(el => /\d (B|KiB|MiB|GiB|TiB)$/.test(el.textContent ?? ''))
      .flatMap(el => {
        const text = el.textContent ?? '';
        const found: string[] = [];
        if (lines(el) > 1) {
          found.push(`wrapped: ${text}`);
        }
        if (el.tagName === 'TD' && el.scrollWidth > el.clientWidth + 1) {
          found.push(`spills: ${text}`);
        }
        return found;
      });
    root.style.width = width;
    return bad;
  }, SIZES);
}

async function showTab(name: string, ready: string): Promise<void> {
  await page.locator(PANEL).getByRole('tab', { name }).click();
  await expect(page.locator(`${PANEL} ${ready}`)).toBeVisible({
    timeout: 20_000
  });
}

for (const [tab, ready] of [
  ['Overview', '.jp-GpuMem-legend'],
  ['History', '.jp-GpuMem-history[data-reading="ok"]'],
  ['Segments', '.jp-GpuMem-segments[data-reading="ok"]'],
  ['Who holds it', '.jp-GpuMem-oom']
]) {
  test(`${tab}: sizes in KiB, MiB, GiB, each on one line`, async () => {
    await showTab(tab, ready);
    // At least one size checked on this tab.
    await expect(
      page
        .locator(PANEL)
        .locator(SIZES)
        .filter({ hasText: / (MiB|GiB)$/ })
    ).not.toHaveCount(0);
    expect(await page.locator(PANEL).innerText()).not.toMatch(
      /\d ?(kB|KB|MB|GB|TB)\b/
    );
    expect(await badSizes()).toEqual([]);
  });
}
