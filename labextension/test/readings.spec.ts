/**
 * When the model reads the Segments and History views: only while their tab
 * is shown in the visible panel; again after each cell; never from a kernel
 * it left; a kernel side without the action gets a message, not a request.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { READING_ARGS } from '../src/kernel/readings';
import { GpuMemModel } from '../src/model';
import { FakeKernel, FakeSession } from './fakes';
import { helloResult, okReply, STREAM } from './fixtures';

async function flush(ms = 0): Promise<void> {
  await vi.advanceTimersByTimeAsync(ms);
}

function setup(kernel = new FakeKernel()) {
  const model = new GpuMemModel();
  const session = new FakeSession(kernel);
  model.setSource({ label: 'Untitled.ipynb', sessionContext: session as any });
  return { model, session, kernel };
}

async function connect(kernel: FakeKernel, actions?: string[]): Promise<void> {
  const hello = helloResult();
  kernel.last('hello').reply(
    okReply('hello', {
      ...hello,
      actions: actions ?? hello.actions,
      stream: { ...hello.stream, comm_id: 'comm-1' }
    })
  );
  await flush();
  kernel
    .last('subscribe')
    .reply(okReply('subscribe', { stream: { ...STREAM, comm_id: 'comm-1' } }));
  await flush();
}

beforeEach(() => {
  vi.useFakeTimers();
});

afterEach(() => {
  vi.useRealTimers();
});

describe('reading the Segments and History views', () => {
  it('reads only while the tab shows, and again after each cell', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    expect(kernel.requests('history')).toHaveLength(0);
    model.setReadingShown('history', true);
    await flush();
    expect(kernel.requests('history')).toHaveLength(1);
    expect(kernel.last('history').msg.content.args).toEqual(
      READING_ARGS.history
    );
    expect(model.state.process.readings.history.status).toBe('loading');
    kernel.last('history').reply(
      okReply('history', {
        cells: [
          {
            execution_count: 3,
            time: 1,
            first_line: 'x = 1',
            wall_time: 0.1,
            failed: false,
            devices: []
          }
        ]
      })
    );
    await flush();
    expect(model.state.process.readings.history.status).toBe('ok');
    expect(model.state.process.readings.history.data?.cells).toHaveLength(1);
    // A cell runs and ends: read again.
    kernel.iopubStatus('busy');
    kernel.iopubStatus('idle');
    await flush();
    expect(kernel.requests('history')).toHaveLength(2);
    kernel.last('history').reply(okReply('history', { cells: [] }));
    await flush();
    // Hidden: cells no longer read it, and nothing reads segments unasked.
    model.setReadingShown('history', false);
    kernel.iopubStatus('busy');
    kernel.iopubStatus('idle');
    await flush();
    expect(kernel.requests('history')).toHaveLength(2);
    expect(kernel.requests('segments')).toHaveLength(0);
    // Shown again after an unseen cell: read at once.
    model.setReadingShown('history', true);
    await flush();
    expect(kernel.requests('history')).toHaveLength(3);
  });

  it('reads nothing while the panel is hidden, and reads when shown', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setVisible(false);
    model.setReadingShown('segments', true);
    await flush();
    expect(kernel.requests('segments')).toHaveLength(0);
    model.setVisible(true);
    await connect(kernel);
    expect(kernel.requests('segments')).toHaveLength(1);
    expect(kernel.last('segments').msg.content.args).toEqual(
      READING_ARGS.segments
    );
  });

  it('Refresh reads again, one request at a time', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setReadingShown('segments', true);
    await flush();
    void model.fetchReading('segments');
    await flush();
    expect(kernel.requests('segments')).toHaveLength(1);
    kernel.last('segments').reply(okReply('segments', { devices: [] }));
    await flush();
    void model.fetchReading('segments');
    await flush();
    expect(kernel.requests('segments')).toHaveLength(2);
  });

  it('drops a reading of a kernel it left', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setReadingShown('segments', true);
    await flush();
    const old = kernel.last('segments');
    const other = new FakeKernel();
    model.setSource({
      label: 'Other.ipynb',
      sessionContext: new FakeSession(other) as any
    });
    old.reply(okReply('segments', { devices: [{ device: 0 }] }));
    await flush();
    expect(model.state.process.readings.segments.data).toBeNull();
  });

  it('says the kernel side is too old instead of asking it', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel, ['hello', 'sample', 'subscribe', 'unsubscribe']);
    await model.fetchReading('segments');
    expect(kernel.requests('segments')).toHaveLength(0);
    expect(model.state.process.readings.segments.error?.code).toBe(
      'unknown_action'
    );
  });
});
