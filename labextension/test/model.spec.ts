import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { ATTACH_CODE } from '../src/kernel/actions';
import { GpuMemModel } from '../src/model';
import { COMM_TARGET } from '../src/protocol';
import { FakeKernel, FakeSession } from './fakes';
import { device, GiB, helloResult, okReply, sample, STREAM } from './fixtures';

async function flush(ms = 0): Promise<void> {
  await vi.advanceTimersByTimeAsync(ms);
}

function setup(kernel = new FakeKernel(), options: GpuMemModel.IOptions = {}) {
  const model = new GpuMemModel(options);
  const session = new FakeSession(kernel);
  model.setSource({ label: 'Untitled.ipynb', sessionContext: session as any });
  return { model, session, kernel };
}

/** Answer hello and subscribe as a loaded kernel side would. */
async function connect(kernel: FakeKernel, commId = 'comm-1'): Promise<void> {
  const hello = helloResult();
  kernel.last('hello').reply(
    okReply('hello', {
      ...hello,
      stream: { ...hello.stream, comm_id: commId }
    })
  );
  await flush();
  kernel
    .last('subscribe')
    .reply(okReply('subscribe', { stream: { ...STREAM, comm_id: commId } }));
  await flush();
}

/** Let time pass while the kernel sends a heartbeat every 2 s. */
async function heartbeats(
  kernel: FakeKernel,
  ms: number,
  commId = 'comm-1'
): Promise<void> {
  for (let t = 0; t < ms; t += 2000) {
    await flush(Math.min(2000, ms - t));
    heartbeatSeq += 1;
    kernel.commMsg(commId, {
      protocol: 1,
      type: 'heartbeat',
      seq: heartbeatSeq,
      time: 1000 + heartbeatSeq,
      busy: false
    });
  }
}

let heartbeatSeq = 0;

beforeEach(() => {
  vi.useFakeTimers();
});

afterEach(() => {
  vi.useRealTimers();
  vi.restoreAllMocks();
});

describe('GpuMemModel', () => {
  it('talks to the kernel only while visible', async () => {
    const { model, kernel } = setup();
    await flush(5000);
    expect(kernel.sent).toHaveLength(0);
    expect(model.state.status.kind).toBe('loading');
    model.setVisible(true);
    expect(kernel.last('hello').msg.content).toEqual({
      protocol: 1,
      action: 'hello',
      args: {}
    });
    expect(kernel.last('hello').msg.header.session).toBe(kernel.clientId);
  });

  it('says "not loaded" when hello gets no reply in 1.5 s', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await flush(1400);
    expect(model.state.status.kind).toBe('loading');
    await flush(200);
    expect(model.state.status.kind).toBe('not_loaded');
    expect(kernel.last('hello').isDisposed).toBe(true);
  });

  it('keeps loading while the kernel starts, and greets it once idle', async () => {
    const kernel = new FakeKernel();
    kernel.status = 'starting';
    const { model } = setup(kernel);
    model.setVisible(true);
    await flush(2000);
    expect(model.state.status.kind).toBe('loading');
    kernel.newProcessIdle('process-1');
    expect(kernel.requests('hello')).toHaveLength(2);
  });

  it('subscribes at the configured interval and applies pushed samples', async () => {
    const { model, kernel } = setup();
    model.configure({ refreshRateMs: 250 });
    model.setVisible(true);
    kernel.last('hello').reply(okReply('hello', helloResult()));
    await flush();
    expect(model.state.status.kind).toBe('ok');
    expect(kernel.last('subscribe').args).toEqual({
      interval_ms: 250,
      client: kernel.clientId
    });
    kernel.last('subscribe').reply(okReply('subscribe', { stream: STREAM }));
    await flush();
    kernel.commMsg('comm-1', {
      protocol: 1,
      type: 'sample',
      seq: 1,
      sample: sample({ time: 1001, devices: [device({ allocated: 5 * GiB })] })
    });
    expect(model.state.process.sample?.devices[0].allocated).toBe(5 * GiB);
  });

  it('attaches to the comm by the id hello names, with no comm_open', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    const hello = helloResult();
    kernel.last('hello').reply(
      okReply('hello', {
        ...hello,
        stream: { ...hello.stream, comm_id: 'kernel-comm' }
      })
    );
    await flush();
    // Created on our side only, before the reply to subscribe.
    expect(kernel.created).toEqual([COMM_TARGET]);
    expect(kernel.hasComm('kernel-comm')).toBe(true);
    expect(kernel.requests('subscribe')).toHaveLength(1);
    // The stream's first messages can outrun the reply to subscribe.
    expect(
      kernel.commMsg('kernel-comm', {
        protocol: 1,
        type: 'open',
        seq: 41,
        stream: { ...STREAM, comm_id: 'kernel-comm' }
      })
    ).toBe(true);
    kernel.commMsg('kernel-comm', {
      protocol: 1,
      type: 'sample',
      seq: 42,
      sample: sample({ time: 1002 })
    });
    expect(model.state.process.sample?.time).toBe(1002);
    expect(model.state.process.lastSeq).toBe(42);
    expect(model.state.process.commId).toBe('kernel-comm');
    kernel.last('subscribe').reply(
      okReply('subscribe', {
        stream: { ...STREAM, comm_id: 'kernel-comm' }
      })
    );
    await flush();
    // The same comm: not created again, numbering goes on.
    expect(kernel.created).toHaveLength(1);
    expect(model.state.process.lastSeq).toBe(42);
    kernel.commMsg('kernel-comm', {
      protocol: 1,
      type: 'sample',
      seq: 43,
      sample: sample({ time: 1003 })
    });
    expect(model.state.process.sample?.time).toBe(1003);
  });

  it('attaches to the comm a subscribe reply names when hello named none', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    const hello = helloResult();
    kernel.last('hello').reply(
      okReply('hello', {
        ...hello,
        stream: { ...hello.stream, comm_id: null }
      })
    );
    await flush();
    expect(kernel.created).toHaveLength(0);
    kernel
      .last('subscribe')
      .reply(okReply('subscribe', { stream: { ...STREAM, comm_id: 'late' } }));
    await flush();
    expect(kernel.hasComm('late')).toBe(true);
    kernel.commMsg('late', {
      protocol: 1,
      type: 'sample',
      seq: 7,
      sample: sample({ time: 1002 })
    });
    expect(model.state.process.sample?.time).toBe(1002);
  });

  it('renews its lease every third of lease_s while shown', async () => {
    const { model, kernel } = setup();
    model.configure({ refreshRateMs: 250 });
    model.setVisible(true);
    await connect(kernel);
    expect(kernel.requests('subscribe')).toHaveLength(1);
    await heartbeats(kernel, 19000);
    expect(kernel.requests('subscribe')).toHaveLength(1);
    await heartbeats(kernel, 1000);
    expect(kernel.requests('subscribe')).toHaveLength(2);
    // The same arguments each time.
    expect(kernel.last('subscribe').args).toEqual({
      interval_ms: 250,
      client: kernel.clientId
    });
    kernel.last('subscribe').reply(okReply('subscribe', { stream: STREAM }));
    await heartbeats(kernel, 20000);
    expect(kernel.requests('subscribe')).toHaveLength(3);
    // The renewal times out: the stream goes on, no polling.
    await heartbeats(kernel, 10000);
    expect(kernel.requests('sample')).toHaveLength(0);
    expect(model.state.lastError).toBeNull();
    await heartbeats(kernel, 10000);
    expect(kernel.requests('subscribe')).toHaveLength(4);
    expect(kernel.requests('sample')).toHaveLength(0);

    // Hidden: unsubscribed, no more renewals.
    kernel.last('subscribe').reply(okReply('subscribe', { stream: STREAM }));
    await flush();
    model.setVisible(false);
    expect(kernel.last('unsubscribe').args).toEqual({
      client: kernel.clientId
    });
    await flush(120000);
    expect(kernel.requests('subscribe')).toHaveLength(4);
  });

  it('sends no renewal while one awaits its reply', async () => {
    const { model, kernel } = setup(new FakeKernel(), {
      requestTimeoutMs: 30000
    });
    model.setVisible(true);
    await connect(kernel);
    await heartbeats(kernel, 20000);
    expect(kernel.requests('subscribe')).toHaveLength(2);
    await heartbeats(kernel, 20000);
    expect(kernel.requests('subscribe')).toHaveLength(2);
    // Timed out at 50 s: the next tick renews.
    await heartbeats(kernel, 20000);
    expect(kernel.requests('subscribe')).toHaveLength(3);
  });

  it('renews at the lease the kernel gives', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    kernel.last('hello').reply(okReply('hello', helloResult()));
    await flush();
    kernel
      .last('subscribe')
      .reply(okReply('subscribe', { stream: { ...STREAM, lease_s: 9 } }));
    await flush();
    await heartbeats(kernel, 2000);
    expect(kernel.requests('subscribe')).toHaveLength(1);
    await heartbeats(kernel, 1000);
    expect(kernel.requests('subscribe')).toHaveLength(2);
    // A longer lease from now on.
    kernel
      .last('subscribe')
      .reply(okReply('subscribe', { stream: { ...STREAM, lease_s: 60 } }));
    await heartbeats(kernel, 19000);
    expect(kernel.requests('subscribe')).toHaveLength(2);
    await heartbeats(kernel, 2000);
    expect(kernel.requests('subscribe')).toHaveLength(3);
  });

  it('renews nothing when the kernel gives no lease', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    kernel.last('hello').reply(okReply('hello', helloResult()));
    await flush();
    kernel
      .last('subscribe')
      .reply(okReply('subscribe', { stream: { ...STREAM, lease_s: 0 } }));
    await flush();
    await heartbeats(kernel, 100000);
    expect(kernel.requests('subscribe')).toHaveLength(1);
  });

  it('unsubscribes a subscription that was answered after the panel hid', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    kernel.last('hello').reply(okReply('hello', helloResult()));
    await flush();
    model.setVisible(false);
    expect(kernel.requests('unsubscribe')).toHaveLength(0);
    kernel.last('subscribe').reply(okReply('subscribe', { stream: STREAM }));
    await flush();
    expect(kernel.last('unsubscribe').args).toEqual({
      client: kernel.clientId
    });
    await flush(60000);
    expect(kernel.requests('subscribe')).toHaveLength(1);
  });

  it('listens on after a comm_close', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    await kernel.commClose('comm-1');
    await flush();
    // Created again with the same id; the stream goes on.
    expect(kernel.hasComm('comm-1')).toBe(true);
    expect(kernel.created).toHaveLength(2);
    kernel.commMsg('comm-1', {
      protocol: 1,
      type: 'sample',
      seq: 5,
      sample: sample({ time: 1005 })
    });
    expect(model.state.process.sample?.time).toBe(1005);
    expect(model.state.process.commId).toBe('comm-1');
    await heartbeats(kernel, 10000);
    expect(kernel.requests('subscribe')).toHaveLength(1);
    expect(kernel.requests('sample')).toHaveLength(0);
  });

  it('drops out-of-order comm messages', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    const push = (seq: number, allocated: number) =>
      kernel.commMsg('comm-1', {
        protocol: 1,
        type: 'sample',
        seq,
        sample: sample({ time: 1000 + seq, devices: [device({ allocated })] })
      });
    push(2, 2 * GiB);
    push(1, 1 * GiB);
    expect(model.state.process.sample?.devices[0].allocated).toBe(2 * GiB);
  });

  it('drops replies from a kernel it no longer follows', async () => {
    const { model, kernel, session } = setup();
    model.setVisible(true);
    const oldHello = kernel.last('hello');
    const other = new FakeKernel('k2');
    session.changeKernel(other);
    expect(model.state.kernelId).toBe('k2');
    oldHello.reply(okReply('hello', helloResult(sample({ time: 5000 }))));
    await flush();
    expect(model.state.status.kind).toBe('loading');
    expect(model.state.process.sample).toBeNull();
    // The new kernel was greeted and is answered normally.
    other.last('hello').reply(okReply('hello', helloResult()));
    await flush();
    expect(model.state.status.kind).toBe('ok');
  });

  it('unsubscribes and drops its comm on kernel change', async () => {
    const { model, kernel, session } = setup();
    model.setVisible(true);
    await connect(kernel);
    session.changeKernel(new FakeKernel('k2'));
    expect(kernel.requests('unsubscribe')).toHaveLength(1);
    expect(kernel.last('unsubscribe').args).toEqual({
      client: kernel.clientId
    });
    expect(kernel.hasComm('comm-1')).toBe(false);
    // Late messages of the old kernel change nothing.
    kernel.commMsg('comm-1', {
      protocol: 1,
      type: 'sample',
      seq: 9,
      sample: sample({ time: 9999 })
    });
    expect(model.state.process.sample).toBeNull();
  });

  it('unsubscribes when hidden and greets again when shown', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setVisible(false);
    expect(kernel.requests('unsubscribe')).toHaveLength(1);
    expect(kernel.last('unsubscribe').args).toEqual({
      client: kernel.clientId
    });
    await flush(10000);
    expect(kernel.requests('hello')).toHaveLength(1);
    model.setVisible(true);
    expect(kernel.requests('hello')).toHaveLength(2);
    // Shown again: figures stay on screen while the kernel answers.
    expect(model.state.status.kind).toBe('ok');
  });

  it('shows a restart and reconnects when the kernel is idle again', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    kernel.setStatus('restarting');
    expect(model.state.status.kind).toBe('restarting');
    expect(model.state.process.sample).toBeNull();
    // The old process's last statuses arrive late: still restarting.
    kernel.setStatus('idle');
    kernel.iopubStatus('idle', 'gpumem_request', 'process-1');
    expect(model.state.status.kind).toBe('restarting');
    expect(kernel.requests('hello')).toHaveLength(1);
    kernel.setStatus('starting');
    kernel.newProcessIdle('process-2');
    expect(kernel.requests('hello')).toHaveLength(2);
    await flush(1600);
    expect(model.state.status.kind).toBe('not_loaded');
  });

  it('ignores the replaced process answering after a restart', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    kernel.setStatus('restarting');
    kernel.newProcessIdle('process-2');
    // The old process, still shutting down, takes the hello.
    kernel.last('hello').reply(okReply('hello', helloResult()), 'process-1');
    await flush();
    expect(model.state.status.kind).toBe('loading');
    expect(kernel.requests('subscribe')).toHaveLength(1);
    await flush(300);
    expect(kernel.requests('hello')).toHaveLength(3);
    // The new process has no extension: no answer.
    await flush(1600);
    expect(model.state.status.kind).toBe('not_loaded');
    // Late comm messages of the old process change nothing either.
    kernel.commMsg('comm-1', {
      protocol: 1,
      type: 'sample',
      seq: 99,
      sample: sample({ time: 9999 })
    });
    expect(model.state.process.sample).toBeNull();
  });

  it('greets again later and later while the replaced process answers', async () => {
    // lumino's backoff draws its delays at random: the middle of each range.
    vi.spyOn(Math, 'random').mockReturnValue(0.5);
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    kernel.setStatus('restarting');
    kernel.newProcessIdle('process-2');
    const times: number[] = [];
    const t0 = Date.now();
    let answered = 0;
    for (let t = 0; t < 20000; t += 100) {
      const hellos = kernel.requests('hello');
      if (hellos.length - 1 > answered) {
        answered += 1;
        times.push(Date.now() - t0);
        kernel
          .last('hello')
          .reply(okReply('hello', helloResult()), 'process-1');
      }
      await flush(100);
    }
    // The first retry 300 ms later, then backing off (every 300 ms: 66).
    expect(times[1] - times[0]).toBe(300);
    expect(times.length).toBeGreaterThan(3);
    expect(times.length).toBeLessThan(20);
    // The new process answers: no more retries.
    while (kernel.requests('hello').length - 1 === answered) {
      await flush(100);
    }
    kernel.last('hello').reply(okReply('hello', helloResult()), 'process-2');
    await flush();
    expect(model.state.status.kind).toBe('ok');
    const hellos = kernel.requests('hello').length;
    await flush(60000);
    expect(kernel.requests('hello')).toHaveLength(hellos);
  });

  it('greets a kernel restarted while the panel was hidden once shown', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setVisible(false);
    kernel.setStatus('restarting');
    kernel.newProcessIdle('process-2');
    expect(kernel.requests('hello')).toHaveLength(1);
    model.setVisible(true);
    expect(kernel.requests('hello')).toHaveLength(2);
  });

  it('shows a dead kernel', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    kernel.setStatus('dead');
    expect(model.state.status.kind).toBe('dead');
    // JupyterLab then disposes the connection.
    kernel.isDisposed = true;
    kernel.disposed.emit(undefined);
    expect(model.state.status.kind).toBe('dead');
    expect(model.state.source).toBe('Untitled.ipynb');
  });

  it('tracks cells as busy, but not its own control requests', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    kernel.iopubStatus('busy', 'gpumem_request');
    expect(model.state.process.busy).toBe(false);
    kernel.iopubStatus('busy');
    expect(model.state.process.busy).toBe(true);
    kernel.iopubStatus('idle');
    expect(model.state.process.busy).toBe(false);
  });

  it('asks again after a cell when the extension was not loaded', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await flush(1600);
    expect(model.state.status.kind).toBe('not_loaded');
    kernel.iopubStatus('busy');
    kernel.iopubStatus('idle');
    expect(kernel.requests('hello')).toHaveLength(2);
    kernel.last('hello').reply(okReply('hello', helloResult()));
    await flush();
    expect(model.state.status.kind).toBe('ok');
  });

  it('asks again when a cell (%load_ext) ended while its hello waited', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await flush(200);
    expect(kernel.requests('hello')).toHaveLength(1);
    // The user's %load_ext runs and ends before the first hello times out.
    kernel.iopubStatus('busy');
    kernel.iopubStatus('idle');
    expect(kernel.requests('hello')).toHaveLength(1);
    await flush(1400);
    expect(model.state.status.kind).toBe('not_loaded');
    expect(kernel.requests('hello')).toHaveLength(2);
    kernel.last('hello').reply(okReply('hello', helloResult()));
    await flush();
    expect(model.state.status.kind).toBe('ok');
  });

  it('attaches with %load_ext when idle, then greets again', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await flush(1600);
    const attached = model.attach();
    await flush();
    expect(kernel.executed).toEqual([
      expect.objectContaining({
        code: ATTACH_CODE,
        silent: true,
        store_history: false,
        stop_on_error: false
      })
    ]);
    expect(kernel.requests('hello')).toHaveLength(2);
    expect(model.state.notice).toEqual({ kind: 'attached' });
    await connect(kernel);
    await attached;
    expect(model.state.status.kind).toBe('ok');
  });

  it('reports a failed attach with the kernel error', async () => {
    const { model, kernel } = setup();
    kernel.executeReply = {
      status: 'error',
      ename: 'ModuleNotFoundError',
      evalue: "No module named 'jupyter_gpumem'",
      traceback: []
    };
    model.setVisible(true);
    await flush(1600);
    await model.attach();
    expect(model.state.status.kind).toBe('not_loaded');
    expect(model.state.lastError?.message).toBe(
      "ModuleNotFoundError: No module named 'jupyter_gpumem'"
    );
  });

  it('does not attach while a cell runs', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await flush(1600);
    kernel.status = 'busy';
    await model.attach();
    expect(kernel.executed).toHaveLength(0);
    expect(model.state.lastError?.action).toBe('attach');
  });

  it('sends actions with their arguments and reports the result', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);

    // No device (torch empties every cache at once) and no gc.collect()
    // (it would stall a running cell).
    const emptied = model.emptyCache();
    expect(kernel.last('empty_cache').args).toEqual({});
    expect(model.state.process.pending).toBe('empty_cache');
    kernel.last('empty_cache').reply(
      okReply('empty_cache', {
        released: { '0': GiB },
        sample: sample({ time: 1001 })
      })
    );
    await emptied;
    expect(model.state.notice).toEqual({
      kind: 'released',
      released: { '0': GiB }
    });

    const capped = model.setLimit(0, { bytes: 24 * GiB });
    expect(kernel.last('set_limit').args).toEqual({
      device: 0,
      bytes: 24 * GiB
    });
    kernel.last('set_limit').reply(
      okReply('set_limit', {
        limit: { fraction: 0.17, bytes: 24 * GiB },
        sample: sample({ time: 1002 })
      })
    );
    await capped;

    const cleared = model.setLimit(0, null);
    expect(kernel.last('set_limit').args).toEqual({ device: 0 });
    kernel
      .last('set_limit')
      .reply(
        okReply('set_limit', { limit: null, sample: sample({ time: 1003 }) })
      );
    await cleared;

    const fraction = model.setLimit(1, { fraction: 0.3 });
    expect(kernel.last('set_limit').args).toEqual({ device: 1, fraction: 0.3 });
    kernel.last('set_limit').reply({
      protocol: 1,
      action: 'set_limit',
      status: 'error',
      error: { code: 'refused', message: 'device 1 out of range' }
    });
    await fraction;
    expect(model.state.lastError).toEqual({
      action: 'set_limit',
      code: 'refused',
      message: 'device 1 out of range'
    });

    const caching = model.setCaching(false);
    expect(kernel.last('set_caching').args).toEqual({ enabled: false });
    kernel.last('set_caching').reply(
      okReply('set_caching', {
        caching: false,
        sample: sample({ time: 1004, caching: false })
      })
    );
    await caching;
    expect(model.state.process.sample?.caching).toBe(false);

    const peak = model.resetPeak();
    expect(kernel.last('reset_peak').args).toEqual({});
    kernel
      .last('reset_peak')
      .reply(okReply('reset_peak', { sample: sample({ time: 1005 }) }));
    await peak;
    expect(model.state.notice).toEqual({ kind: 'peak_reset', device: null });
  });

  it('reports an action the kernel never answers', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    const peak = model.resetPeak();
    await flush(10001);
    await peak;
    expect(model.state.lastError?.code).toBe('timeout');
    expect(model.state.process.pending).toBeNull();
  });

  it('re-subscribes when the stream goes quiet', async () => {
    const { kernel, model } = setup();
    model.setVisible(true);
    await connect(kernel);
    expect(kernel.requests('subscribe')).toHaveLength(1);
    // Heartbeats every 2 s: three missed ones mean the stream is gone.
    await flush(5000);
    kernel.commMsg('comm-1', {
      protocol: 1,
      type: 'heartbeat',
      seq: 1,
      time: 1005,
      busy: false
    });
    await flush(5000);
    expect(kernel.requests('subscribe')).toHaveLength(1);
    await flush(5000);
    expect(kernel.requests('subscribe')).toHaveLength(2);
  });

  it('falls back to polling when the connection cannot handle comms', async () => {
    const kernel = new FakeKernel();
    kernel.handleComms = false;
    const { model } = setup(kernel);
    model.setVisible(true);
    kernel.last('hello').reply(okReply('hello', helloResult()));
    await flush(600);
    expect(kernel.requests('subscribe')).toHaveLength(0);
    expect(kernel.requests('sample')).toHaveLength(1);
    // No new request while one awaits its reply.
    await flush(1000);
    expect(kernel.requests('sample')).toHaveLength(1);
    kernel
      .last('sample')
      .reply(okReply('sample', { sample: sample({ time: 1500 }) }));
    await flush();
    expect(model.state.process.sample?.time).toBe(1500);
    await flush(500);
    expect(kernel.requests('sample')).toHaveLength(2);
  });

  it('polls less often while the kernel does not answer', async () => {
    // lumino's backoff draws its delays at random: the middle of each range.
    vi.spyOn(Math, 'random').mockReturnValue(0.5);
    const kernel = new FakeKernel();
    kernel.handleComms = false;
    const { model } = setup(kernel, { requestTimeoutMs: 1000 });
    model.setVisible(true);
    kernel.last('hello').reply(okReply('hello', helloResult()));
    await flush(60000);
    // Every 1.5 s without backing off (500 ms, then 1 s to time out): 40.
    const unanswered = kernel.requests('sample').length;
    expect(unanswered).toBeGreaterThan(3);
    expect(unanswered).toBeLessThan(20);
    // An answer again: every refresh interval again.
    while (kernel.requests('sample').length === unanswered) {
      await flush(100);
    }
    kernel
      .last('sample')
      .reply(okReply('sample', { sample: sample({ time: 1500 }) }));
    await flush(500);
    expect(kernel.requests('sample')).toHaveLength(unanswered + 2);
    expect(model.state.process.sample?.time).toBe(1500);
  });

  it('follows no kernel when the source goes away', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    model.setSource(null);
    expect(model.state.status.kind).toBe('no_kernel');
    expect(kernel.hasComm('comm-1')).toBe(false);
    expect(kernel.last('unsubscribe').args).toEqual({
      client: kernel.clientId
    });
  });

  it('attaches to the comm of a restarted kernel', async () => {
    const { model, kernel } = setup();
    model.setVisible(true);
    await connect(kernel);
    kernel.setStatus('restarting');
    expect(kernel.hasComm('comm-1')).toBe(false);
    kernel.newProcessIdle('process-2');
    const hello = helloResult();
    kernel.last('hello').reply(
      okReply('hello', {
        ...hello,
        stream: { ...hello.stream, comm_id: 'comm-2' }
      }),
      'process-2'
    );
    await flush();
    expect(kernel.hasComm('comm-2')).toBe(true);
    kernel.commMsg(
      'comm-2',
      { protocol: 1, type: 'sample', seq: 1, sample: sample({ time: 2001 }) },
      'process-2'
    );
    expect(model.state.process.sample?.time).toBe(2001);
    expect(model.state.process.commId).toBe('comm-2');
  });
});
