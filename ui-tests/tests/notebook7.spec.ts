/**
 * Beyond JupyterLab: the panel in Jupyter Notebook 7 (the same server serves
 * its pages at /notebooks/...), and the ipywidgets panel (`%gpumem panel`),
 * which any frontend with widgets shows. Against the real kernel side, with
 * the replay backend's recorded H200 figures on a machine without a GPU.
 */
import { expect, Page, test } from '@playwright/test';
import * as fs from 'fs';
import * as path from 'path';
import {
  BODY,
  MODE,
  PANEL,
  checkEnvironment,
  openNotebook,
  runCellAndWait,
  screenshot,
  SCREENSHOTS,
  statusLine,
  TOKEN,
  waitForKernelIdle,
  writeNotebook
} from './lab';

test.skip(
  MODE === 'none',
  'needs figures: a GPU, or the replay backend (JUPYTER_GPUMEM_REPLAY)'
);

/** Open a notebook in Notebook 7 and wait for its kernel. */
async function openInNotebook7(page: Page, name: string): Promise<void> {
  await page.goto(`notebooks/${name}?token=${TOKEN}`);
  await page.waitForFunction(() => !!(window as any).jupyterapp, null, {
    timeout: 60_000
  });
  await page.waitForFunction(
    (nb: string) => {
      const app = (window as any).jupyterapp;
      const widget = app?.shell?.currentWidget;
      return (
        !!widget &&
        widget.context?.path === nb &&
        widget.sessionContext?.session?.kernel?.status === 'idle'
      );
    },
    name,
    { timeout: 90_000 }
  );
}

test('Notebook 7: the panel opens in the right sidebar and follows the kernel', async ({
  page
}) => {
  checkEnvironment();
  writeNotebook('nb7.ipynb');
  await openInNotebook7(page, 'nb7.ipynb');
  // Notebook 7, not Lab: its own app, no Lab shell
  expect(await page.evaluate(() => (window as any).jupyterapp.name)).toMatch(
    /Notebook/
  );
  // Its palette lists the panel once: Notebook 7's own entry for a sidebar
  // panel ("Show <caption>"), none of ours beside it.
  await page.evaluate(() =>
    (window as any).jupyterapp.commands.execute(
      'apputils:activate-command-palette'
    )
  );
  const input = page.locator('.lm-CommandPalette-input');
  await expect(input).toBeVisible();
  await input.fill('GPU memory');
  const labels = page.locator(
    '.lm-CommandPalette-item .lm-CommandPalette-itemLabel'
  );
  await expect(labels.first()).toBeVisible();
  const shows = (await labels.allTextContents()).filter(label =>
    /^show gpu memory$/i.test(label.trim())
  );
  expect(shows).toEqual(['Show GPU Memory']);
  await page.keyboard.press('Escape');
  await page.evaluate(() =>
    (window as any).jupyterapp.commands.execute('jupyter-gpumem:open')
  );
  // in Notebook 7's right sidebar, not in some other area
  await expect(page.locator(`#jp-right-stack ${PANEL}`)).toBeVisible();
  // The kernel has not loaded the extension yet: the panel says so.
  await expect(page.locator(BODY)).toHaveAttribute('data-state', 'not_loaded', {
    timeout: 30_000
  });
  await runCellAndWait(page, '%load_ext jupyter_gpumem\nimport time');
  await expect(page.locator(BODY)).toHaveAttribute('data-state', 'ok', {
    timeout: 30_000
  });
  await expect(
    page.locator(`${PANEL} .jp-GpuMem-segment-allocated`).first()
  ).toBeVisible();
  await expect(
    page.locator(`${PANEL} [data-figure="allocated"]`).first()
  ).toContainText(/B$/);
  // A button works as in Lab: its answer in the status line.
  await page
    .getByRole('button', { name: /^Reset the peak counters/ })
    .first()
    .click();
  await expect(statusLine(page)).toHaveText(/Peak reset/, { timeout: 15_000 });
  await screenshot(page, 'notebook7-panel');
  // It follows the notebook's kernel: a restarted kernel is a new process that has not
  // loaded the extension; loading it there brings the figures back.
  const before = await kernelPid(page);
  await page.evaluate(() =>
    (
      window as any
    ).jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()
  );
  await expect(page.locator(BODY)).toHaveAttribute('data-state', 'not_loaded', {
    timeout: 30_000
  });
  await runCellAndWait(page, '%load_ext jupyter_gpumem\nimport os');
  await expect(page.locator(BODY)).toHaveAttribute('data-state', 'ok', {
    timeout: 30_000
  });
  expect(await kernelPid(page)).not.toBe(before);
});

/** The PID of the current notebook's kernel, asked through a cell's output. */
async function kernelPid(page: Page): Promise<string> {
  return page.evaluate(async () => {
    const kernel = (window as any).jupyterapp.shell.currentWidget.sessionContext
      .session.kernel;
    let out = '';
    const future = kernel.requestExecute({
      code: 'import os; print(os.getpid())',
      silent: false,
      store_history: false
    });
    future.onIOPub = (msg: any) => {
      if (msg.header.msg_type === 'stream') {
        out += msg.content.text;
      }
    };
    await future.done;
    return out.trim();
  });
}

test('the ipywidgets panel renders and its buttons answer', async ({
  page
}) => {
  checkEnvironment();
  writeNotebook('widget.ipynb');
  // its own workspace: the default one is what the next test file's Lab restores
  await openNotebook(page, 'widget.ipynb', 'widget');
  await runCellAndWait(page, '%load_ext jupyter_gpumem\n%gpumem panel');
  const widget = page.locator('.jp-OutputArea-output .widget-vbox').first();
  await expect(widget).toBeVisible({ timeout: 30_000 });
  await expect(widget).toContainText('NVIDIA H200');
  await expect(widget).toContainText('fitted to this kernel');
  await widget.getByRole('button', { name: 'Reset peak' }).click();
  await expect(widget).toContainText('Peak reset to the current allocation', {
    timeout: 15_000
  });
  await widget.getByRole('button', { name: 'Empty cache' }).click();
  await expect(widget).toContainText(
    /Released .* to the driver|Nothing to release/,
    { timeout: 15_000 }
  );
  const cap = widget.getByRole('textbox');
  await cap.fill('12XB');
  await widget.getByRole('button', { name: 'Set cap' }).click();
  await expect(widget).toContainText("Set cap refused: not a size: '12XB'", {
    timeout: 15_000
  });
  await cap.fill('12GiB');
  await widget.getByRole('button', { name: 'Set cap' }).click();
  await expect(widget).toContainText('Capped cuda:0 at 12.00 GiB', {
    timeout: 15_000
  });
  await widget.getByRole('button', { name: 'Clear cap' }).click();
  await expect(widget).toContainText('Cap removed on cuda:0', {
    timeout: 15_000
  });
  // the caching button says what a click does, as the JupyterLab panel's
  await widget.getByRole('button', { name: 'Caching off' }).click();
  await expect(widget).toContainText('Caching is off:', { timeout: 15_000 });
  await expect(
    widget.getByRole('button', { name: 'Caching on' })
  ).toBeVisible();
  await widget.getByRole('button', { name: 'Caching on' }).click();
  await expect(widget).toContainText('Caching is on:', { timeout: 15_000 });
  await waitForKernelIdle(page);
  fs.mkdirSync(SCREENSHOTS, { recursive: true });
  await widget.screenshot({ path: path.join(SCREENSHOTS, 'widget-panel.png') });
});
