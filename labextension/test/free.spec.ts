/**
 * The Free of the Who tab (`free`): the state it goes through (preview,
 * free, done; busy, refused, no answer) and what the model sends for it: the
 * preview first, the free on confirmation, then `who` read again.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { GpuMemModel } from '../src/model';
import {
  FreeOrigin,
  GpuMemEvent,
  IGpuMemState,
  initialState,
  reduce
} from '../src/state';
import { FakeKernel, FakeSession } from './fakes';
import {
  errorReply,
  freeReport,
  helloResult,
  MiB,
  okReply,
  sample,
  STREAM,
  whoResult
} from './fixtures';

const BASE: FreeOrigin = { kind: 'owner', device: 0, key: 'base' };
const BUSY = 'busy: available when the cell ends';

function stateAfter(events: GpuMemEvent[]): IGpuMemState {
  const all: GpuMemEvent[] = [
    { type: 'follow', kernelId: 'k1', source: 'a.ipynb' },
    { type: 'reply', action: 'hello', reply: okReply('hello', helloResult()) },
    ...events
  ];
  return all.reduce(reduce, initialState());
}

const previewSent: GpuMemEvent = {
  type: 'free_sent',
  names: ['base'],
  dry: true,
  origin: BASE
};
const freeSent: GpuMemEvent = { ...previewSent, dry: false };

function freeReply(
  dry: boolean,
  reply: any,
  names: string[] = ['base']
): GpuMemEvent {
  return { type: 'reply', action: 'free', reply, args: { names, dry } };
}

const previewed = freeReply(
  true,
  okReply('free', { report: freeReport(), sample: sample() })
);

describe('the Free state', () => {
  it('opens at its row, shows the preview, then what the free did', () => {
    const waiting = stateAfter([previewSent]).process.free;
    expect(waiting).toMatchObject({
      names: ['base'],
      origin: BASE,
      status: 'previewing',
      dry: true,
      preview: null
    });
    const preview = stateAfter([previewSent, previewed]).process.free;
    expect(preview?.status).toBe('preview');
    expect(preview?.preview?.let_go.map(g => g.code)).toEqual([
      'del base',
      'del view'
    ]);
    // Free it: the preview stays on screen while the free goes.
    const freeing = stateAfter([previewSent, previewed, freeSent]).process.free;
    expect(freeing?.status).toBe('freeing');
    expect(freeing?.preview).toEqual(freeReport());
    const after = sample({ time: 2000, devices: [] });
    const done = stateAfter([
      previewSent,
      previewed,
      freeSent,
      freeReply(
        false,
        okReply('free', {
          report: freeReport({ done: true }, 64 * MiB),
          sample: after
        })
      )
    ]);
    expect(done.process.free?.status).toBe('done');
    expect(done.process.free?.result?.devices[0].returned).toBe(64 * MiB);
    // The sample after the free moves the figures.
    expect(done.process.sample).toEqual(after);
    // Not the status line's business.
    expect(done.notice).toBeNull();
    expect(done.lastError).toBeNull();
  });

  it('says busy, and the kernel lets go of nothing then', () => {
    const state = stateAfter([
      previewSent,
      previewed,
      freeSent,
      freeReply(false, errorReply('free', 'busy', BUSY))
    ]);
    expect(state.process.free).toMatchObject({
      status: 'busy',
      dry: false,
      error: { action: 'free', code: 'busy', message: BUSY }
    });
    // The plan is kept for the retry.
    expect(state.process.free?.preview).toEqual(freeReport());
  });

  it("keeps the kernel's refusal and a missing answer", () => {
    const refused = stateAfter([
      previewSent,
      freeReply(
        true,
        errorReply(
          'free',
          'refused',
          "'bse' is not a variable of this kernel (did you mean base?): name a variable, Out[N] or _"
        )
      )
    ]).process.free;
    expect(refused?.status).toBe('error');
    expect(refused?.error?.message).toContain('did you mean base?');
    const timeout = stateAfter([
      previewSent,
      { type: 'no_reply', action: 'free' }
    ]).process.free;
    expect(timeout?.error).toEqual({
      action: 'free',
      code: 'timeout',
      message: ''
    });
    const lost = stateAfter([
      previewSent,
      { type: 'free_failed', code: 'local', message: 'no kernel' }
    ]).process.free;
    expect(lost?.error?.code).toBe('local');
  });

  it('drops an answer nobody waits for', () => {
    // Closed while the preview travelled.
    const closed = stateAfter([
      previewSent,
      { type: 'free_closed' },
      previewed
    ]);
    expect(closed.process.free).toBeNull();
    // Another name's answer, or the preview's answer to a free.
    const other = stateAfter([
      previewSent,
      freeReply(
        true,
        okReply('free', { report: freeReport(), sample: sample() }),
        ['a']
      )
    ]);
    expect(other.process.free?.status).toBe('previewing');
    const dry = stateAfter([previewSent, previewed, freeSent, previewed]);
    expect(dry.process.free?.status).toBe('freeing');
  });

  it('one at a time, and gone with the kernel process', () => {
    const second = stateAfter([
      previewSent,
      { ...previewSent, names: ['a'], origin: { ...BASE, key: 'a' } }
    ]);
    expect(second.process.free?.names).toEqual(['base']);
    // Another row's preview replaces an answered one.
    const moved = stateAfter([
      previewSent,
      previewed,
      { ...previewSent, names: ['a'], origin: { ...BASE, key: 'a' } }
    ]);
    expect(moved.process.free).toMatchObject({
      names: ['a'],
      status: 'previewing',
      preview: null
    });
    const restarted = stateAfter([
      previewSent,
      previewed,
      { type: 'kernel_status', status: 'restarting' }
    ]);
    expect(restarted.process.free).toBeNull();
  });
});

async function flush(ms = 0): Promise<void> {
  await vi.advanceTimersByTimeAsync(ms);
}

async function connected() {
  const kernel = new FakeKernel();
  const model = new GpuMemModel();
  model.setSource({
    label: 'Untitled.ipynb',
    sessionContext: new FakeSession(kernel) as any
  });
  model.setVisible(true);
  const hello = helloResult();
  kernel
    .last('hello')
    .reply(
      okReply('hello', { ...hello, stream: { ...STREAM, comm_id: 'comm-1' } })
    );
  await flush();
  kernel
    .last('subscribe')
    .reply(okReply('subscribe', { stream: { ...STREAM, comm_id: 'comm-1' } }));
  await flush();
  model.setWhoShown(true);
  kernel.last('who').reply(okReply('who', whoResult() as any));
  await flush();
  return { model, kernel };
}

beforeEach(() => {
  vi.useFakeTimers();
});

afterEach(() => {
  vi.useRealTimers();
});

describe('the model frees', () => {
  it('asks for the preview, frees on confirmation, then reads who again', async () => {
    const { model, kernel } = await connected();
    expect(kernel.requests('who')).toHaveLength(1);
    const preview = model.previewFree(['base'], BASE);
    expect(kernel.last('free').args).toEqual({ names: ['base'], dry: true });
    // One at a time: a second click while it travels sends nothing.
    void model.previewFree(['a'], { ...BASE, key: 'a' });
    expect(kernel.requests('free')).toHaveLength(1);
    kernel
      .last('free')
      .reply(okReply('free', { report: freeReport(), sample: sample() }));
    await preview;
    expect(model.state.process.free?.status).toBe('preview');
    // A preview changes nothing: who is not read again.
    expect(kernel.requests('who')).toHaveLength(1);
    const freed = model.confirmFree();
    expect(kernel.last('free').args).toEqual({ names: ['base'], dry: false });
    kernel.last('free').reply(
      okReply('free', {
        report: freeReport({ done: true }, 64 * MiB),
        sample: sample({ time: 2000 })
      })
    );
    await freed;
    expect(model.state.process.free?.status).toBe('done');
    expect(kernel.requests('who')).toHaveLength(2);
    model.closeFree();
    expect(model.state.process.free).toBeNull();
  });

  it('reads nothing again when the kernel was busy, and retries on request', async () => {
    const { model, kernel } = await connected();
    const preview = model.previewFree(['base'], BASE);
    kernel.last('free').reply(errorReply('free', 'busy', BUSY));
    await preview;
    expect(model.state.process.free?.status).toBe('busy');
    expect(kernel.requests('who')).toHaveLength(1);
    const retry = model.retryFree();
    expect(kernel.requests('free')).toHaveLength(2);
    expect(kernel.last('free').args).toEqual({ names: ['base'], dry: true });
    kernel
      .last('free')
      .reply(okReply('free', { report: freeReport(), sample: sample() }));
    await retry;
    expect(model.state.process.free?.status).toBe('preview');
    // Refused when confirmed (say, a name went meanwhile): who is not read.
    const freed = model.confirmFree();
    kernel
      .last('free')
      .reply(
        errorReply(
          'free',
          'refused',
          "'base' is not a variable of this kernel: name a variable, Out[N] or _"
        )
      );
    await freed;
    expect(model.state.process.free?.status).toBe('error');
    expect(kernel.requests('who')).toHaveLength(1);
  });

  it('says so when the kernel does not answer', async () => {
    const { model, kernel } = await connected();
    const preview = model.previewFree(['base'], BASE);
    await flush(16000);
    await preview;
    expect(model.state.process.free?.error?.code).toBe('timeout');
    expect(kernel.requests('free')).toHaveLength(1);
  });
});
