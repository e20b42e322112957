/**
 * Byte formatting shared by every view of the panel. One spelling of units:
 * B, KiB, MiB, GiB, TiB (powers of 1024, as nvidia-smi's MiB and the kernel
 * side's jupyter_gpumem/units.py).
 */

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

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
 * Format a byte count with three significant figures: "1.50 GiB", "512 B".
 * Negative counts keep their sign ("-1.00 GiB").
 */
export function formatBytes(bytes: number): string {
  if (!Number.isFinite(bytes)) {
    return String(bytes);
  }
  const sign = bytes < 0 ? '-' : '';
  let value = Math.abs(bytes);
  if (value < 1024) {
    return `${sign}${Math.round(value)} B`;
  }
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  let text = value.toFixed(decimalsFor(value));
  // 1023.9 KiB must read "1.00 MiB", not "1024 KiB".
  if (Number(text) >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
    text = value.toFixed(decimalsFor(value));
  }
  return `${sign}${text} ${UNITS[unit]}`;
}

/**
 * Format a change in bytes with an explicit sign: "+1.00 GiB", "-512 B", "0 B".
 */
export function formatDelta(bytes: number): string {
  if (bytes > 0) {
    return `+${formatBytes(bytes)}`;
  }
  return formatBytes(bytes);
}

/**
 * Format a fraction as a percentage: 0.3 -> "30%", 0.125 -> "12.5%".
 */
export function formatPercent(fraction: number): string {
  const percent = fraction * 100;
  const rounded = Math.round(percent * 10) / 10;
  return `${Number.isInteger(rounded) ? rounded.toFixed(0) : rounded.toFixed(1)}%`;
}

const KERNEL_UNITS: readonly [string, number][] = [
  ['TiB', 2 ** 40],
  ['GiB', 2 ** 30],
  ['MiB', 2 ** 20],
  ['KiB', 2 ** 10]
];

/**
 * Format a byte count as the kernel side writes sizes (format_bytes of
 * jupyter_gpumem/units.py): two decimals, "64.00 MiB", "3.00 MiB", "512 B".
 * The Who tab uses it: its figures sit next to the kernel's own sentences
 * (fixes, details) that quote sizes, and must read the same.
 */
export function formatSize(bytes: number): string {
  if (!Number.isFinite(bytes)) {
    return String(bytes);
  }
  const sign = bytes < 0 ? '-' : '';
  const value = Math.abs(bytes);
  for (const [name, size] of KERNEL_UNITS) {
    if (value >= size) {
      return `${sign}${(value / size).toFixed(2)} ${name}`;
    }
  }
  return `${sign}${Math.round(value)} B`;
}
