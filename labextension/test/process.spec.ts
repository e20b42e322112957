import { describe, expect, it } from 'vitest';

import { ProcessTracker } from '../src/kernel/process';

function msg(session: string): any {
  return { header: { session } };
}

describe('ProcessTracker', () => {
  it('accepts everything until a restart', () => {
    const processes = new ProcessTracker();
    expect(processes.hasSpoken).toBe(true);
    expect(processes.accept(msg('p1'))).toBe(true);
    expect(processes.accept(msg(''))).toBe(true);
    expect(processes.accept(msg('p2'))).toBe(true);
  });

  it('refuses the replaced process and waits for the new one to speak', () => {
    const processes = new ProcessTracker();
    processes.accept(msg('p1'));
    processes.replaced();
    expect(processes.hasSpoken).toBe(false);
    expect(processes.accept(msg('p1'))).toBe(false);
    expect(processes.hasSpoken).toBe(false);
    // A message without session says nothing of its process.
    expect(processes.accept(msg(''))).toBe(true);
    expect(processes.hasSpoken).toBe(false);
    expect(processes.accept(msg('p2'))).toBe(true);
    expect(processes.hasSpoken).toBe(true);
    expect(processes.accept(msg('p1'))).toBe(false);
  });

  it('forgets every process on reset', () => {
    const processes = new ProcessTracker();
    processes.accept(msg('p1'));
    processes.replaced();
    processes.reset();
    expect(processes.hasSpoken).toBe(true);
    expect(processes.accept(msg('p1'))).toBe(true);
  });
});
