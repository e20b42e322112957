import { describe, expect, it } from 'vitest';

import {
  formatBytes,
  formatDelta,
  formatPercent,
  formatSize
} from '../src/present/format';

describe('formatBytes', () => {
  it('shows 1.5 GiB in binary units, the only ones', () => {
    expect(formatBytes(1.5 * 1024 ** 3)).toBe('1.50 GiB');
    expect(formatBytes(1.5 * 1024)).toBe('1.50 KiB');
  });

  it('keeps three significant figures', () => {
    expect(formatBytes(12.345 * 1024 ** 2)).toBe('12.3 MiB');
    expect(formatBytes(123.45 * 1024 ** 2)).toBe('123 MiB');
    expect(formatBytes(141 * 1024 ** 3)).toBe('141 GiB');
  });

  it('shows small counts as bytes', () => {
    expect(formatBytes(0)).toBe('0 B');
    expect(formatBytes(512)).toBe('512 B');
    expect(formatBytes(1023)).toBe('1023 B');
  });

  it('moves to the next unit instead of showing 1024 of one', () => {
    expect(formatBytes(1024)).toBe('1.00 KiB');
    expect(formatBytes(1024 * 1024 - 1)).toBe('1.00 MiB');
  });

  it('keeps the sign of a negative count', () => {
    expect(formatBytes(-2 * 1024 ** 3)).toBe('-2.00 GiB');
  });

  it('formats deltas with a sign', () => {
    expect(formatDelta(1024 ** 3)).toBe('+1.00 GiB');
    expect(formatDelta(-512)).toBe('-512 B');
    expect(formatDelta(0)).toBe('0 B');
  });

  it('formats fractions as percentages', () => {
    expect(formatPercent(0.3)).toBe('30%');
    expect(formatPercent(0.125)).toBe('12.5%');
  });
});

describe('formatSize', () => {
  it('writes sizes as the kernel does: two decimals', () => {
    expect(formatSize(64 * 1024 ** 2)).toBe('64.00 MiB');
    expect(formatSize(3 * 1024 ** 2)).toBe('3.00 MiB');
    expect(formatSize(128 * 1024 ** 2)).toBe('128.00 MiB');
    expect(formatSize(557826048)).toBe('531.98 MiB');
    expect(formatSize(1.5 * 1024 ** 4)).toBe('1.50 TiB');
    expect(formatSize(2 ** 50)).toBe('1024.00 TiB');
  });

  it('spells units as the kernel does: KiB, never kB or KB', () => {
    expect(formatSize(1536)).toBe('1.50 KiB');
    expect(formatBytes(1536)).toBe('1.50 KiB');
  });

  it('shows small and negative counts', () => {
    expect(formatSize(0)).toBe('0 B');
    expect(formatSize(1023)).toBe('1023 B');
    expect(formatSize(-2 * 1024 ** 3)).toBe('-2.00 GiB');
  });
});
