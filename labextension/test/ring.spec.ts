import { describe, expect, it } from 'vitest';

import { acceptSeq, pushBounded, trimBounded } from '../src/state/ring';

describe('acceptSeq', () => {
  it('accepts the first message and every newer one, gaps included', () => {
    expect(acceptSeq(null, 0)).toBe(true);
    expect(acceptSeq(3, 4)).toBe(true);
    expect(acceptSeq(3, 9)).toBe(true);
  });

  it('drops duplicates, older messages and non-integers', () => {
    expect(acceptSeq(3, 3)).toBe(false);
    expect(acceptSeq(3, 2)).toBe(false);
    expect(acceptSeq(3, 3.5)).toBe(false);
  });
});

describe('pushBounded', () => {
  const bounds = { maxAgeS: 60, maxLength: 4 };

  it('appends without changing the input', () => {
    const items = [{ time: 1 }];
    const next = pushBounded(items, { time: 2 }, bounds);
    expect(next).toEqual([{ time: 1 }, { time: 2 }]);
    expect(items).toEqual([{ time: 1 }]);
  });

  it('keeps at most maxLength entries, dropping the oldest', () => {
    let items: { time: number }[] = [];
    for (let t = 0; t < 10; t++) {
      items = pushBounded(items, { time: t }, bounds);
    }
    expect(items.map(i => i.time)).toEqual([6, 7, 8, 9]);
  });

  it('drops entries older than maxAgeS before the newest', () => {
    const items = pushBounded(
      [{ time: 0 }, { time: 50 }],
      { time: 100 },
      bounds
    );
    expect(items.map(i => i.time)).toEqual([50, 100]);
  });

  it('puts a late entry at its place in time', () => {
    const items = pushBounded([{ time: 1 }, { time: 3 }], { time: 2 }, bounds);
    expect(items.map(i => i.time)).toEqual([1, 2, 3]);
  });

  it('trims against a later "now"', () => {
    expect(
      trimBounded([{ time: 0 }, { time: 30 }], bounds, 80).map(i => i.time)
    ).toEqual([30]);
  });
});
