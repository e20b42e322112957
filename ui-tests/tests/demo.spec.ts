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
import { formatBytes } from './eightGpus';
import {
  PANEL,
  ROOT_DIR,
  SCREENSHOTS,
  checkEnvironment,
  newPage,
  openNotebook
} from './lab';

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
      reject(
        new Error(`the demo exited (${code}) before printing a URL:\n${out}`)
      );
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
    // trusted: the image fallbacks stay hidden behind their SVGs
    await expect(
      notebook.locator('.jp-GpuMem-pictureImage').first()
    ).toBeHidden();
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
    await expect(page.locator(PANEL)).toContainText(/replay/i, {
      timeout: 90_000
    });
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

/** Bytes as the cell report writes them ("256.00 MiB"). */
function reportBytes(bytes: number): string {
  const names = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < names.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${bytes} B` : `${value.toFixed(2)} ${names[unit]}`;
}

/** The recording the demo's kernel plays (jupyter_gpumem/testing/recorded/demo_cells.json). */
function demoRecording(): {
  cells: {
    execution_count: number;
    frames: [
      number,
      { devices: { memory_stats?: Record<string, number> }[] }
    ][];
    history: unknown[][];
  }[];
} {
  const file = path.join(
    __dirname,
    '..',
    '..',
    'jupyter_gpumem',
    'testing',
    'recorded',
    'demo_cells.json'
  );
  return JSON.parse(fs.readFileSync(file, 'utf8'));
}

test('Run All plays the tour: the reports, the panel and the history agree, and the outputs stay', async ({
  browser
}) => {
  checkEnvironment();
  const rec = demoRecording();
  const port = await freePort();
  const workspaces = fs.mkdtempSync(path.join(os.tmpdir(), 'gpumem-demo-ws-'));
  const proc = spawn(
    PYTHON,
    ['-m', 'jupyter_gpumem', 'demo', '--no-browser', `--port=${port}`],
    {
      env: {
        ...process.env,
        JUPYTER_TOKEN: '',
        JUPYTERLAB_WORKSPACES_DIR: workspaces
      },
      stdio: ['ignore', 'pipe', 'pipe']
    }
  );
  try {
    const out = await printedUrl(proc, 150_000);
    // the server's log drained into this test's own folder (a full pipe would stall it)
    const log = fs.createWriteStream(path.join(workspaces, 'demo-server.log'));
    proc.stdout?.pipe(log);
    proc.stderr?.pipe(log);
    const url = /(https?:\/\/\S+\?token=\w+)/.exec(out)![1];
    const page = await browser.newPage();
    await page.goto(url);
    const notebook = page.locator('.jp-NotebookPanel:visible .jp-Notebook');
    await expect(notebook).toBeVisible({ timeout: 120_000 });
    await page.locator('.jp-SideBar li[data-id="jp-GpuMem-panel"]').click();
    await expect(page.locator(PANEL)).toBeVisible();

    // once the kernel has started: Run > Run All Cells, as a user does
    await expect(page.locator('#jp-main-statusbar')).toContainText(/\| Idle/, {
      timeout: 120_000
    });
    // > Run All Cells, as a user does
    await page.locator('.lm-MenuBar-itemLabel', { hasText: /^Run$/ }).click();
    await page
      .locator('.lm-Menu-itemLabel', { hasText: /^Run All Cells$/ })
      .click();
    const last = rec.cells[rec.cells.length - 1];
    const prompts = notebook.locator('.jp-CodeCell .jp-InputPrompt');
    await expect(prompts.last()).toHaveText(`[${last.execution_count}]:`, {
      timeout: 150_000
    });
    // every code cell ran, in order, with the recorded execution counts
    const counts = await prompts.allTextContents();
    expect(counts).toEqual(rec.cells.map(c => `[${c.execution_count}]:`));
    // the recorded out-of-memory error is raised again, and every HTML output says replay
    await expect(
      notebook.locator(
        '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
      )
    ).toContainText('OutOfMemoryError');
    const labels = notebook.locator('.gpumem-replay-label');
    expect(await labels.count()).toBeGreaterThanOrEqual(10);
    await expect(labels.first()).toContainText(
      'replay · recorded on an NVIDIA'
    );

    // the panel and the status bar stand where the recording stood after the last cell
    const after =
      last.frames[last.frames.length - 1][1].devices[0].memory_stats!;
    const allocated = formatBytes(after['allocated_bytes.all.current']);
    const reserved = formatBytes(after['reserved_bytes.all.current']);
    await expect(
      page.locator(`${PANEL} [data-figure="allocated"]`).first()
    ).toHaveText(allocated, { timeout: 20_000 });
    await expect(
      page.locator('#jp-main-statusbar .jp-GpuMem-statusItem')
    ).toContainText(`${allocated} / ${reserved}`);
    // the History tab holds each measured cell's row, with the figure its report gave
    await page.locator(PANEL).getByRole('tab', { name: 'History' }).click();
    const measured = rec.cells.filter(c => c.history.length > 0);
    expect(measured.length).toBeGreaterThanOrEqual(2);
    for (const cell of measured) {
      const row = page.locator(
        `${PANEL} .jp-GpuMem-historyRow[data-cell="${cell.execution_count}"]`
      );
      await expect(row.first()).toContainText(String(cell.history[0][2])); // its first line
      const devices = cell.history[0][cell.history[0].length - 1] as number[][];
      const report = notebook
        .locator('.jp-CodeCell')
        .nth(rec.cells.indexOf(cell))
        .locator('.jp-GpuMem-report');
      // the report's "allocated" after the cell is the history row's
      await expect(report).toContainText(reportBytes(devices[0][1]));
    }

    fs.mkdirSync(SCREENSHOTS, { recursive: true });
    await page.screenshot({ path: path.join(SCREENSHOTS, 'demo-run-all.png') });
    // saved and opened again: the outputs are still there, pictures drawn
    await page.keyboard.press('Control+s');
    await page.reload();
    await expect(notebook).toBeVisible({ timeout: 120_000 });
    await expect
      .poll(
        () => notebook.locator('.jp-OutputArea-output svg[viewBox]').count(),
        {
          timeout: 60_000
        }
      )
      .toBeGreaterThanOrEqual(3);
    await expect(
      notebook.locator('.gpumem-replay-label').first()
    ).toBeVisible();
    await page.close();
  } finally {
    await stopped(proc);
    fs.rmSync(workspaces, { recursive: true, force: true });
  }
});

test('an unsigned copy of the tour opens untrusted and shows its pictures as images', async ({
  browser
}) => {
  // as a notebook downloaded or shared without its signature: JupyterLab sanitises its
  // HTML, which removes the inline SVGs
  const name = 'demo-untrusted.ipynb';
  // (changed, so that no signature of the shipped copy, which the demo signs, is its own)
  const nb = JSON.parse(
    fs.readFileSync(
      path.join(__dirname, '..', '..', 'examples', 'demo.ipynb'),
      'utf8'
    )
  );
  nb.metadata.shared = true;
  fs.writeFileSync(path.join(ROOT_DIR, name), JSON.stringify(nb));
  test.setTimeout(300_000);
  const page = await newPage(browser);
  await openNotebook(page, name, 'demo-untrusted');
  const notebook = page.locator('.jp-NotebookPanel:visible .jp-Notebook');
  const images = notebook.locator(
    '.jp-OutputArea-output img.jp-GpuMem-pictureImage'
  );
  await expect.poll(() => images.count(), { timeout: 60_000 }).toBe(3);
  expect(
    await notebook.locator('.jp-OutputArea-output svg[viewBox]').count()
  ).toBe(0);
  for (let i = 0; i < 3; i++) {
    const image = images.nth(i);
    await image.scrollIntoViewIfNeeded();
    await expect(image).toBeVisible();
    // drawn: the browser decoded the SVG document, at the picture's size
    const size = await image.evaluate((el: HTMLImageElement) => ({
      natural: el.naturalWidth,
      width: el.getBoundingClientRect().width,
      height: el.getBoundingClientRect().height
    }));
    expect(size.natural).toBeGreaterThan(0);
    expect(size.width).toBeGreaterThan(200);
    expect(size.height).toBeGreaterThan(20);
    // the text the removed SVG leaves behind takes no room
    const leftover = await image.evaluate(
      (el: HTMLElement) => el.parentElement!.getBoundingClientRect().height
    );
    expect(leftover).toBeLessThan(size.height + 8);
  }
  const segments = notebook.locator('.jp-GpuMem-segments').first();
  await segments.scrollIntoViewIfNeeded();
  fs.mkdirSync(SCREENSHOTS, { recursive: true });
  await segments.screenshot({
    path: path.join(SCREENSHOTS, 'demo-untrusted-segments.png')
  });
  await page.close();
});
