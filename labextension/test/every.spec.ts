/**
 * The client's timers: lumino Polls that tick as setInterval does.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { Poll } from '@lumino/polling';

import { every, IEveryOptions, stopPoll } from '../src/kernel/context';

const PLAIN: IEveryOptions = { standby: 'never', backoff: false };

beforeEach(() => {
  vi.useFakeTimers();
});

afterEach(() => {
  vi.useRealTimers();
  vi.restoreAllMocks();
});

describe('every', () => {
  it('ticks every interval, the first after one interval', async () => {
    const times: number[] = [];
    const t0 = Date.now();
    const poll = every(
      'test',
      1000,
      () => {
        times.push(Date.now() - t0);
      },
      PLAIN
    );
    await vi.advanceTimersByTimeAsync(3500);
    expect(times).toEqual([1000, 2000, 3000]);
    poll.dispose();
    await vi.advanceTimersByTimeAsync(5000);
    expect(times).toHaveLength(3);
  });

  it('waits for a tick that returns a promise before the next', async () => {
    const times: number[] = [];
    const t0 = Date.now();
    const poll = every(
      'test',
      1000,
      async () => {
        times.push(Date.now() - t0);
        await new Promise(resolve => setTimeout(resolve, 1500));
      },
      PLAIN
    );
    await vi.advanceTimersByTimeAsync(6500);
    poll.dispose();
    // a tick at 1000 lasts 1500, the next starts 1000 after it: never two at once
    expect(times).toEqual([1000, 3500, 6000]);
  });

  it('stands by while the browser tab is hidden, when asked to', async () => {
    let hidden = false;
    const spy = vi
      .spyOn(Poll.prototype as any, 'hidden', 'get')
      .mockImplementation(() => hidden);
    const shown: number[] = [];
    const always: number[] = [];
    const t0 = Date.now();
    const onScreen = every(
      'test',
      1000,
      () => {
        shown.push(Date.now() - t0);
      },
      { standby: 'when-hidden', backoff: false }
    );
    const watchdog = every(
      'test',
      1000,
      () => {
        always.push(Date.now() - t0);
      },
      PLAIN
    );
    await vi.advanceTimersByTimeAsync(1500);
    hidden = true;
    await vi.advanceTimersByTimeAsync(2000);
    hidden = false;
    await vi.advanceTimersByTimeAsync(1000);
    stopPoll(onScreen);
    stopPoll(watchdog);
    spy.mockRestore();
    expect(shown).toEqual([1000, 4000]);
    expect(always).toEqual([1000, 2000, 3000, 4000]);
  });

  it('backs off after a tick that rejects, when asked to', async () => {
    // lumino's backoff draws its delays at random: the middle of each range.
    vi.spyOn(Math, 'random').mockReturnValue(0.5);
    const times: number[] = [];
    const t0 = Date.now();
    let fail = true;
    const poll = every(
      'test',
      1000,
      () => {
        times.push(Date.now() - t0);
        if (fail) {
          throw new Error('no answer');
        }
      },
      { standby: 'never', backoff: true }
    );
    await vi.advanceTimersByTimeAsync(60000);
    // Later and later after the first failures, never beyond 30 s apart.
    const gaps = times.slice(1).map((t, i) => t - times[i]);
    expect(times.length).toBeLessThan(30);
    expect(Math.max(...gaps)).toBeLessThanOrEqual(30000);
    expect(gaps.every(gap => gap >= 1000)).toBe(true);
    // Once a tick resolves, every interval again.
    fail = false;
    await vi.advanceTimersByTimeAsync(30000);
    const before = times.length;
    await vi.advanceTimersByTimeAsync(3000);
    expect(times.length - before).toBe(3);
    stopPoll(poll);
  });

  it('leaves no timer behind once stopped', async () => {
    const poll = every('test', 1000, () => undefined, PLAIN);
    await vi.advanceTimersByTimeAsync(10);
    expect(vi.getTimerCount()).toBe(1);
    stopPoll(poll);
    expect(vi.getTimerCount()).toBe(0);
    expect(poll.isDisposed).toBe(true);
  });
});
