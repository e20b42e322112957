/**
 * Byte formatting shared by every view of the panel.
 */

export type Units = 'binary' | 'decimal';

const BINARY_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
const DECIMAL_UNITS = ['B', 'kB', 'MB', 'GB', 'TB', 'PB'];

function decimalsFor(value: number): number {
  if (value < 10) {
    return 2;
  }
  if (value < 100) {
    return 1;
  }
  return 0;
}

/**
 * Format a byte count with three significant figures: "1.50 GiB", "1.61 GB",
 * "512 B". Negative counts keep their sign ("-1.00 GiB").
 */
export function formatBytes(bytes: number, units: Units = 'binary'): string {
  if (!Number.isFinite(bytes)) {
    return String(bytes);
  }
  const sign = bytes < 0 ? '-' : '';
  let value = Math.abs(bytes);
  const base = units === 'decimal' ? 1000 : 1024;
  const names = units === 'decimal' ? DECIMAL_UNITS : BINARY_UNITS;
  if (value < base) {
    return `${sign}${Math.round(value)} B`;
  }
  let unit = 0;
  while (value >= base && unit < names.length - 1) {
    value /= base;
    unit += 1;
  }
  let text = value.toFixed(decimalsFor(value));
  // 1023.9 KiB must read "1.00 MiB", not "1024 KiB".
  if (Number(text) >= base && unit < names.length - 1) {
    value /= base;
    unit += 1;
    text = value.toFixed(decimalsFor(value));
  }
  return `${sign}${text} ${names[unit]}`;
}

/**
 * Format a change in bytes with an explicit sign: "+1.00 GiB", "-512 B", "0 B".
 */
export function formatDelta(bytes: number, units: Units = 'binary'): string {
  if (bytes > 0) {
    return `+${formatBytes(bytes, units)}`;
  }
  return formatBytes(bytes, units);
}

/**
 * Format a fraction as a percentage: 0.3 -> "30%", 0.125 -> "12.5%".
 */
export function formatPercent(fraction: number): string {
  const percent = fraction * 100;
  const rounded = Math.round(percent * 10) / 10;
  return `${Number.isInteger(rounded) ? rounded.toFixed(0) : rounded.toFixed(1)}%`;
}

const KERNEL_BINARY: readonly [string, number][] = [
  ['TiB', 2 ** 40],
  ['GiB', 2 ** 30],
  ['MiB', 2 ** 20],
  ['KiB', 2 ** 10]
];
const KERNEL_DECIMAL: readonly [string, number][] = [
  ['TB', 1e12],
  ['GB', 1e9],
  ['MB', 1e6],
  ['KB', 1e3]
];

/**
 * Format a byte count as the kernel side writes sizes (format_bytes of
 * jupyter_gpumem/units.py): two decimals, "64.00 MiB", "3.00 MiB", "512 B".
 * The Who tab uses it: its figures sit next to the kernel's own sentences
 * (fixes, details) that quote sizes, and must read the same.
 */
export function formatSize(bytes: number, units: Units = 'binary'): string {
  if (!Number.isFinite(bytes)) {
    return String(bytes);
  }
  const sign = bytes < 0 ? '-' : '';
  const value = Math.abs(bytes);
  for (const [name, size] of units === 'decimal'
    ? KERNEL_DECIMAL
    : KERNEL_BINARY) {
    if (value >= size) {
      return `${sign}${(value / size).toFixed(2)} ${name}`;
    }
  }
  return `${sign}${Math.round(value)} B`;
}
