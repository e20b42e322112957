/**
 * What the status bar says of the followed kernel: allocated / reserved of
 * its busiest GPU (the most reserved), whether that GPU is near its end (the
 * cap, or the whole device), and whether the figures are replayed. Pure: the
 * translator is passed in.
 */
import { formatBytes, formatPercent } from './format';
import { deviceLabel } from './messages';
import { replayText } from './replay';
import { IDevice, IReplay } from '../protocol';
import { IGpuMemState } from '../state';
import { ITrans } from './trans';

/** From this share of the cap, or of the device, on, the item warns. */
export const NEAR_THE_END = 0.9;

/** What the GPU is near the end of: its cap, the device, or neither. */
export type NearTheEnd = 'cap' | 'device' | null;

export interface IStatusSummary {
  /** Index of the GPU shown. */
  index: number;
  /** "GPU 1.20 GiB / 2.00 GiB", "GPU 1: … (replay)". */
  text: string;
  near: NearTheEnd;
  /** Where the replayed figures were recorded; null: measured here. */
  replay: IReplay | null;
  /** What the figures are, one line each. */
  tooltip: string;
}

/** A device with allocator figures (CUDA initialised there). */
function hasFigures(
  device: IDevice
): device is IDevice & { allocated: number; reserved: number } {
  return (
    device.initialized && device.allocated !== null && device.reserved !== null
  );
}

/**
 * The device with the most reserved memory among those with allocator
 * figures; the lowest index on a tie; null when none has figures.
 */
export function busiestDevice(devices: readonly IDevice[]): IDevice | null {
  let busiest: IDevice | null = null;
  for (const device of devices) {
    if (
      hasFigures(device) &&
      (busiest === null || device.reserved > (busiest.reserved ?? 0))
    ) {
      busiest = device;
    }
  }
  return busiest;
}

/** The largest of allocated and reserved as a share of the cap, or null. */
export function capShare(device: IDevice): number | null {
  if (!hasFigures(device) || !device.limit || !(device.limit.bytes > 0)) {
    return null;
  }
  return Math.max(device.allocated, device.reserved) / device.limit.bytes;
}

/** What all processes use of the device, as a share of it, or null. */
export function deviceShare(device: IDevice): number | null {
  if (device.device_used === null || !device.total || device.total <= 0) {
    return null;
  }
  return device.device_used / device.total;
}

/**
 * Whether a device is near its end: allocated or reserved at 90 % of the cap
 * or more (when one is set), else the device 90 % used or more.
 */
export function nearTheEnd(device: IDevice): NearTheEnd {
  const cap = capShare(device);
  if (cap !== null && cap >= NEAR_THE_END) {
    return 'cap';
  }
  const used = deviceShare(device);
  if (used !== null && used >= NEAR_THE_END) {
    return 'device';
  }
  return null;
}

/**
 * The status bar's summary of the state; null when there is nothing to show
 * (no kernel, no kernel side, no GPU figures).
 */
export function statusSummary(
  state: IGpuMemState,
  trans: ITrans
): IStatusSummary | null {
  const status = state.status;
  if (!('sample' in status)) {
    return null;
  }
  const devices = status.sample.devices.filter(hasFigures);
  const device = busiestDevice(devices);
  if (device === null || !hasFigures(device)) {
    return null;
  }
  const replay = status.sample.replay ?? null;
  const figures = trans.__(
    '%1 / %2',
    formatBytes(device.allocated),
    formatBytes(device.reserved)
  );
  let text =
    devices.length > 1
      ? trans.__('%1: %2', deviceLabel(device.index, trans), figures)
      : trans.__('GPU %1', figures);
  if (replay) {
    text = trans.__('%1 (replay)', text);
  }
  return {
    index: device.index,
    text,
    near: nearTheEnd(device),
    replay,
    tooltip: tooltipLines(device, devices.length, state, replay, trans).join(
      '\n'
    )
  };
}

function tooltipLines(
  device: IDevice & { allocated: number; reserved: number },
  count: number,
  state: IGpuMemState,
  replay: IReplay | null,
  trans: ITrans
): string[] {
  const lines = [
    state.source
      ? trans.__(
          '%1 (%2) of the kernel of %3',
          deviceLabel(device.index, trans),
          device.name,
          state.source
        )
      : trans.__('%1 (%2)', deviceLabel(device.index, trans), device.name),
    trans.__(
      'Allocated %1: held by live tensors',
      formatBytes(device.allocated)
    ),
    trans.__(
      "Reserved %1: held by PyTorch's caching allocator (allocated plus cached free blocks)",
      formatBytes(device.reserved)
    )
  ];
  if (device.limit) {
    lines.push(
      trans.__(
        'Cap %1 (%2 of the device)',
        formatBytes(device.limit.bytes),
        formatPercent(device.limit.fraction)
      )
    );
  }
  if (device.device_used !== null && device.total) {
    lines.push(
      trans.__(
        'Device: %1 used of %2, by all processes',
        formatBytes(device.device_used),
        formatBytes(device.total)
      )
    );
  }
  const cap = capShare(device);
  if (cap !== null && cap >= NEAR_THE_END) {
    lines.push(
      device.reserved >= device.allocated
        ? trans.__('Near the cap: reserved is %1 of it', formatPercent(cap))
        : trans.__('Near the cap: allocated is %1 of it', formatPercent(cap))
    );
  }
  const used = deviceShare(device);
  if (used !== null && used >= NEAR_THE_END) {
    lines.push(
      trans.__('Nearly full: %1 of the device is used', formatPercent(used))
    );
  }
  if (count > 1) {
    lines.push(
      trans.__('The busiest of %1 GPUs: the one with the most reserved', count)
    );
  }
  if (replay) {
    lines.push(replayText(replay, trans));
  }
  lines.push(trans.__('Click to open the GPU memory panel'));
  return lines;
}
