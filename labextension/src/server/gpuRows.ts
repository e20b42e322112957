/**
 * The rows of the "On this GPU" tab for one reply of the server's GPU table:
 * per device its notebooks (with their children), the other processes, what
 * kernels report where NVML's PIDs are foreign, and the memory no listed
 * process holds. Pure functions, no DOM.
 */
import { ITrans } from '../present/trans';
import { IGpuDevice, IGpuTable, IServerKernel, PidNamespace } from './gpuTable';

/**
 * What a kernel is doing, in the server's words, with how long it has been
 * idle (server clock: the reading's `time` minus `last_activity`).
 */
export type KernelActivity =
  | { kind: 'idle'; idleMs: number | null }
  | { kind: 'busy' }
  | { kind: 'other'; state: string };

/** A kernel on a device, with its children there. */
export interface IKernelRow {
  kind: 'kernel';
  kernelId: string;
  /** The notebook's path, else the kernel's name (a kernel without session). */
  label: string;
  path: string | null;
  /** The kernel process; null when only its children use this device. */
  pid: number | null;
  /** The kernel and its children on this device. */
  bytes: number;
  activity: KernelActivity;
  /** The kernel of the notebook the panel follows. */
  thisNotebook: boolean;
  /** Idle, another notebook's, still on the server. */
  canShutDown: boolean;
  children: IChildRow[];
}

export interface IChildRow {
  pid: number;
  name: string | null;
  bytes: number;
}

/** A process that is no kernel of this server (or one that ended). */
export interface IProcessRow {
  kind: 'process';
  pid: number;
  name: string | null;
  user: string | null;
  bytes: number;
  role: 'other' | 'ended';
}

/**
 * A notebook named from what its kernel reports (NVML's PIDs are foreign:
 * no process is matched with it): PyTorch's reserved and allocated memory.
 */
export interface IReportedRow {
  kind: 'reported';
  kernelId: string;
  label: string;
  path: string | null;
  /** What PyTorch reserves for it: the row's memory. */
  bytes: number;
  allocated: number;
  activity: KernelActivity;
  thisNotebook: boolean;
}

/** Memory in use that no process NVML lists holds (outside this server). */
export interface IUnseenRow {
  kind: 'unseen';
  bytes: number;
  /** The driver's own reservation is excluded (else it is included). */
  driverExcluded: boolean;
}

export type GpuRow = IKernelRow | IProcessRow | IReportedRow | IUnseenRow;

export interface IDeviceRows {
  index: number;
  cudaIndex: number | null;
  uuid: string;
  name: string;
  used: number;
  total: number;
  /** Largest first. */
  rows: GpuRow[];
}

export interface IGpuTableView {
  /** What to say before (or instead of) the devices. */
  kind: 'ok' | 'nvml_unavailable' | 'no_gpu';
  /** NVML's error: why there is no GPU, or a failure beside what was read. */
  nvmlError: string | null;
  namespace: PidNamespace;
  note: string | null;
  devices: IDeviceRows[];
}

/**
 * The rows of the tab for one reply. `followedKernelId`: the kernel of the
 * notebook the panel follows ("this notebook", never offered a shutdown).
 */
export function gpuTableView(
  table: IGpuTable,
  followedKernelId: string | null
): IGpuTableView {
  const kernels = new Map(table.kernels.map(k => [k.id, k]));
  const devices = table.devices.map(d =>
    deviceRows(d, kernels, table.time, followedKernelId)
  );
  let kind: IGpuTableView['kind'] = 'ok';
  if (devices.length === 0) {
    kind = table.nvml.available ? 'no_gpu' : 'nvml_unavailable';
  }
  return {
    kind,
    nvmlError: table.nvml.error ?? null,
    namespace: table.pid_namespace,
    note: table.note ?? null,
    devices
  };
}

/** Unseen memory smaller than this is not shown as a row. */
export const UNSEEN_MIN = 1 << 20;

function deviceRows(
  device: IGpuDevice,
  kernels: ReadonlyMap<string, IServerKernel>,
  time: number,
  followedKernelId: string | null
): IDeviceRows {
  const rows: GpuRow[] = [];
  const byKernel = new Map<string, IKernelRow>();
  for (const p of device.processes) {
    const kernelId = p.kernel_id;
    if ((p.role === 'kernel' || p.role === 'child') && kernelId !== null) {
      let row = byKernel.get(kernelId);
      if (!row) {
        row = kernelRow(
          kernelId,
          kernels.get(kernelId),
          time,
          followedKernelId
        );
        byKernel.set(kernelId, row);
        rows.push(row);
      }
      row.bytes += p.used;
      if (p.role === 'kernel') {
        row.pid = p.pid;
      } else {
        row.children.push({ pid: p.pid, name: p.name, bytes: p.used });
      }
    } else {
      rows.push({
        kind: 'process',
        pid: p.pid,
        name: p.name,
        user: p.user,
        bytes: p.used,
        role: p.role === 'ended' ? 'ended' : 'other'
      });
    }
  }
  for (const row of byKernel.values()) {
    row.children.sort((a, b) => b.bytes - a.bytes);
  }
  for (const use of device.reported ?? []) {
    const kernel = kernels.get(use.kernel_id);
    rows.push({
      kind: 'reported',
      kernelId: use.kernel_id,
      label: kernel ? kernelLabel(kernel) : use.kernel_id,
      path: kernel?.path ?? null,
      bytes: use.reserved,
      allocated: use.allocated,
      activity: kernel
        ? kernelActivity(kernel, time)
        : { kind: 'other', state: 'unknown' },
      thisNotebook: use.kernel_id === followedKernelId
    });
  }
  // Below a mebibyte: rounding in the driver's figures, not a process.
  if (typeof device.unseen === 'number' && device.unseen >= UNSEEN_MIN) {
    rows.push({
      kind: 'unseen',
      bytes: device.unseen,
      driverExcluded: typeof device.driver_reserved === 'number'
    });
  }
  // Stable: equal sizes keep the server's order.
  rows.sort((a, b) => b.bytes - a.bytes);
  return {
    index: device.index,
    cudaIndex: device.cuda_index ?? null,
    uuid: device.uuid,
    name: device.name,
    used: device.used,
    total: device.total,
    rows
  };
}

function kernelRow(
  kernelId: string,
  kernel: IServerKernel | undefined,
  time: number,
  followedKernelId: string | null
): IKernelRow {
  const activity: KernelActivity = kernel
    ? kernelActivity(kernel, time)
    : { kind: 'other', state: 'unknown' };
  const thisNotebook = kernelId === followedKernelId;
  return {
    kind: 'kernel',
    kernelId,
    label: kernel ? kernelLabel(kernel) : kernelId,
    path: kernel?.path ?? null,
    pid: null,
    bytes: 0,
    activity,
    thisNotebook,
    canShutDown: !!kernel && !thisNotebook && activity.kind === 'idle',
    children: []
  };
}

/** The notebook or console of a kernel; its kernel spec's name without one. */
export function kernelLabel(kernel: IServerKernel): string {
  return kernel.path !== null && kernel.path !== ''
    ? kernel.path
    : kernel.name || kernel.id;
}

/**
 * Busy kernels are not idle; an idle kernel has been idle since its last
 * activity, measured on the server's clock (`time`, unix seconds).
 */
export function kernelActivity(
  kernel: Pick<IServerKernel, 'execution_state' | 'last_activity'>,
  time: number
): KernelActivity {
  switch (kernel.execution_state) {
    case 'idle': {
      const last =
        kernel.last_activity === null ? NaN : Date.parse(kernel.last_activity);
      return {
        kind: 'idle',
        idleMs: Number.isFinite(last) ? Math.max(0, time * 1000 - last) : null
      };
    }
    case 'busy':
      return { kind: 'busy' };
    default:
      return { kind: 'other', state: kernel.execution_state || 'unknown' };
  }
}

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;

/** A duration as the tab writes it: "45 s", "12 min", "3 h 12 min", "2 d 4 h". */
export function formatDuration(ms: number, trans: ITrans): string {
  if (ms < MINUTE) {
    return trans.__('%1 s', Math.floor(Math.max(0, ms) / 1000));
  }
  if (ms < HOUR) {
    return trans.__('%1 min', Math.floor(ms / MINUTE));
  }
  if (ms < DAY) {
    const h = Math.floor(ms / HOUR);
    const min = Math.floor((ms % HOUR) / MINUTE);
    return min === 0 ? trans.__('%1 h', h) : trans.__('%1 h %2 min', h, min);
  }
  const d = Math.floor(ms / DAY);
  const h = Math.floor((ms % DAY) / HOUR);
  return h === 0 ? trans.__('%1 d', d) : trans.__('%1 d %2 h', d, h);
}

/** "idle 3 h 12 min", "busy", "starting". */
export function activityText(activity: KernelActivity, trans: ITrans): string {
  switch (activity.kind) {
    case 'idle':
      return activity.idleMs === null
        ? trans.__('idle')
        : trans.__('idle %1', formatDuration(activity.idleMs, trans));
    case 'busy':
      return trans.__('busy');
    default:
      return activity.state;
  }
}
