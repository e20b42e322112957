/**
 * The user settings of the panel (schema/plugin.json) and their defaults.
 */
import type { ISettingRegistry } from '@jupyterlab/settingregistry';

import type { BarScale } from './present/bar';

export interface ISettings {
  /** Interval of pushed samples, ms (100..10000). */
  refreshRateMs: number;
  /** Length of the trend line. */
  trendMinutes: number;
  /** What the bars' full width stands for. */
  barScale: BarScale;
  /** Show the busiest GPU's figures in JupyterLab's status bar. */
  statusBar: boolean;
}

export const DEFAULT_SETTINGS: ISettings = {
  refreshRateMs: 500,
  trendMinutes: 5,
  barScale: 'fit',
  statusBar: true
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
  return {
    refreshRateMs: Number.isFinite(rate)
      ? rate
      : DEFAULT_SETTINGS.refreshRateMs,
    trendMinutes:
      Number.isFinite(minutes) && minutes > 0
        ? minutes
        : DEFAULT_SETTINGS.trendMinutes,
    barScale: composite.barScale === 'total' ? 'total' : 'fit',
    statusBar: composite.statusBar !== false
  };
}
