import { describe, expect, it } from 'vitest';

import {
  availability,
  errorText,
  noticeText,
  statusText
} from '../src/present/messages';
import { GpuMemEvent, initialState, reduce } from '../src/state';
import { plainTrans as trans } from '../src/present/trans';
import {
  device,
  GiB,
  helloResult,
  okReply,
  sample,
  uninitializedDevice
} from './fixtures';

function stateWith(s = sample(), actions?: string[]) {
  const hello = helloResult(s);
  if (actions) {
    hello.actions = actions;
  }
  const events: GpuMemEvent[] = [
    { type: 'follow', kernelId: 'k1', source: 'a.ipynb' },
    { type: 'reply', action: 'hello', reply: okReply('hello', hello) }
  ];
  return events.reduce(reduce, initialState());
}

describe('noticeText', () => {
  it('says how much empty_cache released', () => {
    expect(
      noticeText({ kind: 'released', released: { '0': 1.2 * GiB } }, trans)
    ).toBe('Released 1.20 GiB to the driver');
    expect(
      noticeText(
        { kind: 'released', released: { '1': GiB, '0': 2 * GiB } },
        trans
      )
    ).toBe(
      'Released 3.00 GiB to the driver (GPU 0: 2.00 GiB, GPU 1: 1.00 GiB)'
    );
    expect(
      noticeText({ kind: 'released', released: { '0': 0 } }, trans)
    ).toContain('Nothing to release');
  });

  it('says when caching could not be switched', () => {
    expect(
      noticeText({ kind: 'caching', requested: false, caching: true }, trans)
    ).toBe('Caching is still on: this kernel could not switch it off.');
    expect(
      noticeText({ kind: 'caching', requested: false, caching: false }, trans)
    ).toMatch(/^Caching is off/);
  });

  it('describes a cap', () => {
    expect(
      noticeText(
        { kind: 'limit', device: 0, limit: { fraction: 0.3, bytes: 24 * GiB } },
        trans
      )
    ).toBe('Capped GPU 0 at 24.0 GiB (30% of the device)');
    expect(noticeText({ kind: 'limit', device: 1, limit: null }, trans)).toBe(
      'Cap removed on GPU 1'
    );
  });
});

describe('statusText', () => {
  it('has a message for every state but ok', () => {
    const s = sample();
    const kinds = [
      { kind: 'no_kernel' },
      { kind: 'loading' },
      { kind: 'not_loaded' },
      { kind: 'incompatible', message: 'x' },
      { kind: 'restarting' },
      { kind: 'dead' },
      { kind: 'no_torch', sample: s },
      { kind: 'cpu_only', sample: s },
      { kind: 'no_gpu', sample: s },
      { kind: 'not_initialized', sample: s }
    ] as const;
    for (const status of kinds) {
      expect(statusText(status, trans)?.title, status.kind).toBeTruthy();
    }
    expect(statusText({ kind: 'ok', sample: s }, trans)).toBeNull();
    expect(statusText({ kind: 'not_loaded' }, trans)?.title).toBe(
      'The gpumem extension is not loaded in this kernel'
    );
  });
});

describe('errorText', () => {
  it('words errors found by the panel itself', () => {
    expect(
      errorText({ action: 'reset_peak', code: 'timeout', message: '' }, trans)
    ).toBe('Reset peak: the kernel did not answer in time.');
    expect(
      errorText({ action: 'attach', code: 'busy', message: '' }, trans)
    ).toBe('Wait for the running cell to finish, then attach.');
    expect(
      errorText({ action: 'attach', code: 'no_answer', message: '' }, trans)
    ).toContain('does not answer the panel');
  });

  it('carries the kernel reason', () => {
    expect(
      errorText(
        { action: 'set_caching', code: 'refused', message: 'torch < 2.6' },
        trans
      )
    ).toBe('Switching caching refused: torch < 2.6');
  });
});

describe('availability', () => {
  it('enables every action on an initialised device', () => {
    const state = stateWith();
    for (const action of [
      'empty_cache',
      'set_caching',
      'reset_peak',
      'set_limit'
    ] as const) {
      expect(availability(state, action, trans).enabled, action).toBe(true);
    }
    expect(availability(state, 'attach', trans).enabled).toBe(false);
  });

  it('gives a reason when CUDA is not initialised', () => {
    const state = stateWith(
      sample({
        state: 'not_initialized',
        caching: null,
        devices: [uninitializedDevice()]
      })
    );
    const empty = availability(state, 'empty_cache', trans);
    expect(empty.enabled).toBe(false);
    expect(empty.reason).toContain('not initialised');
    const cap = availability(
      state,
      'set_limit',
      trans,
      state.process.sample!.devices[0]
    );
    expect(cap.reason).toBe(
      'CUDA is not initialised on GPU 0: setting a cap would create a context'
    );
  });

  it('gives the state as the reason when there is nothing to act on', () => {
    const state = reduce(initialState(), {
      type: 'follow',
      kernelId: null,
      source: null
    });
    expect(availability(state, 'empty_cache', trans)).toEqual({
      enabled: false,
      reason: 'No kernel'
    });
  });

  it('disables actions the kernel side does not offer', () => {
    const state = stateWith(sample(), ['hello', 'sample', 'empty_cache']);
    expect(availability(state, 'empty_cache', trans).enabled).toBe(true);
    expect(availability(state, 'set_caching', trans).enabled).toBe(false);
  });

  it('allows attach only when not loaded and idle', () => {
    let state = [
      { type: 'follow', kernelId: 'k1', source: 'a.ipynb' },
      { type: 'hello_timeout' }
    ].reduce(reduce as any, initialState()) as ReturnType<typeof initialState>;
    expect(availability(state, 'attach', trans).enabled).toBe(true);
    state = reduce(state, { type: 'busy', busy: true });
    expect(availability(state, 'attach', trans)).toEqual({
      enabled: false,
      reason: 'Wait for the running cell to finish'
    });
  });

  it('disables switching caching when its state is unknown', () => {
    const state = stateWith(sample({ caching: null, devices: [device()] }));
    expect(availability(state, 'set_caching', trans).enabled).toBe(false);
  });
});

describe('who holds it: words and availability', () => {
  it('words the tracking switch, with the kernel words when it has some', () => {
    const notice = (requested: boolean, tracking: boolean, message = '') =>
      noticeText({ kind: 'tracking', requested, tracking, message }, trans);
    expect(notice(true, true, 'allocation tracking is on (replay)')).toBe(
      'Allocation tracking is on (replay)'
    );
    expect(notice(true, true)).toBe('Allocation tracking is on');
    expect(notice(false, false)).toBe('Allocation tracking is off');
    expect(notice(false, true)).toBe('Allocation tracking is still on');
  });

  it('says what releasing the traceback freed', () => {
    const notice = (frames: number, freed: Record<string, number>) =>
      noticeText({ kind: 'traceback_released', frames, freed }, trans);
    expect(notice(0, { '0': 0 })).toBe(
      'No traceback was kept: nothing to release.'
    );
    expect(notice(1, { '0': 0 })).toBe(
      'Released the traceback (1 frame): no GPU memory freed'
    );
    expect(notice(3, { '0': 2 * GiB })).toBe(
      'Released the traceback (3 frames): 2.00 GiB freed'
    );
    expect(notice(2, { '1': GiB, '0': GiB })).toBe(
      'Released the traceback (2 frames): 2.00 GiB (GPU 0: 1.00 GiB, GPU 1: 1.00 GiB) freed'
    );
  });

  it('says busy for the actions that wait for the cell', () => {
    expect(
      errorText(
        {
          action: 'release_traceback',
          code: 'busy',
          message: 'busy: available when the cell ends'
        },
        trans
      )
    ).toBe('Release traceback: busy, available when the cell ends.');
    expect(
      errorText({ action: 'attach', code: 'busy', message: '' }, trans)
    ).toBe('Wait for the running cell to finish, then attach.');
    expect(
      errorText({ action: 'track', code: 'refused', message: 'no' }, trans)
    ).toBe('Allocation tracking refused: no');
  });

  it('lets who be read while an action waits, not while it reads', () => {
    let state = stateWith();
    expect(availability(state, 'who', trans).enabled).toBe(true);
    state = reduce(state, { type: 'pending', action: 'empty_cache' });
    expect(availability(state, 'who', trans).enabled).toBe(true);
    expect(availability(state, 'track', trans).enabled).toBe(false);
    state = reduce(state, { type: 'who_sent' });
    expect(availability(state, 'who', trans)).toEqual({
      enabled: false,
      reason: 'Reading who holds the memory…'
    });
  });

  it('disables who and track for a kernel side without them', () => {
    const state = stateWith(sample(), ['hello', 'sample', 'empty_cache']);
    expect(availability(state, 'who', trans).enabled).toBe(false);
    expect(availability(state, 'track', trans).enabled).toBe(false);
    expect(availability(state, 'release_traceback', trans).enabled).toBe(false);
  });
});
