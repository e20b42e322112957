/**
 * The status bar's glance: one `sample` every interval while the panel is
 * hidden, nothing while it is shown, nothing to a kernel without the
 * extension until a cell that names gpumem ends.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { GpuMemModel } from '../src/model';
import { FakeKernel, FakeSession } from './fakes';
import { device, GiB, helloResult, okReply, sample, STREAM } from './fixtures';

const GLANCE_MS = 5000;

async function flush(ms = 0): Promise<void> {
  await vi.advanceTimersByTimeAsync(ms);
}

function setup(kernel = new FakeKernel()) {
  const model = new GpuMemModel();
  const session = new FakeSession(kernel);
  model.setSource({ label: 'Untitled.ipynb', sessionContext: session as any });
  return { model, session, kernel };
}

/** A cell the kernel runs: its code on IOPub, then busy and idle. */
function runCell(kernel: FakeKernel, code: string): void {
  kernel.iopubMessage.emit({
    channel: 'iopub',
    header: { msg_type: 'execute_input', session: 'process-1' },
    parent_header: { msg_type: 'execute_request' },
    content: { code, execution_count: 1 }
  });
  kernel.iopubStatus('busy');
  kernel.iopubStatus('idle');
}

beforeEach(() => {
  vi.useFakeTimers();
});

afterEach(() => {
  vi.useRealTimers();
});

describe('the glance while the panel is hidden', () => {
  it('sends nothing unless asked', async () => {
    // GIVEN a model following a kernel, the panel hidden, no glance set
    const { kernel } = setup();
    // WHEN time passes
    await flush(3 * GLANCE_MS);
    // THEN the kernel heard nothing
    expect(kernel.sent).toHaveLength(0);
  });

  it('greets the kernel, then reads one sample every interval', async () => {
    // GIVEN a glance every 5 s, the panel hidden
    const { model, kernel } = setup();
    model.setGlance(GLANCE_MS);
    // WHEN the first tick comes: a hello, whose sample the store takes
    await flush(10);
    expect(kernel.requests('hello')).toHaveLength(1);
    kernel.last('hello').reply(okReply('hello', helloResult()));
    await flush();
    expect(model.state.status.kind).toBe('ok');
    // no subscription: the stream is the panel's
    expect(kernel.requests('subscribe')).toHaveLength(0);
    // THEN one sample per interval, applied as the panel's own
    await flush(GLANCE_MS + 10);
    expect(kernel.requests('sample')).toHaveLength(1);
    kernel.last('sample').reply(
      okReply('sample', {
        sample: sample({ time: 1001, devices: [device({ reserved: 7 * GiB })] })
      })
    );
    await flush();
    expect(model.state.process.sample?.devices[0].reserved).toBe(7 * GiB);
    await flush(GLANCE_MS + 10);
    expect(kernel.requests('sample')).toHaveLength(2);
    model.dispose();
  });

  it('reads nothing while the panel is shown: its stream feeds the store', async () => {
    // GIVEN a greeted kernel, glancing
    const { model, kernel } = setup();
    model.setGlance(GLANCE_MS);
    await flush(10);
    kernel.last('hello').reply(okReply('hello', helloResult()));
    await flush();
    // WHEN the panel is shown for three intervals (it greets and subscribes)
    model.setVisible(true);
    kernel.last('hello').reply(okReply('hello', helloResult()));
    await flush();
    kernel.last('subscribe').reply(okReply('subscribe', { stream: STREAM }));
    await flush(3 * GLANCE_MS);
    // THEN no sample was asked for: the panel's stream feeds the store
    expect(kernel.requests('sample')).toHaveLength(0);
    // WHEN it hides again, THEN the glance goes on
    model.setVisible(false);
    await flush(2 * GLANCE_MS);
    expect(kernel.requests('sample').length).toBeGreaterThan(0);
    model.dispose();
  });

  it('asks a kernel without the extension again only after a gpumem cell', async () => {
    // GIVEN a kernel that never answers hello: not loaded
    const { model, kernel } = setup();
    model.setGlance(GLANCE_MS);
    await flush(2000);
    expect(model.state.status.kind).toBe('not_loaded');
    expect(kernel.requests('hello')).toHaveLength(1);
    // WHEN time passes and unrelated cells run
    await flush(3 * GLANCE_MS);
    runCell(kernel, 'x = 1');
    await flush();
    // THEN nothing more is sent (each would be an error in the server's log)
    expect(kernel.sent).toHaveLength(1);
    // WHEN a cell loads the extension
    runCell(kernel, '%load_ext jupyter_gpumem');
    // THEN the kernel is greeted again, and its figures come
    expect(kernel.requests('hello')).toHaveLength(2);
    kernel.last('hello').reply(okReply('hello', helloResult()));
    await flush();
    expect(model.state.status.kind).toBe('ok');
    model.dispose();
  });

  it('stops when the glance is switched off', async () => {
    // GIVEN a greeted kernel, glancing
    const { model, kernel } = setup();
    model.setGlance(GLANCE_MS);
    await flush(10);
    kernel.last('hello').reply(okReply('hello', helloResult()));
    await flush();
    // WHEN switched off (the statusBar setting)
    model.setGlance(null);
    await flush(3 * GLANCE_MS);
    // THEN nothing more is asked
    expect(kernel.requests('sample')).toHaveLength(0);
    model.dispose();
  });

  it('looks at a newly followed kernel at once', async () => {
    // GIVEN a glance on a greeted kernel
    const { model, kernel, session } = setup();
    model.setGlance(GLANCE_MS);
    await flush(10);
    kernel.last('hello').reply(okReply('hello', helloResult()));
    await flush(1000);
    // WHEN the notebook's kernel changes
    const other = new FakeKernel('k2');
    session.changeKernel(other);
    await flush(10);
    // THEN the new one is greeted without waiting for the interval
    expect(other.requests('hello')).toHaveLength(1);
    model.dispose();
  });
});
