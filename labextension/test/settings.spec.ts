import { describe, expect, it } from 'vitest';

import { clampInterval, DEFAULT_SETTINGS, readSettings } from '../src/settings';

function registry(composite: Record<string, unknown>): any {
  return { composite };
}

describe('settings', () => {
  it('clamps the interval to 100..10000 ms', () => {
    expect(clampInterval(50)).toBe(100);
    expect(clampInterval(250.4)).toBe(250);
    expect(clampInterval(60000)).toBe(10000);
    expect(clampInterval(NaN)).toBe(DEFAULT_SETTINGS.refreshRateMs);
  });

  it('reads the registry, with defaults for what is missing or wrong', () => {
    expect(
      readSettings(
        registry({
          refreshRateMs: 1000,
          trendMinutes: 2,
          barScale: 'total',
          statusBar: false
        })
      )
    ).toEqual({
      refreshRateMs: 1000,
      trendMinutes: 2,
      barScale: 'total',
      statusBar: false
    });
    expect(readSettings(registry({}))).toEqual(DEFAULT_SETTINGS);
    expect(
      readSettings(
        registry({
          refreshRateMs: 'fast',
          trendMinutes: 0,
          barScale: 'huge',
          statusBar: 'yes'
        })
      )
    ).toEqual(DEFAULT_SETTINGS);
  });
});
