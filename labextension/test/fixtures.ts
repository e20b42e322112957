/**
 * Protocol records for tests, with the figures of a small, known allocation.
 */
import {
  ACTIONS,
  IDevice,
  IFreeReport,
  IPostMortem,
  ISample,
  IWhoReport,
  IWhoResult
} from '../src/protocol';

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

/** A `who` report of device 0, shaped like the H200 recording's. */
export function whoReport(overrides: Partial<IWhoReport> = {}): IWhoReport {
  return {
    device: 0,
    by: 'variable',
    allocated: 100 * MiB,
    explained: 67 * MiB,
    rows: [
      {
        key: 'base',
        detail: 'tensor',
        bytes: 64 * MiB,
        blocks: 1,
        example: 'base',
        kind: 'owner',
        site: 'In[8] line 1'
      },
      {
        key: 'a',
        detail: 'tensor',
        bytes: 3 * MiB,
        blocks: 1,
        example: 'a',
        kind: 'owner',
        site: ''
      },
      {
        key: 'not reachable from the namespace',
        detail: 'temporaries of a running computation',
        bytes: 33 * MiB,
        blocks: 3,
        example: '',
        kind: 'unreachable',
        site: ''
      }
    ],
    tracking: false,
    notes: [],
    outside_allocator: 0,
    elapsed_ms: 1.5,
    ...overrides
  };
}

export function lineReport(): IWhoReport {
  return whoReport({
    by: 'line',
    tracking: true,
    explained: 64 * MiB,
    rows: [
      {
        key: 'In[8] line 1',
        detail:
          "`base = torch.empty(64 << 20, dtype=torch.uint8, device='cuda')`",
        bytes: 64 * MiB,
        blocks: 1,
        example: 'held by base',
        kind: 'site',
        site: ''
      },
      {
        key: 'no Python stack (backward pass or C++)',
        detail: '',
        bytes: 36 * MiB,
        blocks: 4,
        example: '',
        kind: 'untracked',
        site: ''
      }
    ]
  });
}

/** The recorded fragmentation OOM: 128 MiB asked, 64 MiB the largest block. */
export function postmortem(overrides: Partial<IPostMortem> = {}): IPostMortem {
  return {
    execution_count: 9,
    time: 1_763_000_000,
    device: 0,
    requested: 128 * MiB,
    free: 138 * GiB,
    total: 140 * GiB,
    cap: 1.13 * GiB,
    reserved: 1.1 * GiB,
    allocated: 598 * MiB,
    cached_free: 532 * MiB,
    releasable: 0,
    free_pieces: 13,
    free_pieces_bytes: 532 * MiB,
    largest_free_block: 64 * MiB,
    outside_torch: 742 * MiB,
    other_processes: [],
    owners: [],
    lines: [],
    fixes: [
      {
        kind: 'fragmentation',
        text: 'largest free block 64.00 MiB < 128.00 MiB requested while 531.98 MiB is free in 13 pieces: fragmentation; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the first CUDA call (restart the kernel with it)',
        frees: 532 * MiB,
        fits: true,
        command: 'PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True'
      },
      {
        kind: 'delete',
        text: '86.02 MiB is not reachable from the namespace',
        frees: 86 * MiB,
        fits: null,
        command: ''
      },
      {
        kind: 'empty_cache',
        text: 'empty-cache returns nothing',
        frees: 0,
        fits: false,
        command: '%gpumem empty-cache'
      }
    ],
    ...overrides
  };
}

export function whoResult(overrides: Partial<IWhoResult> = {}): IWhoResult {
  return {
    devices: [{ index: 0, by_variable: whoReport(), by_line: null }],
    tracking: false,
    postmortems: [],
    ...overrides
  };
}

/**
 * The recorded plan for freeing `base` (64 MiB, and `view`, another name for
 * its storage): its segment goes back to the driver. `done` with what came
 * back (`returned`; null: nothing measured, as on a replay kernel).
 */
export function freeReport(
  overrides: Partial<IFreeReport> = {},
  returned: number | null = null
): IFreeReport {
  const done = overrides.done === true;
  return {
    names: ['base'],
    let_go: [
      {
        holder: 'base',
        action: 'delete',
        why: 'the name you gave',
        bytes: 64 * MiB,
        code: 'del base'
      },
      {
        holder: 'view',
        action: 'delete',
        why: 'a part of base',
        bytes: 64 * MiB,
        code: 'del view'
      }
    ],
    kept: [],
    devices: [
      {
        device: 0,
        held: 64 * MiB,
        expected_freed: 64 * MiB,
        expected_returned: 64 * MiB,
        cached_free: 0,
        freed: done && returned !== null ? 64 * MiB : null,
        returned: done ? returned : null,
        still_held: done && returned !== null ? 0 : null
      }
    ],
    done,
    still: [],
    notes: [],
    elapsed_ms: 3.5,
    ...overrides
  };
}

/** What a kernel of revision 12 offers: every action but `free`. */
export const ACTIONS_BEFORE_FREE: string[] = ACTIONS.filter(a => a !== 'free');
