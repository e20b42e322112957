/**
 * `jupyter-gpumem demo` as a new user meets it: the command started as they start it, the
 * URL it prints opened in the browser. The notebook opens (not the launcher), trusted, so
 * its recorded pictures (the segment map, the history plot, the scan's chart) are drawn
 * as pictures; the panel beside it says replay; stopping the command removes its folder.
 * The picture of this page is the README's (`demo-tour.png`).
 */
import { expect, test } from '@playwright/test';
import { ChildProcess, spawn } from 'child_process';
import * as fs from 'fs';
import * as net from 'net';
import * as os from 'os';
import * as path from 'path';
import { PANEL, SCREENSHOTS, checkEnvironment } from './lab';

const PYTHON = process.env.GPUMEM_UI_PYTHON ?? 'python3';

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const port = (server.address() as net.AddressInfo).port;
      server.close(() => resolve(port));
    });
  });
}

/** What the command printed, once it has printed the server's URL. */
function printedUrl(proc: ChildProcess, timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(
      () => reject(new Error(`no URL after ${timeoutMs} ms:\n${out}`)),
      timeoutMs
    );
    const read = (chunk: Buffer) => {
      out += chunk.toString();
      if (/https?:\/\/\S+\?token=\w+/.test(out)) {
        clearTimeout(timer);
        resolve(out);
      }
    };
    proc.stdout?.on('data', read);
    proc.stderr?.on('data', read);
    proc.once('exit', code => {
      clearTimeout(timer);
      reject(new Error(`the demo exited (${code}) before printing a URL:\n${out}`));
    });
  });
}

function stopped(proc: ChildProcess): Promise<void> {
  return new Promise(resolve => {
    if (proc.exitCode !== null) {
      resolve();
      return;
    }
    const kill = setTimeout(() => proc.kill('SIGKILL'), 30_000);
    proc.once('exit', () => {
      clearTimeout(kill);
      resolve();
    });
    proc.kill('SIGTERM');
  });
}

test('the demo opens trusted by the URL it prints, its recorded pictures drawn', async ({
  browser
}) => {
  checkEnvironment();
  const port = await freePort();
  // its own workspace: the layout it saves (the panel open) must not reach the other tests
  const workspaces = fs.mkdtempSync(path.join(os.tmpdir(), 'gpumem-demo-ws-'));
  const proc = spawn(
    PYTHON,
    ['-m', 'jupyter_gpumem', 'demo', '--no-browser', `--port=${port}`],
    {
      // as a user starts it: no token of the test server's in its environment
      env: {
        ...process.env,
        JUPYTER_TOKEN: '',
        JUPYTERLAB_WORKSPACES_DIR: workspaces
      },
      stdio: ['ignore', 'pipe', 'pipe']
    }
  );
  let folder = '';
  try {
    const out = await printedUrl(proc, 150_000);
    const url = /(https?:\/\/\S+\?token=\w+)/.exec(out)![1];
    expect(url).toContain('/lab/tree/demo.ipynb?token=');
    folder = path.dirname(/demo: (\/\S+demo\.ipynb)/.exec(out)![1]);
    expect(fs.existsSync(folder)).toBe(true);

    const page = await browser.newPage();
    await page.goto(url);
    const notebook = page.locator('.jp-NotebookPanel:visible .jp-Notebook');
    await expect(notebook).toBeVisible({ timeout: 120_000 });
    await expect(page.locator('.jp-Launcher')).toHaveCount(0);
    // Trusted outputs keep their SVG; an untrusted notebook's HTML is sanitised to text.
    const pictures = notebook.locator('.jp-OutputArea-output svg[viewBox]');
    await expect
      .poll(() => pictures.count(), { timeout: 60_000 })
      .toBeGreaterThanOrEqual(3);
    const segmentMap = notebook.locator('.jp-GpuMem-segments svg').first();
    await segmentMap.scrollIntoViewIfNeeded();
    await expect(segmentMap).toBeVisible();
    const box = await segmentMap.boundingBox();
    expect(box && box.width > 200 && box.height > 20).toBeTruthy();

    // the panel beside the tour once the first cell has loaded the extension, for the
    // README's picture
    await page.locator('.jp-SideBar li[data-id="jp-GpuMem-panel"]').click();
    await expect(page.locator(PANEL)).toBeVisible();
    const first = notebook.locator('.jp-CodeCell').first();
    await first.scrollIntoViewIfNeeded();
    await first.locator('.jp-InputArea-editor').click();
    await page.keyboard.press('Shift+Enter');
    await expect(page.locator(PANEL)).toContainText(/replay/i, { timeout: 90_000 });
    await notebook.locator('.jp-Cell').first().scrollIntoViewIfNeeded();
    fs.mkdirSync(SCREENSHOTS, { recursive: true });
    await page.screenshot({ path: path.join(SCREENSHOTS, 'demo-tour.png') });
    await page.close();
  } finally {
    await stopped(proc);
    fs.rmSync(workspaces, { recursive: true, force: true });
  }
  expect(fs.existsSync(folder)).toBe(false); // no temporary folder left behind
});
