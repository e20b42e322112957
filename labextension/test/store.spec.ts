import { describe, expect, it } from 'vitest';

import { IGpuMemState } from '../src/state';
import { GpuMemStore } from '../src/state';
import { okReply, whoResult } from './fixtures';

describe('GpuMemStore', () => {
  it('starts from the initial state with the trend length', () => {
    const store = new GpuMemStore(7, () => undefined);
    expect(store.state.status.kind).toBe('no_kernel');
    expect(store.state.trendMinutes).toBe(7);
  });

  it('says when an event changed the state, and only then', () => {
    const changes: IGpuMemState[] = [];
    const store = new GpuMemStore(5, state => changes.push(state));
    store.dispatch({ type: 'follow', kernelId: 'k1', source: 'a.ipynb' });
    expect(changes).toHaveLength(1);
    expect(changes[0]).toBe(store.state);
    expect(store.state.source).toBe('a.ipynb');
    const before = store.state;
    store.dispatch({ type: 'configure', trendMinutes: 5 });
    expect(store.state).toBe(before);
    expect(changes).toHaveLength(1);
  });

  it('changes with a who reply it asked for, not with a stale one', () => {
    const changes: IGpuMemState[] = [];
    const store = new GpuMemStore(5, state => changes.push(state));
    store.dispatch({ type: 'follow', kernelId: 'k1', source: 'a.ipynb' });
    const reply = {
      type: 'reply',
      action: 'who',
      reply: okReply('who', whoResult() as any),
      at: 1
    } as const;
    // Nothing asked (or asked of a kernel since left): no change.
    store.dispatch(reply);
    expect(changes).toHaveLength(1);
    store.dispatch({ type: 'who_sent' });
    store.dispatch(reply);
    expect(changes).toHaveLength(3);
    expect(store.state.process.who.status).toBe('ok');
    expect(store.state.process.who.data).toEqual(whoResult());
    store.dispatch(reply);
    expect(changes).toHaveLength(3);
  });
});
