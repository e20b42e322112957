import { defineConfig } from '@playwright/test';

/**
 * Runs against the JupyterLab server that run.sh starts (JUPYTER_BASE_URL,
 * JUPYTER_TOKEN), in Debian's Chromium: no browser is downloaded.
 */
const CHROMIUM_FLAGS = [
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync'
];

export default defineConfig({
  testDir: './tests',
  outputDir: './test-results',
  fullyParallel: false,
  workers: 1,
  retries: 0,
  timeout: 180_000,
  expect: { timeout: 20_000 },
  reporter: [['list']],
  use: {
    baseURL: process.env.JUPYTER_BASE_URL,
    headless: true,
    viewport: { width: 1400, height: 900 },
    screenshot: 'only-on-failure',
    trace: 'off',
    launchOptions: {
      executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
      // Playwright adds --headless and a fresh temporary --user-data-dir.
      args: CHROMIUM_FLAGS
    }
  }
});
