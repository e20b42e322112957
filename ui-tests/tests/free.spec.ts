/**
 * Free in the Who holds it tab, against the replay kernel (its attribution
 * recorded on an H200, jupyter_gpumem/testing/recorded/attribution.json): an
 * owner row's Free previews the plan under the row, Free it plays it on the
 * recording (nothing is measured there, and the panel says so) and the row
 * leaves the re-read table; the post-mortem's `del blocks` fix opens the same
 * preview. Keyboard only for the owner's flow; light and dark pictures.
 */
import { Browser, expect, Page, test } from '@playwright/test';

import {
  BODY,
  MODE,
  newPage,
  openNotebook,
  openPanel,
  PANEL,
  panelScreenshot,
  runCellAndWait,
  setTheme
} from './lab';

const NOTEBOOK = 'free.ipynb';

test.skip(MODE !== 'replay', 'needs the replay kernel (JUPYTER_GPUMEM_REPLAY)');
test.describe.configure({ mode: 'serial' });

let page: Page;

test.beforeAll(async ({ browser }: { browser: Browser }) => {
  page = await newPage(browser, NOTEBOOK, true);
  // Its own workspace: the default one is what other test files' Lab restores.
  await openNotebook(page, NOTEBOOK, 'free');
  await runCellAndWait(page, '%load_ext jupyter_gpumem');
  await openPanel(page);
  await expect(page.locator(BODY)).toHaveAttribute('data-state', 'ok', {
    timeout: 20_000
  });
});

test.afterAll(async () => {
  await page?.close();
});

const MiB = 1 << 20;
const panel = () => page.locator(PANEL);
const who = () => page.locator(`${PANEL} .jp-GpuMem-who`);
const owners = () =>
  page.locator(`${PANEL} table.jp-GpuMem-whoTable[data-by="variable"]`);
const row = (key: string) =>
  owners().locator(`tr.jp-GpuMem-whoRow[data-key="${key}"]`);
const freePanel = () => page.locator(`${PANEL} .jp-GpuMem-free`);

/** Count the panel's requests of `action` from now on. */
async function countRequests(action: string): Promise<void> {
  await page.evaluate((name: string) => {
    const w = window as any;
    const kernel =
      w.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    w.__gpumemCounts = { ...(w.__gpumemCounts ?? {}), [name]: 0 };
    if (w.__gpumemCountKernel !== kernel) {
      w.__gpumemCountKernel = kernel;
      kernel.anyMessage.connect((_: any, args: any) => {
        const msg = args.msg;
        if (
          args.direction === 'send' &&
          msg.header.msg_type === 'gpumem_request' &&
          msg.content.action in w.__gpumemCounts
        ) {
          w.__gpumemCounts[msg.content.action] += 1;
        }
      });
    }
  }, action);
}

async function requests(action: string): Promise<number> {
  return page.evaluate(
    (name: string) => (window as any).__gpumemCounts[name],
    action
  );
}

test('replay: Free on an owner previews, frees, and the row leaves the table', async () => {
  await panel().getByRole('tab', { name: 'Who holds it' }).click();
  await expect(who()).toHaveAttribute('data-who', 'ok');
  await expect(row('base')).toHaveAttribute('data-bytes', String(64 * MiB));
  // Every owner has Free; the memory no name reaches has none.
  await expect(row('a').getByRole('button', { name: /^Free a/ })).toHaveCount(
    1
  );
  await expect(
    owners()
      .locator('tr[data-kind="unreachable"]')
      .getByRole('button', { name: /^Free/ })
  ).toHaveCount(0);
  await countRequests('free');
  await countRequests('who');

  // Keyboard only: focus base's Free, Enter.
  const free = row('base').getByRole('button', { name: /^Free base/ });
  await free.focus();
  await page.keyboard.press('Enter');
  const preview = freePanel();
  await expect(preview).toHaveAttribute('data-free', 'preview');
  await expect(free).toHaveAttribute('aria-expanded', 'true');
  expect(await requests('free')).toBe(1);
  // Under base's row: what is let go, each with why and bytes; what comes back.
  await expect(
    owners().locator('tr.jp-GpuMem-freeRow[data-key="base"] .jp-GpuMem-free')
  ).toHaveCount(1);
  await expect(preview.locator('.jp-GpuMem-freeHeld')).toHaveText(
    'Holds 64.00 MiB on GPU 0'
  );
  const letGo = preview.locator('.jp-GpuMem-freeLetGo li');
  await expect(letGo).toHaveCount(2);
  await expect(letGo.nth(0)).toHaveText(
    /^del base\s*the name you gave\s*64\.00 MiB$/
  );
  await expect(letGo.nth(1)).toHaveText(
    /^del view\s*a part of base\s*64\.00 MiB$/
  );
  await expect(preview.locator('.jp-GpuMem-freeExpected')).toHaveText(
    'Expected back to the driver: 64.00 MiB on GPU 0'
  );
  await expect(preview.locator('.jp-GpuMem-freeNotes')).toContainText(
    'replayed on recorded data'
  );
  // A preview lets go of nothing: base is still in the table.
  await expect(row('base')).toHaveCount(1);
  // Free it took the focus when it appeared.
  const confirm = preview.getByRole('button', { name: 'Free it' });
  await expect(confirm).toBeFocused();
  await page.locator(PANEL).evaluate(el => el.scrollTo(0, 0));
  await panelScreenshot(page, 'panel-who-free-preview');
  await setTheme(page, 'JupyterLab Dark');
  await panelScreenshot(page, 'panel-who-free-preview-dark');
  await setTheme(page, 'JupyterLab Light');

  // (Switching the theme moved the focus: back to Free it.) Enter frees.
  await confirm.focus();
  await page.keyboard.press('Enter');
  await expect(freePanel()).toHaveAttribute('data-free', 'done');
  expect(await requests('free')).toBe(2);
  // The table reads again, without base; its result stays above it.
  await expect.poll(() => requests('who')).toBeGreaterThanOrEqual(1);
  await expect(who()).toHaveAttribute('data-who', 'ok');
  await expect(row('base')).toHaveCount(0);
  await expect(row('a')).toHaveAttribute('data-bytes', String(3 * MiB));
  await expect(freePanel().locator('.jp-GpuMem-freeName')).toHaveText(
    'Freed base'
  );
  // Nothing is measured on a replay: it says so rather than a number.
  await expect(freePanel().locator('.jp-GpuMem-freeReturned')).toHaveText(
    'GPU 0: nothing was measured'
  );
  await expect(
    page.locator(`${PANEL} .jp-GpuMem-whoExplained`).first()
  ).toHaveText(/^names explain .+ of 143\.05 MiB \(\d+(\.\d)?%\)$/);
  await panelScreenshot(page, 'panel-who-free-done');
  // Close has the focus; Escape works as well.
  await page.keyboard.press('Escape');
  await expect(freePanel()).toHaveCount(0);
});

test("replay: a post-mortem's del fix is one click to the same preview", async () => {
  const fix = page.locator(`${PANEL} .jp-GpuMem-oom .jp-GpuMem-fix`, {
    hasText: 'del blocks'
  });
  await expect(fix).toHaveCount(1);
  await countRequests('free');
  await fix.getByRole('button', { name: /^Free blocks/ }).click();
  const preview = fix.locator('.jp-GpuMem-free');
  await expect(preview).toHaveAttribute('data-free', 'preview');
  expect(await requests('free')).toBe(1);
  await expect(preview.locator('.jp-GpuMem-freeHeld')).toHaveText(
    'Holds 512.00 MiB on GPU 0'
  );
  await expect(preview.locator('.jp-GpuMem-freeLetGo li').first()).toHaveText(
    /^del blocks\s*the name you gave\s*512\.00 MiB$/
  );
  await fix.scrollIntoViewIfNeeded();
  await panelScreenshot(page, 'panel-who-free-fix');
  await preview.getByRole('button', { name: 'Cancel' }).click();
  await expect(fix.locator('.jp-GpuMem-free')).toHaveCount(0);
});

test('replay: while a cell runs the kernel answers busy and frees nothing', async () => {
  await page.evaluate(() => {
    const app = (window as any).jupyterapp;
    const notebook = app.shell.currentWidget.content;
    notebook.activeCellIndex = notebook.model.cells.length - 1;
    notebook.activeCell.model.sharedModel.setSource(
      'import time; time.sleep(5)'
    );
    void app.commands.execute('notebook:run-cell-and-insert-below');
  });
  await expect(page.locator(`${PANEL} .jp-GpuMem-busy`)).toBeVisible({
    timeout: 10_000
  });
  await row('a')
    .getByRole('button', { name: /^Free a/ })
    .click();
  const busy = freePanel();
  await expect(busy).toHaveAttribute('data-free', 'busy');
  await expect(busy).toContainText('busy: available when the cell ends');
  await expect(busy).toContainText('Nothing was let go.');
  await busy.getByRole('button', { name: 'Cancel' }).click();
  await expect(freePanel()).toHaveCount(0);
});
