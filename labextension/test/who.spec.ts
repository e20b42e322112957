/**
 * When the model reads `who` (the Who tab): only while the tab is shown in the
 * visible panel; after each measured cell once the kernel is idle; again after
 * a `busy` reply once the cell ends; never from a kernel it left.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { WHO_ROWS } from '../src/kernel/readings';
import { GpuMemModel } from '../src/model';
import { FakeKernel, FakeSession } from './fakes';
import {
  errorReply,
  helloResult,
  lineReport,
  okReply,
  STREAM,
  whoResult
} from './fixtures';

async function flush(ms = 0): Promise<void> {
  await vi.advanceTimersByTimeAsync(ms);
}

function setup(kernel = new FakeKernel()) {
  const model = new GpuMemModel();
  const session = new FakeSession(kernel);
  model.setSource({ label: 'Untitled.ipynb', sessionContext: session as any });
  return { model, session, kernel };
}

/** Answer hello and subscribe as a loaded kernel side would. */
async function connect(
  kernel: FakeKernel,
  actions?: string[],
  session = 'process-1'
): Promise<void> {
  const hello = helloResult();
  kernel.last('hello').reply(
    okReply('hello', {
      ...hello,
      revision: 2,
      actions: actions ?? hello.actions,
      stream: { ...hello.stream, comm_id: 'comm-1' }
    }),
    session
  );
  await flush();
  kernel
    .last('subscribe')
    .reply(
      okReply('subscribe', { stream: { ...STREAM, comm_id: 'comm-1' } }),
      session
    );
  await flush();
}

let seq = 0;

/** The kernel pushes the marker of a measured cell. */
function cellMarker(kernel: FakeKernel, session = 'process-1'): void {
  seq += 1;
  kernel.commMsg(
    'comm-1',
    {
      protocol: 1,
      type: 'cell',
      seq,
      cell: {
        execution_count: seq,
        time: 1000 + seq,
        wall_time: 0.5,
        failed: false,
        first_line: 'x = 1',
        devices: []
      }
    },
    session
  );
}

const BUSY = errorReply('who', 'busy', 'busy: available when the cell ends');

async function answerWho(
  kernel: FakeKernel,
  reply = okReply('who', whoResult() as any)
) {
  kernel.last('who').reply(reply);
  await flush();
}

beforeEach(() => {
  vi.useFakeTimers();
  seq = 0;
});

afterEach(() => {
  vi.useRealTimers();
});

describe('reading who holds the memory', () => {
  it('costs the kernel nothing while the Who tab is not shown', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    kernel.iopubStatus('busy');
    cellMarker(kernel);
    kernel.iopubStatus('idle');
    await flush(10000);
    expect(kernel.requests('who')).toHaveLength(0);
    expect(model.state.process.who.status).toBe('idle');
  });

  it('reads when the tab is shown, with the rows it shows', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setWhoShown(true);
    expect(kernel.requests('who')).toHaveLength(1);
    expect(kernel.last('who').args).toEqual({ n: WHO_ROWS });
    expect(model.state.process.who.status).toBe('loading');
    await answerWho(kernel);
    expect(model.state.process.who.status).toBe('ok');
    expect(model.state.process.who.data).toEqual(whoResult());
    expect(model.state.process.who.fetchedAt).toBe(Date.now());
    // Shown again with nothing new: the reading stands.
    model.setWhoShown(false);
    model.setWhoShown(true);
    expect(kernel.requests('who')).toHaveLength(1);
  });

  it('waits for the kernel when the tab is shown first', async () => {
    const { model, kernel } = setup();
    model.setWhoShown(true);
    model.setVisible(true);
    expect(kernel.requests('who')).toHaveLength(0);
    await connect(kernel);
    expect(kernel.requests('who')).toHaveLength(1);
  });

  it('reads only while the panel is visible', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setWhoShown(true);
    await answerWho(kernel);
    model.setVisible(false);
    cellMarker(kernel);
    await flush(5000);
    expect(kernel.requests('who')).toHaveLength(1);
    // Shown again: greeted, then read (cells may have run unseen).
    model.setVisible(true);
    await connect(kernel);
    expect(kernel.requests('who')).toHaveLength(2);
  });

  it('reads after each measured cell, once the kernel is idle', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setWhoShown(true);
    await answerWho(kernel);
    kernel.iopubStatus('busy');
    // The marker comes before the status that ends the cell.
    cellMarker(kernel);
    expect(kernel.requests('who')).toHaveLength(1);
    kernel.iopubStatus('idle');
    expect(kernel.requests('who')).toHaveLength(2);
    await answerWho(kernel);
    // An unmeasured cell (no marker) reads nothing.
    kernel.iopubStatus('busy');
    kernel.iopubStatus('idle');
    expect(kernel.requests('who')).toHaveLength(2);
    // A marker while the panel already saw the kernel idle: read at once.
    cellMarker(kernel);
    expect(kernel.requests('who')).toHaveLength(3);
  });

  it('reads again once the cell ends after a busy reply', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setWhoShown(true);
    await answerWho(kernel);
    kernel.iopubStatus('busy');
    // Refresh while the cell runs: the kernel answers busy at once.
    void model.who();
    expect(kernel.requests('who')).toHaveLength(2);
    await answerWho(kernel, BUSY);
    expect(model.state.process.who.status).toBe('busy');
    expect(model.state.process.who.data).toEqual(whoResult());
    await flush(10000);
    expect(kernel.requests('who')).toHaveLength(2);
    kernel.iopubStatus('idle');
    expect(kernel.requests('who')).toHaveLength(3);
    await answerWho(kernel);
    expect(model.state.process.who.status).toBe('ok');
  });

  it('hears the end of the cell from a heartbeat too', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setWhoShown(true);
    const heartbeat = (busy: boolean) => {
      seq += 1;
      kernel.commMsg('comm-1', {
        protocol: 1,
        type: 'heartbeat',
        seq,
        time: 1000 + seq,
        busy
      });
    };
    heartbeat(true);
    await answerWho(kernel, BUSY);
    heartbeat(false);
    expect(kernel.requests('who')).toHaveLength(2);
  });

  it('looks again shortly after a busy for a cell it has not seen', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setWhoShown(true);
    // A cell started as the request left: its busy status is not here yet.
    await answerWho(kernel, BUSY);
    expect(kernel.requests('who')).toHaveLength(1);
    await flush(1000);
    expect(kernel.requests('who')).toHaveLength(2);
    await answerWho(kernel, BUSY);
    await flush(2000);
    expect(kernel.requests('who')).toHaveLength(3);
    await answerWho(kernel, BUSY);
    await flush(4000);
    expect(kernel.requests('who')).toHaveLength(4);
    await answerWho(kernel, BUSY);
    // A few times only; then the end of a cell or Refresh reads.
    await flush(60000);
    expect(kernel.requests('who')).toHaveLength(4);
    expect(model.state.process.who.status).toBe('busy');
    kernel.iopubStatus('busy');
    kernel.iopubStatus('idle');
    expect(kernel.requests('who')).toHaveLength(5);
  });

  it('stops looking when the tab is left', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setWhoShown(true);
    await answerWho(kernel, BUSY);
    model.setWhoShown(false);
    await flush(10000);
    kernel.iopubStatus('busy');
    cellMarker(kernel);
    kernel.iopubStatus('idle');
    expect(kernel.requests('who')).toHaveLength(1);
  });

  it('sends one reading at a time, and reads again if a cell ended meanwhile', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setWhoShown(true);
    void model.who();
    void model.who();
    expect(kernel.requests('who')).toHaveLength(1);
    cellMarker(kernel);
    expect(kernel.requests('who')).toHaveLength(1);
    await answerWho(kernel);
    expect(kernel.requests('who')).toHaveLength(2);
  });

  it('drops the reading of a kernel it left', async () => {
    const { model, kernel, session } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setWhoShown(true);
    const first = kernel.last('who');
    const other = new FakeKernel('k2');
    session.changeKernel(other);
    first.reply(okReply('who', whoResult() as any));
    await flush();
    expect(model.state.kernelId).toBe('k2');
    expect(model.state.process.who.status).toBe('idle');
    expect(model.state.process.who.data).toBeNull();
    // The new kernel is read once it answers.
    await connect(other);
    expect(other.requests('who')).toHaveLength(1);
  });

  it('drops the reading of a process a restart replaced', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setWhoShown(true);
    const first = kernel.last('who');
    kernel.setStatus('restarting');
    first.reply(okReply('who', whoResult() as any));
    await flush();
    expect(model.state.process.who.data).toBeNull();
    kernel.newProcessIdle('process-2');
    await connect(kernel, undefined, 'process-2');
    expect(kernel.requests('who')).toHaveLength(2);
  });

  it('asks nothing of a kernel whose jupyter_gpumem has no who', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel, ['hello', 'sample', 'subscribe', 'unsubscribe']);
    model.setWhoShown(true);
    void model.who();
    kernel.iopubStatus('busy');
    cellMarker(kernel);
    kernel.iopubStatus('idle');
    expect(kernel.requests('who')).toHaveLength(0);
    expect(model.state.process.who.status).toBe('idle');
  });

  it('reports a reading the kernel never answers', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setWhoShown(true);
    await flush(15001);
    expect(model.state.process.who.status).toBe('error');
    expect(model.state.process.who.error?.code).toBe('timeout');
    // No status-line error: the tab says it.
    expect(model.state.lastError).toBeNull();
  });

  it('switches tracking, then reads the lines', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setWhoShown(true);
    await answerWho(kernel);
    const switched = model.setTracking(true);
    expect(kernel.last('track').args).toEqual({ enabled: true });
    expect(model.state.process.pending).toBe('track');
    kernel.last('track').reply(
      okReply('track', {
        tracking: true,
        message: 'allocation tracking is on (replay)'
      })
    );
    await switched;
    expect(model.state.process.tracking).toBe(true);
    expect(model.state.notice?.kind).toBe('tracking');
    expect(kernel.requests('who')).toHaveLength(2);
    const tracked = whoResult({
      tracking: true,
      devices: [
        {
          index: 0,
          by_variable: whoResult().devices[0].by_variable,
          by_line: lineReport()
        }
      ]
    });
    await answerWho(kernel, okReply('who', tracked as any));
    expect(model.state.process.who.data?.devices[0].by_line?.by).toBe('line');
  });

  it('releases the traceback, then reads again', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setWhoShown(true);
    await answerWho(kernel);
    const released = model.releaseTraceback();
    expect(kernel.last('release_traceback').args).toEqual({});
    kernel
      .last('release_traceback')
      .reply(
        okReply('release_traceback', { frames: 3, freed: { '0': 1 << 30 } })
      );
    await released;
    expect(model.state.notice).toEqual({
      kind: 'traceback_released',
      frames: 3,
      freed: { '0': 1 << 30 }
    });
    expect(kernel.requests('who')).toHaveLength(2);
    // Refused (a cell runs): nothing more is read.
    const busy = model.releaseTraceback();
    kernel
      .last('release_traceback')
      .reply(
        errorReply(
          'release_traceback',
          'busy',
          'busy: available when the cell ends'
        )
      );
    await busy;
    expect(model.state.lastError?.code).toBe('busy');
    expect(kernel.requests('who')).toHaveLength(2);
  });
});
