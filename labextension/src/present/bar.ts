/**
 * Geometry of a device's stacked memory bar, as plain numbers.
 *
 * The figures nest: allocated (live tensors) sits inside reserved (what
 * PyTorch's caching allocator holds), inside what this process uses on the
 * device (reserved + CUDA context, from NVML), inside what all processes use,
 * inside the device's capacity.
 */
import { IDevice } from '../protocol';

export type SegmentKey = 'allocated' | 'reserved' | 'process' | 'device';

/**
 * What the full width stands for: `fit`, the largest of what this process
 * holds (reserved, peak, cap, its NVML figure), so that 800 MiB on a 140 GiB
 * GPU is not a sliver; `total`, the device's capacity.
 */
export type BarScale = 'fit' | 'total';

export interface ISegment {
  key: SegmentKey;
  bytes: number;
  /** Width as a fraction of the bar, 0..1. */
  fraction: number;
  /** Larger than the scale: drawn to the end, cut. */
  clipped: boolean;
}

export interface IBarGeometry {
  /** Bytes the full width stands for. */
  scale: number;
  /** Whether `scale` is the device capacity (else fitted to the figures). */
  scaleIsTotal: boolean;
  /** Outermost first, so that inner segments are drawn on top. */
  segments: ISegment[];
  /** Position of the peak-allocated marker, 0..1, or null. */
  peak: number | null;
  /** Position of the cap, 0..1, or null. */
  limit: number | null;
}

function known(value: number | null | undefined): value is number {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0;
}

function clamp01(value: number): number {
  return Math.min(1, Math.max(0, value));
}

/** The fitted scale: the largest of what this process holds, with room. */
function fittedScale(device: IDevice, figures: (number | null)[]): number {
  let largest = 0;
  for (const value of figures) {
    if (known(value)) {
      largest = Math.max(largest, value);
    }
  }
  return largest * 1.1;
}

/**
 * Compute the bar of one device. Unknown figures are left out, never drawn as
 * 0. With `fit`, the scale fits reserved, peak, cap and this process; other
 * processes' memory beyond it is drawn cut (`clipped`). Without any figure of
 * this process (CUDA not initialised) the bar shows the device total.
 */
export function barGeometry(
  device: IDevice,
  scaleMode: BarScale = 'total'
): IBarGeometry {
  const figures: [SegmentKey, number | null][] = [
    ['device', device.device_used],
    ['process', device.process_used],
    ['reserved', device.initialized ? device.reserved : null],
    ['allocated', device.initialized ? device.allocated : null]
  ];
  const limitBytes = device.limit ? device.limit.bytes : null;
  const peakBytes = device.initialized ? device.peak_allocated : null;
  const fitted =
    scaleMode === 'fit'
      ? fittedScale(device, [
          device.initialized ? device.reserved : null,
          device.initialized ? device.allocated : null,
          peakBytes,
          limitBytes,
          device.process_used
        ])
      : 0;
  const hasTotal = known(device.total) && device.total > 0;
  const scaleIsTotal = hasTotal && !(fitted > 0);
  let scale = fitted > 0 ? fitted : hasTotal ? (device.total as number) : 0;
  if (scale === 0) {
    for (const [, value] of figures) {
      if (known(value)) {
        scale = Math.max(scale, value);
      }
    }
    for (const value of [limitBytes, peakBytes]) {
      if (known(value)) {
        scale = Math.max(scale, value);
      }
    }
  }
  const segments: ISegment[] = [];
  for (const [key, value] of figures) {
    if (known(value)) {
      segments.push({
        key,
        bytes: value,
        fraction: scale > 0 ? clamp01(value / scale) : 0,
        clipped: scale > 0 && value > scale
      });
    }
  }
  return {
    scale,
    scaleIsTotal,
    segments,
    peak: known(peakBytes) && scale > 0 ? clamp01(peakBytes / scale) : null,
    limit: known(limitBytes) && scale > 0 ? clamp01(limitBytes / scale) : null
  };
}

/**
 * Reserved but not allocated: cached blocks that `empty_cache` may return
 * (less what is split and non-releasable).
 */
export function cachedFree(device: IDevice): number | null {
  if (
    !device.initialized ||
    !known(device.reserved) ||
    !known(device.allocated)
  ) {
    return null;
  }
  return Math.max(0, device.reserved - device.allocated);
}
