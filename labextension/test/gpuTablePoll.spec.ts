/**
 * The On this GPU tab's reads again: every 5 s on a lumino Poll, none while
 * the panel or the browser tab is hidden or a read is unanswered, none once
 * the tab closed.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

// lumino's Poll reads the document's visibility when it loads: a stand-in
// document whose visibility the tests switch (the tests run in node).
const page = vi.hoisted(() => {
  const listeners: (() => void)[] = [];
  const doc = {
    visibilityState: 'visible',
    addEventListener: (_type: string, listener: () => void) => {
      listeners.push(listener);
    }
  };
  (globalThis as any).document = doc;
  return {
    show(state: 'visible' | 'hidden') {
      doc.visibilityState = state;
      listeners.forEach(listener => listener());
    }
  };
});

import {
  GPU_TABLE_POLL_MS,
  pollGpuTable,
  stopPoll
} from '../src/server/gpuTablePoll';

function setup(readMs = 0) {
  const reads: number[] = [];
  const t0 = Date.now();
  const state = { visible: true, inFlight: 0 };
  const read = vi.fn(async () => {
    reads.push(Date.now() - t0);
    if (readMs > 0) {
      state.inFlight += 1;
      await new Promise(resolve => setTimeout(resolve, readMs));
      state.inFlight -= 1;
    }
  });
  const poll = pollGpuTable({
    read,
    visible: () => state.visible,
    inFlight: () => state.inFlight
  });
  return { poll, reads, state };
}

beforeEach(() => {
  vi.useFakeTimers();
  page.show('visible');
});

afterEach(() => {
  vi.useRealTimers();
});

describe('reading the GPU table again', () => {
  it('reads every 5 s, the first 5 s after the tab opened', async () => {
    expect(GPU_TABLE_POLL_MS).toBe(5000);
    const { poll, reads } = setup();
    await vi.advanceTimersByTimeAsync(4999);
    expect(reads).toEqual([]);
    await vi.advanceTimersByTimeAsync(10001);
    expect(reads).toEqual([5000, 10000, 15000]);
    stopPoll(poll);
  });

  it('never asks a slow server again before it answered', async () => {
    const { poll, reads } = setup(7000);
    await vi.advanceTimersByTimeAsync(5000 + 7000 + 5000);
    // Read at 5 s, answered at 12 s, read again 5 s later.
    expect(reads).toEqual([5000, 17000]);
    stopPoll(poll);
    // A Refresh in flight: the tick reads nothing.
    const other = setup();
    other.state.inFlight = 1;
    await vi.advanceTimersByTimeAsync(5000);
    expect(other.reads).toEqual([]);
    other.state.inFlight = 0;
    await vi.advanceTimersByTimeAsync(5000);
    expect(other.reads).toEqual([10000]);
    stopPoll(other.poll);
  });

  it('stands by while the panel is hidden', async () => {
    const { poll, reads, state } = setup();
    state.visible = false;
    await vi.advanceTimersByTimeAsync(20000);
    expect(reads).toEqual([]);
    state.visible = true;
    await vi.advanceTimersByTimeAsync(5000);
    expect(reads).toEqual([25000]);
    stopPoll(poll);
  });

  it('stands by while the browser tab is hidden', async () => {
    const { poll, reads } = setup();
    await vi.advanceTimersByTimeAsync(5000);
    page.show('hidden');
    await vi.advanceTimersByTimeAsync(20000);
    expect(reads).toEqual([5000]);
    page.show('visible');
    await vi.advanceTimersByTimeAsync(5000);
    expect(reads).toEqual([5000, 30000]);
    stopPoll(poll);
  });

  it('stops when the tab closes: no read, no timer left', async () => {
    const { poll, reads } = setup();
    await vi.advanceTimersByTimeAsync(5000);
    stopPoll(poll);
    expect(poll.isDisposed).toBe(true);
    await vi.advanceTimersByTimeAsync(0);
    expect(vi.getTimerCount()).toBe(0);
    await vi.advanceTimersByTimeAsync(60000);
    expect(reads).toEqual([5000]);
  });
});
