/**
 * The looks again after a `busy` reply to `who` that no cell the panel saw
 * explains: a lumino Poll ticking exactly 1, 2 and 4 s after each busy reply,
 * and no timer left once the panel hides, the tab is left or the readings go.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { IClientContext } from '../src/kernel/context';
import { OnDemandReadings, WHO_BUSY_DELAYS_MS } from '../src/kernel/readings';
import { RequestOutcome } from '../src/kernel/request';
import { ACTIONS } from '../src/protocol';
import { initialState } from '../src/state';
import { errorReply, okReply, whoResult } from './fixtures';

const BUSY: RequestOutcome = {
  kind: 'reply',
  reply: errorReply('who', 'busy', 'busy: available when the cell ends')
};

/** A followed kernel that answers each `who` with what `answers` says. */
function context(answers: () => RequestOutcome) {
  const sent: number[] = [];
  const t0 = Date.now();
  const ctx = {
    kernel: {} as any,
    generation: 1,
    visible: true,
    isDisposed: false,
    state: {
      ...initialState(),
      status: { kind: 'ok' },
      actions: [...ACTIONS]
    } as any,
    processes: {} as any,
    requestTimeoutMs: 1000,
    refreshRateMs: () => 1000,
    dispatch: vi.fn(),
    request: vi.fn(async () => {
      sent.push(Date.now() - t0);
      return answers();
    })
  } satisfies IClientContext;
  return { ctx, sent };
}

function busyReadings() {
  const { ctx, sent } = context(() => BUSY);
  const readings = new OnDemandReadings(ctx, 15000);
  readings.setWhoShown(true);
  return { ctx, sent, readings };
}

beforeEach(() => {
  vi.useFakeTimers();
});

afterEach(() => {
  vi.useRealTimers();
});

describe('looking again after a busy who', () => {
  it('asks again exactly 1, 2 and 4 s after each busy reply, then waits for the cell', async () => {
    expect(WHO_BUSY_DELAYS_MS).toEqual([1000, 2000, 4000]);
    const { sent, readings } = busyReadings();
    // Read on showing, then 1 s after its busy reply, 2 s after the next's...
    await vi.advanceTimersByTimeAsync(999);
    expect(sent).toEqual([0]);
    await vi.advanceTimersByTimeAsync(1);
    expect(sent).toEqual([0, 1000]);
    await vi.advanceTimersByTimeAsync(1999);
    expect(sent).toEqual([0, 1000]);
    await vi.advanceTimersByTimeAsync(1);
    expect(sent).toEqual([0, 1000, 3000]);
    await vi.advanceTimersByTimeAsync(3999);
    expect(sent).toHaveLength(3);
    await vi.advanceTimersByTimeAsync(1);
    expect(sent).toEqual([0, 1000, 3000, 7000]);
    // Three looks, no more: nothing is left scheduled.
    await vi.advanceTimersByTimeAsync(60000);
    expect(sent).toHaveLength(4);
    expect(vi.getTimerCount()).toBe(0);
    // A measured cell's end reads again.
    readings.cellEnded();
    await vi.advanceTimersByTimeAsync(0);
    expect(sent).toEqual([0, 1000, 3000, 7000, 67000]);
    readings.dispose();
  });

  it('starts the schedule over once a reply is not busy', async () => {
    let busy = true;
    const { ctx, sent } = context(() =>
      busy ? BUSY : { kind: 'reply', reply: okReply('who', whoResult() as any) }
    );
    const readings = new OnDemandReadings(ctx, 15000);
    readings.setWhoShown(true);
    await vi.advanceTimersByTimeAsync(999);
    busy = false;
    await vi.advanceTimersByTimeAsync(2001);
    // The look at 1 s was answered: no look at 3 s.
    expect(sent).toEqual([0, 1000]);
    expect(vi.getTimerCount()).toBe(0);
    busy = true;
    await readings.fetchWho();
    await vi.advanceTimersByTimeAsync(1000);
    expect(sent).toEqual([0, 1000, 3000, 4000]);
    readings.dispose();
  });

  it('stops when the panel hides, the tab is left, the kernel changes or the readings go', async () => {
    const stops: [string, (r: OnDemandReadings) => void][] = [
      ['hidden', r => r.hidden()],
      ['tab left', r => r.setWhoShown(false)],
      ['kernel changed', r => r.reset()],
      ['disposed', r => r.dispose()]
    ];
    for (const [why, stop] of stops) {
      const { sent, readings } = busyReadings();
      await vi.advanceTimersByTimeAsync(0);
      expect(sent).toEqual([0]);
      expect(vi.getTimerCount()).toBe(1);
      stop(readings);
      await vi.advanceTimersByTimeAsync(0);
      expect([why, vi.getTimerCount()]).toEqual([why, 0]);
      await vi.advanceTimersByTimeAsync(10000);
      expect(sent).toEqual([0]);
      readings.dispose();
    }
  });
});
