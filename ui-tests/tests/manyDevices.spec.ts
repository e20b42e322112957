/**
 * A kernel with 8 GPUs: every device gets its section, and a device's trend
 * chart is drawn only while its section can be seen in the panel (the rest
 * keep a placeholder of the chart's height; views/common/inView.ts). Scrolling a
 * device into view draws its chart at once, from the history the panel kept.
 *
 * The panel follows a real kernel with the extension loaded; its stream is
 * then stopped and the store is fed the comm messages of an 8-GPU kernel, as
 * the benchmark does (eightGpus.ts).
 */
import { expect, test } from '@playwright/test';

import { BODY, screenshot } from './lab';
import { DEVICES, formatBytes, panelToFeed, sample } from './eightGpus';

const NOTEBOOK = 'gpumem-eight.ipynb';
const WORKSPACE = 'gpumem-eight';

test('8 GPUs: a device draws its trend chart when it comes into view', async ({
  page
}) => {
  test.setTimeout(180_000);
  const { commId, lastSeq, time } = await panelToFeed(
    page,
    NOTEBOOK,
    WORKSPACE
  );
  const samples = 120;
  const seq = lastSeq + 1_000_000;
  const t0 = Math.floor(time) + 1;
  const last = sample(samples - 1, t0);
  const steps = [];
  for (let k = 0; k < samples; k++) {
    steps.push({
      type: 'comm',
      commId,
      data: { protocol: 1, type: 'sample', seq: seq + k, sample: sample(k, t0) }
    });
  }
  await page.evaluate((events: unknown[]) => {
    const model = (window as any).jupyterapp.pluginRegistry._plugins.get(
      'jupyter-gpumem:plugin'
    ).service;
    for (const event of events) {
      model._store.dispatch(event);
    }
  }, steps);
  const section = (d: number) => page.locator(`${BODY} [data-device="${d}"]`);
  await expect(page.locator(`${BODY} .jp-GpuMem-device`)).toHaveCount(DEVICES);
  // Every device's figures are current, whether or not it can be seen.
  const lastDevice = (last.devices as Record<string, number>[])[DEVICES - 1];
  await expect(
    section(DEVICES - 1).locator('[data-figure="allocated"]')
  ).toHaveText(formatBytes(lastDevice.allocated));
  // The first device is in view: its chart is drawn; the last is not.
  await expect(section(0).locator('.jp-GpuMem-trend svg')).toHaveCount(1);
  await expect(section(DEVICES - 1).locator('.jp-GpuMem-trend')).toHaveCount(0);
  await expect(
    section(DEVICES - 1).locator('.jp-GpuMem-trendPlaceholder')
  ).toHaveCount(1);
  // Scrolled into view: drawn, with its three lines over the kept history.
  await section(DEVICES - 1).scrollIntoViewIfNeeded();
  const chart = section(DEVICES - 1).locator('.jp-GpuMem-trend svg');
  await expect(chart).toBeVisible({ timeout: 10_000 });
  await expect(chart.locator('polyline')).toHaveCount(3);
  await expect
    .poll(
      async () =>
        (await chart.locator('polyline').first().getAttribute('points'))?.split(
          ' '
        ).length
    )
    .toBeGreaterThan(10);
  await screenshot(page, 'eight-devices-scrolled');
  // And the first one, now out of view, gives its chart back.
  await expect(section(0).locator('.jp-GpuMem-trendPlaceholder')).toHaveCount(
    1,
    { timeout: 10_000 }
  );
});
