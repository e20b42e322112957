/**
 * Helpers to drive a real JupyterLab page. The server runs with
 * `--LabApp.expose_app_in_browser=True`, so `window.jupyterapp` is there.
 */
import { Browser, expect, Page } from '@playwright/test';
import * as fs from 'fs';
import * as path from 'path';

export const TOKEN = process.env.JUPYTER_TOKEN ?? '';
export const ROOT_DIR = process.env.JUPYTER_ROOT_DIR ?? '';
export const SCREENSHOTS =
  process.env.GPUMEM_UI_SCREENSHOTS ??
  path.join(__dirname, '..', 'screenshots');

/** 'gpu': a real CUDA device; 'replay': JUPYTER_GPUMEM_REPLAY; 'none': neither. */
export const MODE = (process.env.GPUMEM_UI_MODE ?? 'none') as
  'gpu' | 'replay' | 'none';

export const PANEL = '#jp-GpuMem-panel';
export const BODY = `${PANEL} .jp-GpuMem-body`;

export function checkEnvironment(): void {
  if (!process.env.JUPYTER_BASE_URL || !ROOT_DIR) {
    throw new Error(
      'JUPYTER_BASE_URL and JUPYTER_ROOT_DIR are not set: run the tests with ui-tests/run.sh'
    );
  }
}

/** Write an empty Python 3 notebook into the server's root directory. */
/**
 * A page of its own for a test file: the environment checked, `notebook` written (when
 * given), the browser's uncaught errors logged (and, with `gpumemConsole`, console errors
 * that name the extension).
 */
export async function newPage(
  browser: Browser,
  notebook?: string,
  gpumemConsole = false
): Promise<Page> {
  checkEnvironment();
  if (notebook) {
    writeNotebook(notebook);
  }
  const page = await browser.newPage();
  page.on('pageerror', error =>
    console.log(`[page error] ${error.stack ?? error.message}`)
  );
  if (gpumemConsole) {
    page.on('console', message => {
      if (message.type() === 'error' && /gpumem/i.test(message.text())) {
        console.log(`[console] ${message.text()}`);
      }
    });
  }
  return page;
}

export function writeNotebook(name: string): void {
  const notebook = {
    cells: [
      {
        cell_type: 'code',
        execution_count: null,
        id: 'c0',
        metadata: {},
        outputs: [],
        source: []
      }
    ],
    metadata: {
      kernelspec: {
        display_name: 'Python 3 (ipykernel)',
        language: 'python',
        name: 'python3'
      },
      language_info: { name: 'python' }
    },
    nbformat: 4,
    nbformat_minor: 5
  };
  fs.writeFileSync(path.join(ROOT_DIR, name), JSON.stringify(notebook));
}

/**
 * Open a notebook in Lab and wait until its kernel is idle. With `workspace`,
 * in that named workspace: the default one (what `lab` restores for the next
 * test file) stays as it was.
 */
export async function openNotebook(
  page: Page,
  name: string,
  workspace?: string
): Promise<void> {
  const lab = workspace ? `lab/workspaces/${workspace}` : 'lab';
  await page.goto(`${lab}/tree/${name}?token=${TOKEN}`);
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

export async function kernelStatus(page: Page): Promise<string> {
  return page.evaluate(
    () =>
      (window as any).jupyterapp.shell.currentWidget.sessionContext.session
        ?.kernel?.status ?? 'none'
  );
}

export async function waitForKernelIdle(
  page: Page,
  timeout = 120_000
): Promise<void> {
  await page.waitForFunction(
    () =>
      (window as any).jupyterapp.shell.currentWidget.sessionContext.session
        ?.kernel?.status === 'idle',
    null,
    { timeout }
  );
}

/**
 * Put code in the active cell and run it. Returns at once; wait with
 * waitForKernelIdle when needed.
 */
export async function runCell(page: Page, code: string): Promise<void> {
  await page.evaluate((source: string) => {
    const app = (window as any).jupyterapp;
    const notebook = app.shell.currentWidget.content;
    const cells = notebook.model.cells;
    notebook.activeCellIndex = cells.length - 1;
    notebook.activeCell.model.sharedModel.setSource(source);
    // Runs the cell and adds a new one below, ready for the next call. The
    // command's promise settles when the cell is done: not awaited.
    void app.commands.execute('notebook:run-cell-and-insert-below');
  }, code);
}

/** Run code and wait until the kernel is idle again. */
export async function runCellAndWait(
  page: Page,
  code: string,
  timeout = 120_000
): Promise<void> {
  await runCell(page, code);
  await page.waitForTimeout(200);
  await waitForKernelIdle(page, timeout);
}

export async function openPanel(page: Page): Promise<void> {
  await page.evaluate(() =>
    (window as any).jupyterapp.commands.execute('jupyter-gpumem:open')
  );
  await expect(page.locator(PANEL)).toBeVisible();
}

export async function panelState(page: Page): Promise<string | null> {
  return page.locator(BODY).getAttribute('data-state');
}

export async function screenshot(page: Page, name: string): Promise<void> {
  fs.mkdirSync(SCREENSHOTS, { recursive: true });
  await page.screenshot({ path: path.join(SCREENSHOTS, `${name}.png`) });
  await panelScreenshot(page, `${name}-panel`);
}

/** The panel alone, as `<name>.png`. */
export async function panelScreenshot(page: Page, name: string): Promise<void> {
  fs.mkdirSync(SCREENSHOTS, { recursive: true });
  await page
    .locator(PANEL)
    .screenshot({ path: path.join(SCREENSHOTS, `${name}.png`) });
}

/** The text of the panel's status line. */
export function statusLine(page: Page) {
  return page.locator(`${PANEL} .jp-GpuMem-statusLine .jp-GpuMem-statusText`);
}

/** Switch JupyterLab's theme and wait until the page shows it. */
export async function setTheme(
  page: Page,
  theme: 'JupyterLab Light' | 'JupyterLab Dark'
): Promise<void> {
  await page.evaluate(
    (name: string) =>
      (window as any).jupyterapp.commands.execute('apputils:change-theme', {
        theme: name
      }),
    theme
  );
  await expect(page.locator('body')).toHaveAttribute(
    'data-jp-theme-light',
    theme === 'JupyterLab Light' ? 'true' : 'false'
  );
}

/**
 * Set one of the panel's settings (schema/plugin.json) through the setting
 * registry, reached through the plugin registry (test-only access). False
 * when the registry cannot be reached.
 */
export async function setSetting(
  page: Page,
  key: string,
  value: unknown
): Promise<boolean> {
  return page.evaluate(
    async ([name, v]: [string, unknown]) => {
      const app = (window as any).jupyterapp;
      const registry = app.pluginRegistry?._plugins?.get(
        '@jupyterlab/apputils-extension:settings'
      )?.service;
      if (!registry) {
        return false;
      }
      await registry.set('jupyter-gpumem:plugin', name, v);
      return true;
    },
    [key, value] as [string, unknown]
  );
}

/** The status bar's GPU memory item (JupyterLab only). */
export function statusItem(page: Page) {
  return page.locator('#jp-main-statusbar .jp-GpuMem-statusItem');
}
