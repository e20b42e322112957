/**
 * Protocol records for tests, with the figures of a small, known allocation.
 */
import { ACTIONS, IDevice, ISample } from '../src/protocol';

export const GiB = 1024 ** 3;
export const MiB = 1024 ** 2;

export function device(overrides: Partial<IDevice> = {}): IDevice {
  return {
    index: 0,
    name: 'NVIDIA H200',
    backend: 'cuda',
    initialized: true,
    allocated: 1 * GiB,
    reserved: 2 * GiB,
    active: 1 * GiB,
    requested: 1 * GiB,
    inactive_split: 20 * MiB,
    peak_allocated: 3 * GiB,
    peak_reserved: 4 * GiB,
    device_allocs: 3,
    device_frees: 1,
    alloc_retries: 0,
    ooms: 0,
    total: 140 * GiB,
    device_used: 10 * GiB,
    process_used: 2.5 * GiB,
    limit: null,
    error: null,
    ...overrides
  };
}

export function uninitializedDevice(overrides: Partial<IDevice> = {}): IDevice {
  return device({
    initialized: false,
    allocated: null,
    reserved: null,
    active: null,
    requested: null,
    inactive_split: null,
    peak_allocated: null,
    peak_reserved: null,
    device_allocs: null,
    device_frees: null,
    alloc_retries: null,
    ooms: null,
    process_used: null,
    ...overrides
  });
}

export function sample(overrides: Partial<ISample> = {}): ISample {
  return {
    time: 1000,
    state: 'ok',
    message: '',
    torch_version: '2.11.0',
    host_rss: 800 * MiB,
    caching: true,
    devices: [device()],
    ...overrides
  };
}

export const STREAM = {
  active: true,
  interval_ms: 500,
  heartbeat_ms: 2000,
  comm_id: 'comm-1',
  lease_s: 60,
  clients: 1
};

export function okReply(action: string, result: Record<string, unknown>) {
  return { protocol: 1, action, status: 'ok', result } as any;
}

export function errorReply(action: string, code: string, message: string) {
  return {
    protocol: 1,
    action,
    status: 'error',
    error: { code, message }
  } as any;
}

export function helloResult(s: ISample = sample()) {
  return {
    protocol: 1,
    version: '0.1.0',
    actions: [...ACTIONS] as string[],
    sample: s,
    stream: { ...STREAM, active: false, clients: 0 }
  };
}
