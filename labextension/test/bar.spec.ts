import { describe, expect, it } from 'vitest';

import { barGeometry, cachedFree } from '../src/present/bar';
import { device, GiB, uninitializedDevice } from './fixtures';

describe('barGeometry', () => {
  it('nests allocated in reserved in process in device, scaled to the total', () => {
    const geometry = barGeometry(device({ total: 100 * GiB }));
    expect(geometry.scaleIsTotal).toBe(true);
    expect(geometry.segments.map(s => [s.key, s.fraction])).toEqual([
      ['device', 0.1],
      ['process', 0.025],
      ['reserved', 0.02],
      ['allocated', 0.01]
    ]);
    expect(geometry.peak).toBeCloseTo(0.03);
    expect(geometry.limit).toBeNull();
  });

  it('draws the cap', () => {
    const geometry = barGeometry(
      device({ total: 100 * GiB, limit: { fraction: 0.3, bytes: 30 * GiB } })
    );
    expect(geometry.limit).toBeCloseTo(0.3);
  });

  it('leaves unknown figures out instead of drawing them as 0', () => {
    const geometry = barGeometry(
      uninitializedDevice({ total: 100 * GiB, device_used: 5 * GiB })
    );
    expect(geometry.segments.map(s => s.key)).toEqual(['device']);
    expect(geometry.peak).toBeNull();
  });

  it('scales to the largest figure when the capacity is unknown', () => {
    const geometry = barGeometry(
      device({ total: null, device_used: null, process_used: null })
    );
    expect(geometry.scaleIsTotal).toBe(false);
    expect(geometry.scale).toBe(3 * GiB);
    expect(geometry.segments.map(s => s.key)).toEqual([
      'reserved',
      'allocated'
    ]);
  });
});

describe('barGeometry, fitted to the process', () => {
  it('fits reserved, peak, cap and the process with room, and cuts the rest', () => {
    // 1 GiB allocated, 2 reserved, 3 peak, 2.5 this process, 10 all, on 140.
    const geometry = barGeometry(device({ total: 140 * GiB }), 'fit');
    expect(geometry.scaleIsTotal).toBe(false);
    expect(geometry.scale).toBeCloseTo(3 * GiB * 1.1);
    const byKey = Object.fromEntries(
      geometry.segments.map(s => [s.key, s] as const)
    );
    expect(byKey.allocated.fraction).toBeCloseTo(1 / 3.3);
    expect(byKey.allocated.clipped).toBe(false);
    expect(byKey.device.fraction).toBe(1);
    expect(byKey.device.clipped).toBe(true);
    expect(geometry.peak).toBeCloseTo(1 / 1.1);
  });

  it('fits a cap larger than the peak', () => {
    const geometry = barGeometry(
      device({ total: 140 * GiB, limit: { fraction: 0.1, bytes: 14 * GiB } }),
      'fit'
    );
    expect(geometry.scale).toBeCloseTo(14 * GiB * 1.1);
    expect(geometry.limit).toBeCloseTo(1 / 1.1);
  });

  it('shows the total while the process holds nothing it can fit', () => {
    const geometry = barGeometry(
      uninitializedDevice({ total: 100 * GiB, device_used: 5 * GiB }),
      'fit'
    );
    expect(geometry.scaleIsTotal).toBe(true);
    expect(geometry.scale).toBe(100 * GiB);
  });
});

describe('cachedFree', () => {
  it('is reserved minus allocated', () => {
    expect(cachedFree(device())).toBe(1 * GiB);
    expect(cachedFree(uninitializedDevice())).toBeNull();
  });
});
