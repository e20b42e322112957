/**
 * The client's timers: lumino Polls that tick as setInterval does.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { every } from '../src/kernel/context';

beforeEach(() => {
  vi.useFakeTimers();
});

afterEach(() => {
  vi.useRealTimers();
});

describe('every', () => {
  it('ticks every interval, the first after one interval', async () => {
    const times: number[] = [];
    const t0 = Date.now();
    const poll = every('test', 1000, () => {
      times.push(Date.now() - t0);
    });
    await vi.advanceTimersByTimeAsync(3500);
    expect(times).toEqual([1000, 2000, 3000]);
    poll.dispose();
    await vi.advanceTimersByTimeAsync(5000);
    expect(times).toHaveLength(3);
  });

  it('waits for a tick that returns a promise before the next', async () => {
    const times: number[] = [];
    const t0 = Date.now();
    const poll = every('test', 1000, async () => {
      times.push(Date.now() - t0);
      await new Promise(resolve => setTimeout(resolve, 1500));
    });
    await vi.advanceTimersByTimeAsync(6500);
    poll.dispose();
    // a tick at 1000 lasts 1500, the next starts 1000 after it: never two at once
    expect(times).toEqual([1000, 3500, 6000]);
  });
});
