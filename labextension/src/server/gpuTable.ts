/**
 * The server's GPU table (`GET <base>api/gpumem/devices`, docs/server.md):
 * the reply's types, the request, its check and the words for a failed read.
 * gpuRows.ts turns a reply into the rows of the "On this GPU" tab.
 *
 * It reads the server, not a kernel: it works for every kernel of the
 * server, also those that never loaded the IPython extension.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { ITrans } from '../present/trans';

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
  /** What the driver reserves (NVML v2); null: not told. */
  driver_reserved?: number | null;
  /**
   * In use but held by no process NVML lists: processes outside this server's
   * PID namespace; null when NVML could not list the processes.
   */
  unseen?: number | null;
  /** Largest first. */
  processes: IGpuProcess[];
  /**
   * Where NVML's PIDs are foreign: what this server's kernels say PyTorch
   * holds for them on this device.
   */
  reported?: IReportedUse[];
}

/** What a kernel said PyTorch holds for it on one device. */
export interface IReportedUse {
  kernel_id: string;
  reserved: number;
  allocated: number;
  /** Unix seconds when the kernel answered. */
  time: number;
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
