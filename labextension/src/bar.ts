/**
 * Geometry of a device's stacked memory bar, as plain numbers.
 *
 * The figures nest: allocated (live tensors) sits inside reserved (what
 * PyTorch's caching allocator holds), inside what this process uses on the
 * device (reserved + CUDA context, from NVML), inside what all processes use,
 * inside the device's capacity.
 */
import { IDevice } from './protocol';

export type SegmentKey = 'allocated' | 'reserved' | 'process' | 'device';

export interface ISegment {
  key: SegmentKey;
  bytes: number;
  /** Width as a fraction of the bar, 0..1. */
  fraction: number;
}

export interface IBarGeometry {
  /** Bytes the full width stands for: the capacity when known. */
  scale: number;
  /** Whether `scale` is the device capacity (else the largest figure). */
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

/**
 * Compute the bar of one device. Unknown figures are left out, never drawn as 0.
 */
export function barGeometry(device: IDevice): IBarGeometry {
  const figures: [SegmentKey, number | null][] = [
    ['device', device.device_used],
    ['process', device.process_used],
    ['reserved', device.initialized ? device.reserved : null],
    ['allocated', device.initialized ? device.allocated : null]
  ];
  const limitBytes = device.limit ? device.limit.bytes : null;
  const peakBytes = device.initialized ? device.peak_allocated : null;
  const scaleIsTotal = known(device.total) && device.total > 0;
  let scale = scaleIsTotal ? (device.total as number) : 0;
  if (!scaleIsTotal) {
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
        fraction: scale > 0 ? clamp01(value / scale) : 0
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
