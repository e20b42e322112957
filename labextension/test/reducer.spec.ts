import { describe, expect, it } from 'vitest';

import { GpuMemEvent, IGpuMemState, initialState, reduce } from '../src/state';
import {
  device,
  errorReply,
  GiB,
  helloResult,
  lineReport,
  okReply,
  postmortem,
  sample,
  STREAM,
  uninitializedDevice,
  whoResult
} from './fixtures';

function run(
  events: GpuMemEvent[],
  start: IGpuMemState = initialState()
): IGpuMemState {
  return events.reduce(reduce, start);
}

const follow: GpuMemEvent = {
  type: 'follow',
  kernelId: 'k1',
  source: 'Untitled.ipynb'
};

function commSample(seq: number, time: number, allocated: number): GpuMemEvent {
  return {
    type: 'comm',
    commId: 'comm-1',
    data: {
      protocol: 1,
      type: 'sample',
      seq,
      sample: sample({
        time,
        devices: [device({ allocated, reserved: 2 * allocated })]
      })
    }
  };
}

describe('reduce: connecting', () => {
  it('starts with no kernel and loads once one is followed', () => {
    expect(initialState().status.kind).toBe('no_kernel');
    const state = run([follow]);
    expect(state.status.kind).toBe('loading');
    expect(state.source).toBe('Untitled.ipynb');
  });

  it('reports "not loaded" when hello gets no reply', () => {
    const state = run([
      follow,
      { type: 'hello_sent', quiet: false },
      { type: 'hello_timeout' }
    ]);
    expect(state.status.kind).toBe('not_loaded');
  });

  it('takes the state, version and actions from the hello reply', () => {
    const state = run([
      follow,
      { type: 'reply', action: 'hello', reply: okReply('hello', helloResult()) }
    ]);
    expect(state.status.kind).toBe('ok');
    expect(state.version).toBe('0.1.0');
    expect(state.actions).toContain('empty_cache');
    expect(state.process.sample?.devices[0].allocated).toBe(1 * GiB);
    expect(state.process.history[0]).toEqual([
      { time: 1000, allocated: 1 * GiB, reserved: 2 * GiB, process: 2.5 * GiB }
    ]);
  });

  it.each([
    ['no_torch', 'torch is not imported in this kernel yet'],
    ['cpu_only', 'torch was built without CUDA'],
    ['no_gpu', 'no GPU found'],
    ['not_initialized', '']
  ] as const)('maps sample state %s to the panel state', (kind, message) => {
    const s = sample({
      state: kind,
      message,
      devices: kind === 'not_initialized' ? [uninitializedDevice()] : []
    });
    const state = run([
      follow,
      {
        type: 'reply',
        action: 'hello',
        reply: okReply('hello', helloResult(s))
      }
    ]);
    expect(state.status.kind).toBe(kind);
    // NVML-only devices give no trend points.
    expect(state.process.history).toEqual({});
  });

  it('shows an incompatible kernel side instead of pretending it is absent', () => {
    const state = run([
      follow,
      {
        type: 'reply',
        action: 'hello',
        reply: errorReply(
          'hello',
          'unsupported_protocol',
          'protocol 1 is not supported'
        )
      }
    ]);
    expect(state.status).toEqual({
      kind: 'incompatible',
      message: 'protocol 1 is not supported'
    });
  });

  it('ignores replies when no kernel is followed', () => {
    const state = reduce(initialState(), {
      type: 'reply',
      action: 'hello',
      reply: okReply('hello', helloResult())
    });
    expect(state.status.kind).toBe('no_kernel');
  });
});

describe('reduce: stream', () => {
  const hello: GpuMemEvent = {
    type: 'reply',
    action: 'hello',
    reply: okReply('hello', helloResult())
  };
  const subscribed: GpuMemEvent = {
    type: 'reply',
    action: 'subscribe',
    reply: okReply('subscribe', { stream: STREAM })
  };

  it('applies pushed samples in order and builds the trend', () => {
    const state = run([
      follow,
      hello,
      subscribed,
      commSample(1, 1001, 2 * GiB),
      commSample(2, 1002, 3 * GiB)
    ]);
    expect(state.process.commId).toBe('comm-1');
    expect(state.process.lastSeq).toBe(2);
    expect(state.process.sample?.devices[0].allocated).toBe(3 * GiB);
    expect(state.process.history[0].map(p => p.allocated)).toEqual([
      1 * GiB,
      2 * GiB,
      3 * GiB
    ]);
  });

  it('drops out-of-order and duplicate messages', () => {
    const state = run([
      follow,
      hello,
      subscribed,
      commSample(5, 1005, 5 * GiB),
      commSample(4, 1004, 4 * GiB),
      commSample(5, 1005, 6 * GiB)
    ]);
    expect(state.process.lastSeq).toBe(5);
    expect(state.process.sample?.devices[0].allocated).toBe(5 * GiB);
    expect(state.process.history[0].map(p => p.allocated)).toEqual([
      1 * GiB,
      5 * GiB
    ]);
  });

  it('drops a reply sample older than a pushed one', () => {
    const state = run([
      follow,
      hello,
      commSample(1, 1010, 7 * GiB),
      {
        type: 'reply',
        action: 'sample',
        reply: okReply('sample', { sample: sample({ time: 1005 }) })
      }
    ]);
    expect(state.process.sample?.time).toBe(1010);
    expect(state.process.sample?.devices[0].allocated).toBe(7 * GiB);
  });

  it('restarts numbering on a new comm', () => {
    const state = run([
      follow,
      hello,
      commSample(9, 1001, 2 * GiB),
      {
        type: 'comm',
        commId: 'comm-2',
        data: {
          protocol: 1,
          type: 'sample',
          seq: 0,
          sample: sample({ time: 1002 })
        }
      }
    ]);
    expect(state.process.commId).toBe('comm-2');
    expect(state.process.lastSeq).toBe(0);
    expect(state.process.sample?.time).toBe(1002);
  });

  it('takes the comm id from hello and subscribe replies', () => {
    let state = run([follow, hello]);
    expect(state.process.commId).toBe('comm-1');
    state = reduce(state, commSample(3, 1003, GiB));
    state = reduce(state, subscribed);
    // The same comm: numbering goes on.
    expect(state.process.lastSeq).toBe(3);
    state = reduce(state, {
      type: 'reply',
      action: 'subscribe',
      reply: okReply('subscribe', { stream: { ...STREAM, comm_id: 'comm-9' } })
    });
    expect(state.process.commId).toBe('comm-9');
    expect(state.process.lastSeq).toBeNull();
  });

  it('keeps numbering across a restarted stream on the same comm', () => {
    const restarted = { ...STREAM, interval_ms: 250, clients: 2 };
    const state = run([
      follow,
      hello,
      subscribed,
      commSample(5, 1005, 5 * GiB),
      {
        type: 'comm',
        commId: 'comm-1',
        data: { protocol: 1, type: 'open', seq: 6, stream: restarted }
      },
      // Older than the open: dropped.
      commSample(4, 1004, 4 * GiB),
      commSample(7, 1007, 7 * GiB)
    ]);
    expect(state.process.stream).toEqual(restarted);
    expect(state.process.lastSeq).toBe(7);
    expect(state.process.sample?.devices[0].allocated).toBe(7 * GiB);
    expect(state.process.history[0].map(p => p.allocated)).toEqual([
      1 * GiB,
      5 * GiB,
      7 * GiB
    ]);
  });

  it('reads busy and time from heartbeats', () => {
    const state = run([
      follow,
      hello,
      {
        type: 'comm',
        commId: 'comm-1',
        data: { protocol: 1, type: 'heartbeat', seq: 1, time: 1030, busy: true }
      }
    ]);
    expect(state.process.busy).toBe(true);
    expect(state.process.lastHeard).toBe(1030);
  });

  it('keeps cell markers', () => {
    const cell = {
      execution_count: 3,
      time: 1003,
      wall_time: 1.5,
      failed: false,
      first_line: 'x = torch.empty(2**30, dtype=torch.uint8, device="cuda")',
      devices: [
        {
          index: 0,
          allocated_delta: GiB,
          reserved_delta: GiB,
          peak_allocated: 2 * GiB
        }
      ]
    };
    const state = run([
      follow,
      hello,
      {
        type: 'comm',
        commId: 'comm-1',
        data: { protocol: 1, type: 'cell', seq: 1, cell }
      }
    ]);
    expect(state.process.cells).toEqual([cell]);
  });

  it('forgets trend points older than the trend length', () => {
    let state = run([follow, hello], initialState(1));
    for (let i = 1; i <= 5; i++) {
      state = reduce(state, commSample(i, 1000 + i * 30, i * GiB));
    }
    // Newest at 1150: one minute back is 1090.
    expect(state.process.history[0].map(p => p.time)).toEqual([
      1090, 1120, 1150
    ]);
    state = reduce(state, { type: 'configure', trendMinutes: 0.5 });
    expect(state.process.history[0].map(p => p.time)).toEqual([1120, 1150]);
  });
});

describe('reduce: kernel lifecycle', () => {
  const hello: GpuMemEvent = {
    type: 'reply',
    action: 'hello',
    reply: okReply('hello', helloResult())
  };

  it('forgets the process on restart and shows "restarting"', () => {
    const state = run([
      follow,
      hello,
      commSample(1, 1001, GiB),
      { type: 'kernel_status', status: 'restarting' }
    ]);
    expect(state.status.kind).toBe('restarting');
    expect(state.process.sample).toBeNull();
    expect(state.process.history).toEqual({});
    expect(state.process.lastSeq).toBeNull();
  });

  it('shows a dead kernel and ignores late comm messages', () => {
    const state = run([
      follow,
      hello,
      { type: 'kernel_status', status: 'dead' },
      commSample(1, 1001, GiB)
    ]);
    expect(state.status.kind).toBe('dead');
    expect(state.process.sample).toBeNull();
  });

  it('greets again after a restart', () => {
    const state = run([
      follow,
      hello,
      { type: 'kernel_status', status: 'autorestarting' },
      { type: 'hello_sent', quiet: false },
      { type: 'hello_timeout' }
    ]);
    expect(state.status.kind).toBe('not_loaded');
  });

  it('does not call a restarting kernel "not loaded"', () => {
    const state = run([
      follow,
      { type: 'kernel_status', status: 'restarting' },
      { type: 'hello_timeout' }
    ]);
    expect(state.status.kind).toBe('restarting');
  });

  it('starts afresh when another kernel is followed', () => {
    const state = run([
      follow,
      hello,
      { type: 'follow', kernelId: 'k2', source: 'Other.ipynb' }
    ]);
    expect(state.status.kind).toBe('loading');
    expect(state.process.sample).toBeNull();
    expect(state.kernelId).toBe('k2');
  });
});

describe('reduce: actions', () => {
  const hello: GpuMemEvent = {
    type: 'reply',
    action: 'hello',
    reply: okReply('hello', helloResult())
  };

  it('reports released bytes and applies the sample of the reply', () => {
    const after = sample({ time: 1001, devices: [device({ reserved: GiB })] });
    const state = run([
      follow,
      hello,
      { type: 'pending', action: 'empty_cache' },
      {
        type: 'reply',
        action: 'empty_cache',
        reply: okReply('empty_cache', { released: { '0': GiB }, sample: after })
      }
    ]);
    expect(state.process.pending).toBeNull();
    expect(state.notice).toEqual({ kind: 'released', released: { '0': GiB } });
    expect(state.process.sample?.devices[0].reserved).toBe(GiB);
  });

  it('shows the real caching state from the reply', () => {
    const state = run([
      follow,
      hello,
      {
        type: 'reply',
        action: 'set_caching',
        args: { enabled: false },
        reply: okReply('set_caching', {
          caching: true,
          sample: sample({ time: 1001 })
        })
      }
    ]);
    expect(state.notice).toEqual({
      kind: 'caching',
      requested: false,
      caching: true
    });
  });

  it('keeps the reason of a refused action', () => {
    const state = run([
      follow,
      hello,
      { type: 'pending', action: 'set_limit' },
      {
        type: 'reply',
        action: 'set_limit',
        args: { device: 3, bytes: GiB },
        reply: errorReply('set_limit', 'refused', 'device 3 out of range')
      }
    ]);
    expect(state.process.pending).toBeNull();
    expect(state.lastError).toEqual({
      action: 'set_limit',
      code: 'refused',
      message: 'device 3 out of range'
    });
  });

  it('reports the new cap', () => {
    const limit = { fraction: 0.25, bytes: 35 * GiB };
    const state = run([
      follow,
      hello,
      {
        type: 'reply',
        action: 'set_limit',
        args: { device: 0, fraction: 0.25 },
        reply: okReply('set_limit', {
          limit,
          sample: sample({ time: 1001, devices: [device({ limit })] })
        })
      }
    ]);
    expect(state.notice).toEqual({ kind: 'limit', device: 0, limit });
    expect(state.process.sample?.devices[0].limit).toEqual(limit);
  });

  it('reports an action without reply', () => {
    const state = run([
      follow,
      hello,
      { type: 'pending', action: 'reset_peak' },
      { type: 'no_reply', action: 'reset_peak' }
    ]);
    expect(state.process.pending).toBeNull();
    expect(state.lastError?.code).toBe('timeout');
  });

  it('says so when the kernel loaded the extension but it does not answer', () => {
    const state = run([
      follow,
      { type: 'hello_timeout' },
      { type: 'pending', action: 'attach' },
      { type: 'attach_result', error: null },
      { type: 'hello_sent', quiet: false },
      { type: 'hello_timeout' }
    ]);
    expect(state.status.kind).toBe('not_loaded');
    expect(state.notice).toBeNull();
    expect(state.lastError?.code).toBe('no_answer');
  });

  it('forgets a failed attach once the kernel answers', () => {
    const state = run([
      follow,
      { type: 'hello_timeout' },
      { type: 'attach_result', error: 'NameError: x' },
      { type: 'reply', action: 'hello', reply: okReply('hello', helloResult()) }
    ]);
    expect(state.status.kind).toBe('ok');
    expect(state.lastError).toBeNull();
  });

  it('reports a failed attach with the kernel error', () => {
    const state = run([
      follow,
      { type: 'hello_timeout' },
      { type: 'pending', action: 'attach' },
      {
        type: 'attach_result',
        error: "ModuleNotFoundError: No module named 'jupyter_gpumem'"
      }
    ]);
    expect(state.status.kind).toBe('not_loaded');
    expect(state.lastError?.message).toContain('ModuleNotFoundError');
  });
});

describe('reduce: who holds it', () => {
  const connected: GpuMemEvent[] = [
    follow,
    { type: 'reply', action: 'hello', reply: okReply('hello', helloResult()) }
  ];
  const whoOk = (result = whoResult(), at = 5000): GpuMemEvent => ({
    type: 'reply',
    action: 'who',
    reply: okReply('who', result as any),
    at
  });
  const whoError = (code: string, message: string): GpuMemEvent => ({
    type: 'reply',
    action: 'who',
    reply: errorReply('who', code, message)
  });
  const sent: GpuMemEvent = { type: 'who_sent' };

  it('starts unread, loads, then keeps the reading with its time', () => {
    expect(run(connected).process.who).toEqual({
      status: 'idle',
      data: null,
      error: null,
      fetchedAt: null
    });
    expect(run([...connected, sent]).process.who.status).toBe('loading');
    const result = whoResult({
      tracking: true,
      devices: [
        {
          index: 0,
          by_variable: whoResult().devices[0].by_variable,
          by_line: lineReport()
        }
      ],
      postmortems: [postmortem()]
    });
    const state = run([...connected, sent, whoOk(result, 1234)]);
    expect(state.process.who.status).toBe('ok');
    expect(state.process.who.data).toEqual(result);
    expect(state.process.who.fetchedAt).toBe(1234);
    expect(state.process.tracking).toBe(true);
    expect(state.process.postmortems).toEqual([postmortem()]);
    // A reading is not an action of the status line.
    expect(state.notice).toBeNull();
    expect(state.lastError).toBeNull();
    expect(state.process.pending).toBeNull();
  });

  it('keeps the last reading while the next one loads', () => {
    const state = run([...connected, sent, whoOk(), sent]);
    expect(state.process.who.status).toBe('loading');
    expect(state.process.who.data).toEqual(whoResult());
    expect(state.process.who.fetchedAt).toBe(5000);
  });

  it('says busy while a cell runs, keeping the older reading', () => {
    const state = run([
      ...connected,
      sent,
      whoOk(),
      sent,
      whoError('busy', 'busy: available when the cell ends')
    ]);
    expect(state.process.who.status).toBe('busy');
    expect(state.process.who.error).toBeNull();
    expect(state.process.who.data).toEqual(whoResult());
    expect(state.lastError).toBeNull();
  });

  it('keeps the kernel reason of a refused or failed reading in the tab', () => {
    const reason =
      'torch is not imported in this kernel: PyTorch holds no GPU memory';
    const state = run([...connected, sent, whoError('refused', reason)]);
    expect(state.process.who.status).toBe('error');
    expect(state.process.who.error).toEqual({
      action: 'who',
      code: 'refused',
      message: reason
    });
    expect(state.lastError).toBeNull();
    const again = run([sent], state);
    expect(again.process.who.status).toBe('loading');
    expect(again.process.who.error).toBeNull();
  });

  it('reports a reading that got no answer', () => {
    expect(
      run([...connected, sent, { type: 'no_reply', action: 'who' }]).process.who
    ).toMatchObject({ status: 'error', error: { code: 'timeout' } });
    expect(
      run([
        ...connected,
        sent,
        { type: 'who_failed', code: 'local', message: 'no kernel' }
      ]).process.who
    ).toMatchObject({
      status: 'error',
      error: { code: 'local', message: 'no kernel' }
    });
  });

  it('drops a reading nobody asked for: another kernel, a restart', () => {
    // Asked of k1, answered after the panel followed k2.
    const other = run([
      ...connected,
      sent,
      { type: 'follow', kernelId: 'k2', source: 'b.ipynb' }
    ]);
    expect(other.process.who.status).toBe('idle');
    expect(run([whoOk()], other).process.who).toEqual(other.process.who);
    // Asked before a restart, answered by the old process.
    const restarted = run([
      ...connected,
      sent,
      whoOk(whoResult({ tracking: true, postmortems: [postmortem()] })),
      sent,
      { type: 'kernel_status', status: 'restarting' }
    ]);
    expect(restarted.process.who.status).toBe('idle');
    expect(restarted.process.who.data).toBeNull();
    expect(restarted.process.tracking).toBeNull();
    expect(restarted.process.postmortems).toEqual([]);
    const late = run([whoOk()], restarted);
    expect(late).toBe(restarted);
    // With no kernel nothing is read.
    const none = run([{ type: 'follow', kernelId: null, source: null }, sent]);
    expect(none.process.who.status).toBe('idle');
  });

  it('takes post-mortems and kept lines from cell markers', () => {
    const marker = (seq: number, extra: Record<string, unknown>) =>
      ({
        type: 'comm',
        commId: 'comm-1',
        data: {
          protocol: 1,
          type: 'cell',
          seq,
          cell: {
            execution_count: seq,
            time: 1000 + seq,
            wall_time: 0.1,
            failed: false,
            first_line: 'x = 1',
            devices: [
              {
                index: 0,
                allocated_delta: 3 * GiB,
                reserved_delta: 3 * GiB,
                peak_allocated: 3 * GiB,
                kept_at: [{ line: 1, text: 'x = 1', bytes: 3 * GiB, blocks: 1 }]
              }
            ],
            ...extra
          }
        }
      }) as GpuMemEvent;
    const oom = postmortem({ requested: 2 * GiB });
    const state = run([
      ...connected,
      marker(1, { failed: true, postmortems: [oom] })
    ]);
    expect(state.process.postmortems).toEqual([oom]);
    expect(state.process.cells[0].devices[0].kept_at?.[0].line).toBe(1);
    // The kernel keeps them until the next out-of-memory error.
    expect(run([marker(2, {})], state).process.postmortems).toEqual([oom]);
    expect(
      run([marker(2, { postmortems: [] })], state).process.postmortems
    ).toEqual([oom]);
  });

  it('reads tracking as {active, wanted} from hello and track, and the old boolean', () => {
    const hello = (tracking: unknown): GpuMemEvent => ({
      type: 'reply',
      action: 'hello',
      reply: okReply('hello', { ...helloResult(), tracking } as any)
    });
    const wanted = run([follow, hello({ active: false, wanted: true })]);
    expect(wanted.process.tracking).toBe(false);
    expect(wanted.process.trackingWanted).toBe(true);
    const on = run([follow, hello({ active: true, wanted: false })]);
    expect([on.process.tracking, on.process.trackingWanted]).toEqual([
      true,
      true
    ]);
    // A kernel before revision 3 says nothing: unknown stays unknown.
    const old = run([follow, hello(undefined)]);
    expect([old.process.tracking, old.process.trackingWanted]).toEqual([
      null,
      false
    ]);
    const off = run([
      ...connected,
      {
        type: 'reply',
        action: 'track',
        reply: okReply('track', {
          tracking: { active: false, wanted: false },
          message: 'allocation tracking is off'
        }),
        args: { enabled: false }
      }
    ]);
    expect([off.process.tracking, off.process.trackingWanted]).toEqual([
      false,
      false
    ]);
  });

  it('words the track and release_traceback replies in the status line', () => {
    const tracked = run([
      ...connected,
      { type: 'pending', action: 'track' },
      {
        type: 'reply',
        action: 'track',
        reply: okReply('track', {
          tracking: true,
          message: 'allocation tracking is on (replay)'
        }),
        args: { enabled: true }
      }
    ]);
    expect(tracked.process.pending).toBeNull();
    expect(tracked.process.tracking).toBe(true);
    expect(tracked.notice).toEqual({
      kind: 'tracking',
      requested: true,
      tracking: true,
      message: 'allocation tracking is on (replay)'
    });
    const released = run([
      ...connected,
      { type: 'pending', action: 'release_traceback' },
      {
        type: 'reply',
        action: 'release_traceback',
        reply: okReply('release_traceback', {
          frames: 2,
          freed: { '0': 1 * GiB }
        })
      }
    ]);
    expect(released.notice).toEqual({
      kind: 'traceback_released',
      frames: 2,
      freed: { '0': 1 * GiB }
    });
    const busy = run([
      ...connected,
      { type: 'pending', action: 'release_traceback' },
      {
        type: 'reply',
        action: 'release_traceback',
        reply: errorReply(
          'release_traceback',
          'busy',
          'busy: available when the cell ends'
        )
      }
    ]);
    expect(busy.process.pending).toBeNull();
    expect(busy.lastError).toEqual({
      action: 'release_traceback',
      code: 'busy',
      message: 'busy: available when the cell ends'
    });
  });

  it('forgets the reading when the extension stops answering', () => {
    const state = run([
      ...connected,
      sent,
      whoOk(whoResult({ tracking: true })),
      { type: 'hello_timeout' }
    ]);
    expect(state.process.who.data).toBeNull();
    expect(state.process.tracking).toBeNull();
  });
});
