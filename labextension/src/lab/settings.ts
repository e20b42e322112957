/**
 * The user settings of the panel (schema/plugin.json) and their defaults.
 */
import type { ISettingRegistry } from '@jupyterlab/settingregistry';

import type { BarScale } from '../present/bar';
import { Units } from '../present/format';

export interface ISettings {
  /** Interval of pushed samples, ms (100..10000). */
  refreshRateMs: number;
  units: Units;
  /** Length of the trend line. */
  trendMinutes: number;
  /** What the bars' full width stands for. */
  barScale: BarScale;
}

export const DEFAULT_SETTINGS: ISettings = {
  refreshRateMs: 500,
  units: 'binary',
  trendMinutes: 5,
  barScale: 'fit'
};

export function clampInterval(ms: number): number {
  if (!Number.isFinite(ms)) {
    return DEFAULT_SETTINGS.refreshRateMs;
  }
  return Math.min(10000, Math.max(100, Math.round(ms)));
}

/**
 * The settings as the registry holds them, with the defaults for values that
 * are missing or not numbers.
 */
export function readSettings(settings: ISettingRegistry.ISettings): ISettings {
  const composite = settings.composite as Partial<
    Record<keyof ISettings, unknown>
  >;
  const rate = Number(composite.refreshRateMs);
  const minutes = Number(composite.trendMinutes);
  const units: Units = composite.units === 'decimal' ? 'decimal' : 'binary';
  return {
    refreshRateMs: Number.isFinite(rate)
      ? rate
      : DEFAULT_SETTINGS.refreshRateMs,
    units,
    trendMinutes:
      Number.isFinite(minutes) && minutes > 0
        ? minutes
        : DEFAULT_SETTINGS.trendMinutes,
    barScale: composite.barScale === 'total' ? 'total' : 'fit'
  };
}
