/**
 * The server's GPU table (`GET <base>api/gpumem/devices`, docs/server.md):
 * the reply's types, the request, and pure functions that turn a reply into
 * the rows of the "On this GPU" tab.
 *
 * It reads the server, not a kernel: it works for every kernel of the
 * server, also those that never loaded the IPython extension.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { ITrans } from '../lab/trans';

/** Path of the endpoint below the server's base URL. */
export const GPU_TABLE_PATH = 'api/gpumem/devices';

/** What a process on a GPU is to this server. */
export type ProcessRole = 'kernel' | 'child' | 'other' | 'ended';

/** A compute process on a GPU. */
export interface IGpuProcess {
  pid: number;
  /** As the process table shows it, or as NVML names it; null: unknown. */
  name: string | null;
  /** null: not readable. */
  user: string | null;
  /** Bytes on this device. */
  used: number;
  /** The kernel it is or belongs to (roles kernel and child). */
  kernel_id: string | null;
  role: ProcessRole;
}

export interface IGpuDevice {
  /** NVML's index. */
  index: number;
  /** Index under the server's CUDA_VISIBLE_DEVICES; null: not visible. */
  cuda_index: number | null;
  uuid: string;
  name: string;
  total: number;
  /** All processes, as NVML counts it (includes what the driver reserves). */
  used: number;
  /** Largest first. */
  processes: IGpuProcess[];
}

/** A kernel of this server, GPU or not. */
export interface IServerKernel {
  id: string;
  /** The kernel spec's name (python3). */
  name: string;
  /** null: not a local process (remote provisioner, gateway). */
  pid: number | null;
  /** The notebook or console, from the session manager. */
  path: string | null;
  execution_state: string;
  /** ISO 8601. */
  last_activity: string | null;
  connections: number;
  gpu_used: number;
  devices: { index: number; used: number }[];
  children: { pid: number; used: number }[];
}

export type PidNamespace = 'shared' | 'foreign' | 'unknown';

/** The reply of `GET api/gpumem/devices`, version 1. */
export interface IGpuTable {
  version: number;
  /** Server time of the reading, unix seconds. */
  time: number;
  nvml: { available: boolean; driver: string | null; error: string | null };
  pid_namespace: PidNamespace;
  /** Why processes are not matched with notebooks (foreign namespace). */
  note: string | null;
  devices: IGpuDevice[];
  kernels: IServerKernel[];
}

/** Why the table could not be read. */
export interface IGpuTableError {
  code: 'forbidden' | 'not_enabled' | 'http' | 'network' | 'bad_reply';
  /** HTTP status, when there was one. */
  status: number | null;
  /** The server's or the browser's words. */
  message: string;
}

export type GpuTableResult =
  { ok: true; table: IGpuTable } | { ok: false; error: IGpuTableError };

/**
 * Read the GPU table of the server. Never throws: a failure is a value with
 * its reason.
 */
export async function fetchGpuTable(
  settings: ServerConnection.ISettings
): Promise<GpuTableResult> {
  const url = URLExt.join(settings.baseUrl, GPU_TABLE_PATH);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(
      url,
      { method: 'GET', cache: 'no-store' },
      settings
    );
  } catch (reason) {
    return failure('network', null, messageOf(reason));
  }
  let body: string;
  try {
    body = await response.text();
  } catch (reason) {
    return failure('network', response.status, messageOf(reason));
  }
  if (!response.ok) {
    const message = serverMessage(body) || response.statusText;
    switch (response.status) {
      case 403:
        return failure('forbidden', 403, message);
      case 404:
        return failure('not_enabled', 404, message);
      default:
        return failure('http', response.status, message);
    }
  }
  let data: unknown;
  try {
    data = JSON.parse(body);
  } catch {
    return failure(
      'bad_reply',
      response.status,
      `not JSON: ${JSON.stringify(body.slice(0, 60))}`
    );
  }
  const problem = checkGpuTable(data);
  if (problem !== null) {
    return failure('bad_reply', response.status, problem);
  }
  return { ok: true, table: data as IGpuTable };
}

function failure(
  code: IGpuTableError['code'],
  status: number | null,
  message: string
): GpuTableResult {
  return { ok: false, error: { code, status, message } };
}

function messageOf(reason: unknown): string {
  return reason instanceof Error ? reason.message : String(reason);
}

/** jupyter_server's error pages for API requests are `{"message": ...}`. */
function serverMessage(body: string): string {
  try {
    const data = JSON.parse(body);
    return typeof data?.message === 'string' ? data.message : '';
  } catch {
    return '';
  }
}

const isObject = (x: unknown): x is Record<string, any> =>
  typeof x === 'object' && x !== null && !Array.isArray(x);

/**
 * What is wrong with a reply, or null when the view can draw it: the fields
 * the rows are made of, with their types.
 */
export function checkGpuTable(data: unknown): string | null {
  if (!isObject(data)) {
    return 'not an object';
  }
  if (data.version !== 1) {
    return `version ${JSON.stringify(data.version)}, expected 1`;
  }
  if (typeof data.time !== 'number' || !isObject(data.nvml)) {
    return 'no time or nvml';
  }
  if (!Array.isArray(data.devices) || !Array.isArray(data.kernels)) {
    return 'no devices or kernels';
  }
  for (const d of data.devices) {
    if (
      !isObject(d) ||
      typeof d.index !== 'number' ||
      typeof d.total !== 'number' ||
      typeof d.used !== 'number' ||
      !Array.isArray(d.processes)
    ) {
      return 'a device without index, total, used or processes';
    }
    for (const p of d.processes) {
      if (!isObject(p) || typeof p.pid !== 'number' || !isNumber(p.used)) {
        return 'a process without pid or used';
      }
    }
  }
  for (const k of data.kernels) {
    if (!isObject(k) || typeof k.id !== 'string') {
      return 'a kernel without id';
    }
  }
  return null;
}

function isNumber(x: unknown): boolean {
  return typeof x === 'number' && Number.isFinite(x);
}

/** The words for a failed read. */
export function gpuTableErrorText(
  error: IGpuTableError,
  trans: ITrans
): { title: string; detail: string } {
  switch (error.code) {
    case 'forbidden':
      return {
        title: trans.__('The server refused to list its GPUs (403)'),
        detail: trans
          .__(
            'Reading them needs the right to read kernels. Log in again or ask the server’s administrator. %1',
            error.message
          )
          .trim()
      };
    case 'not_enabled':
      return {
        title: trans.__('The jupyter_gpumem server extension is not enabled'),
        detail: trans.__(
          'The server has no %1 (404). Enable it with `jupyter server extension enable jupyter_gpumem` and restart the server.',
          GPU_TABLE_PATH
        )
      };
    case 'network':
      return {
        title: trans.__('The server did not answer'),
        detail: error.message
      };
    case 'bad_reply':
      return {
        title: trans.__('The server’s GPU table is not readable'),
        detail: trans.__(
          'Unexpected reply: %1. The server and the panel may be different versions of jupyter-gpumem.',
          error.message
        )
      };
    default:
      return {
        title: trans.__('Reading the GPU table failed (HTTP %1)', error.status),
        detail: error.message
      };
  }
}

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

export type GpuRow = IKernelRow | IProcessRow;

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
