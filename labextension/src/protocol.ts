/**
 * Types of the kernel <-> panel protocol, version 1, revision 6.
 *
 * docs/protocol.md and jupyter_gpumem/protocol/schema.json are the contract;
 * these types mirror them and must change with them.
 */

export const PROTOCOL_VERSION = 1;

/**
 * The revision this panel knows. A kernel of an older revision lacks some
 * actions: check `hello`'s `actions` before using one.
 */
export const PROTOCOL_REVISION = 6;

/** Message type of a request sent on the control channel. */
export const REQUEST_MSG_TYPE = 'gpumem_request';

/** Message type of the kernel's answer (same parent). */
export const REPLY_MSG_TYPE = 'gpumem_reply';

/**
 * Target name of the kernel's comm. The kernel sends no `comm_open`: its
 * samples come as `comm_msg` on a comm id that is stable for the kernel
 * process and that `hello` and `subscribe` return (`stream.comm_id`).
 */
export const COMM_TARGET = 'jupyter_gpumem';

export type SampleState =
  'ok' | 'no_torch' | 'cpu_only' | 'not_initialized' | 'no_gpu';

export type Backend = 'cuda' | 'rocm' | 'xpu' | 'mps' | 'nvml';

export interface ILimit {
  fraction: number;
  bytes: number;
}

export interface IDevice {
  index: number;
  name: string;
  backend: Backend;
  /** This process has a context: allocator figures are valid. */
  initialized: boolean;
  allocated: number | null;
  reserved: number | null;
  active: number | null;
  requested: number | null;
  /** Non-releasable fragmentation. */
  inactive_split: number | null;
  peak_allocated: number | null;
  peak_reserved: number | null;
  device_allocs: number | null;
  device_frees: number | null;
  alloc_retries: number | null;
  ooms: number | null;
  total: number | null;
  /** All processes (total - free). */
  device_used: number | null;
  /** This process (NVML), null when unknown. */
  process_used: number | null;
  limit: ILimit | null;
  error: string | null;
  /**
   * Revision 5: the kernel's child processes on this device (NVML), largest
   * first; absent when the kernel has none or NVML cannot tell.
   */
  children?: IChildProcess[];
}

/** A child process of the kernel (a worker, a launcher's rank) on a device. */
export interface IChildProcess {
  pid: number;
  name: string;
  used: number;
}

export interface ISample {
  /** Unix seconds. */
  time: number;
  state: SampleState;
  message: string;
  torch_version: string | null;
  host_rss: number | null;
  caching: boolean | null;
  devices: IDevice[];
}

export interface IStreamState {
  active: boolean;
  /** The smallest interval any live client asked for. */
  interval_ms: number;
  heartbeat_ms: number;
  /** The kernel's comm, stable for the process. */
  comm_id: string | null;
  /** A subscription lasts this long unless renewed. */
  lease_s: number;
  /** Clients with a live subscription. */
  clients: number;
}

/** A line of a cell and the bytes of live blocks it allocated. */
export interface ILineShare {
  line: number;
  text: string;
  bytes: number;
  blocks: number;
}

export interface ICellMarkerDevice {
  index: number;
  allocated_delta: number;
  reserved_delta: number;
  peak_allocated: number | null;
  /**
   * Revision 2, tracking on, the cell kept memory: the cell's lines that
   * allocated blocks still alive, largest first, at most 3.
   */
  kept_at?: ILineShare[];
}

export interface ICellMarker {
  execution_count: number | null;
  /** Unix seconds when the cell ended. */
  time: number;
  wall_time: number;
  failed: boolean;
  first_line: string;
  devices: ICellMarkerDevice[];
  /** Revision 2: the cell ran out of memory. */
  postmortems?: IPostMortem[];
}

export type WhoRowKind =
  'owner' | 'site' | 'cell' | 'unreachable' | 'untracked' | 'rest';

/** One row of a `who` report: an owner, a line or a cell, and what it holds. */
export interface IWhoRow {
  /** `acts`, `In[7] line 3`, `In[7]`, or a summary row (`2 more owners`). */
  key: string;
  /** How the owner holds it (by variable), the code (by line). */
  detail: string;
  bytes: number;
  blocks: number;
  /** A path to one tensor (by variable), the top holder (by line). */
  example: string;
  kind: WhoRowKind;
  /**
   * Revision 4, by variable with tracking on: where the owner's largest
   * block was allocated (`In[7] line 3`); empty when unknown.
   */
  site: string;
}

export type WhoBy = 'variable' | 'line' | 'cell';

/** Who holds the live blocks of one device; the rows add up to `allocated`. */
export interface IWhoReport {
  device: number;
  by: WhoBy;
  /** Bytes of live blocks (the allocator's allocated). */
  allocated: number;
  /** Bytes of the rows that name an owner or a site. */
  explained: number;
  /** Largest first; the last rows are the rest. */
  rows: IWhoRow[];
  tracking: boolean;
  notes: string[];
  outside_allocator: number;
  elapsed_ms: number;
}

export type FixKind =
  | 'fragmentation'
  | 'cap'
  | 'traceback'
  | 'output_history'
  | 'graph'
  | 'other_process'
  | 'delete'
  | 'empty_cache'
  | 'smaller';

/** One way out of an out-of-memory error. */
export interface IFix {
  kind: FixKind;
  text: string;
  /** Bytes it would free, when known. */
  frees: number | null;
  /**
   * Judged against what the failed cell needs: true when the whole cell's need
   * is known (a scan of it) and fits afterwards; null ("maybe") when it covers
   * what the cell needed up to the failure; false when it does not.
   */
  fits: boolean | null;
  /** What to run (may be empty). */
  command: string;
  /**
   * A first step before any retry, not a fix: it frees memory of the failed
   * run itself, which a re-run allocates again (revision 6).
   */
  first_step?: boolean;
  /** Bytes still missing after it, when it does not fit (revision 6). */
  shortfall?: number | null;
}

export interface IOtherProcess {
  pid: number;
  name: string;
  bytes: number;
}

/** Why a request ran out of memory on one device, and the fixes, best first. */
export interface IPostMortem {
  /** The cell that ran out of memory (revision 4). */
  execution_count: number | null;
  /** Unix seconds when it ran out (revision 4). */
  time: number;
  device: number;
  requested: number;
  free: number;
  total: number | null;
  cap: number | null;
  reserved: number;
  allocated: number;
  cached_free: number;
  releasable: number;
  free_pieces: number;
  free_pieces_bytes: number;
  largest_free_block: number;
  outside_torch: number | null;
  other_processes: IOtherProcess[];
  owners: IWhoRow[];
  lines: IWhoRow[];
  fixes: IFix[];
  /**
   * What the cell had allocated above its start when it failed, plus the
   * failed request (revision 6).
   */
  need?: number | null;
  /** What the whole cell needs, when a scan of it says (revision 6). */
  need_full?: number | null;
  /** What PyTorch can use for the cell here after the first steps (revision 6). */
  room?: number | null;
  /** The largest value that fits (after a scan), or the scan to run (revision 6). */
  hint?: string;
}

/** Every action the kernel accepts (test/protocol.spec.ts checks it against the schema). */
export const ACTIONS = [
  'hello',
  'sample',
  'empty_cache',
  'set_caching',
  'reset_peak',
  'set_limit',
  'subscribe',
  'unsubscribe',
  'who',
  'track',
  'release_traceback',
  'segments',
  'history'
] as const;

export type Action = (typeof ACTIONS)[number];

export interface IRequestContent {
  protocol: number;
  action: Action;
  args: Record<string, unknown>;
}

/** Every error code of a reply (test/protocol.spec.ts checks it against the schema). */
export const ERROR_CODES = [
  'bad_request',
  'unknown_action',
  'unsupported_protocol',
  'refused',
  'failed',
  'busy'
] as const;

export type ErrorCode = (typeof ERROR_CODES)[number];

/**
 * What `who` and `release_traceback` answer while a cell runs (code `busy`).
 */
export const BUSY_MESSAGE = 'busy: available when the cell ends';

/** Allocation tracking: recording now, and asked for (revision 3). */
export interface ITracking {
  active: boolean;
  /** Asked for; not yet active until torch is imported. */
  wanted: boolean;
}

export interface IHelloResult {
  protocol: number;
  /** Absent before revision 2. */
  revision?: number;
  /** Absent before revision 3. */
  tracking?: ITracking;
  version: string;
  actions: string[];
  sample: ISample;
  stream: IStreamState;
}

export interface ISampleResult {
  sample: ISample;
}

export interface IEmptyCacheResult {
  released: Record<string, number>;
  sample: ISample;
}

export interface ISetCachingResult {
  caching: boolean;
  sample: ISample;
}

export interface ISetLimitResult {
  limit: ILimit | null;
  sample: ISample;
}

export interface IStreamResult {
  stream: IStreamState;
}

/** One device of a `who` reply. */
export interface IWhoDevice {
  index: number;
  by_variable: IWhoReport;
  /** Only with tracking on. */
  by_line: IWhoReport | null;
}

export interface IWhoResult {
  devices: IWhoDevice[];
  tracking: boolean;
  /** Those of the last cell that ran out of memory. */
  postmortems: IPostMortem[];
}

export interface ITrackResult {
  /** A boolean before revision 3. */
  tracking: ITracking | boolean;
  message: string;
}

/** Kinds of blocks in a segment, in the user's words. */
export type BlockKind = 'allocated' | 'pending' | 'piece' | 'cached';

/**
 * One block: offset from the segment's start, size, kind, and the index of
 * the line that allocated it in the map's `labels` (-1: unknown).
 */
export type SegmentBlock = [number, number, BlockKind, number];

export interface ISegment {
  address: number;
  size: number;
  pool: string;
  stream: number;
  expandable: boolean;
  blocks: SegmentBlock[];
}

export interface ISegmentSummary {
  segments: number;
  reserved: number;
  allocated: number;
  cached_free: number;
  releasable: number;
  /** Free pieces in segments that also hold live blocks. */
  pieces: number;
  pieces_bytes: number;
  largest_free_block: number;
  /** Share of the free memory that is in pieces, 0..1. */
  fragmentation: number;
}

/** Every segment of one device and the blocks inside it (revision 5). */
export interface ISegmentMap {
  device: number;
  summary: ISegmentSummary;
  /** Largest first, at most `max_segments`. */
  segments: ISegment[];
  /** Allocation sites the blocks' label indices point into. */
  labels: string[];
  /** Segments left out by the limit, and their bytes. */
  omitted: number;
  omitted_bytes: number;
  tracking: boolean;
}

export interface ISegmentsResult {
  devices: ISegmentMap[];
}

/** One device of a measured cell, as the kernel keeps it (revision 5). */
export interface IHistoryCellDevice {
  index: number;
  allocated: number | null;
  allocated_delta: number | null;
  reserved: number | null;
  reserved_delta: number | null;
  peak_allocated: number | null;
  /** The peak above what was allocated when the cell started. */
  peak_above_start: number | null;
  /** With tracking: the line that allocated most of what the cell kept. */
  kept_at: string | null;
}

/** A measured cell (revision 5). */
export interface IHistoryCell {
  execution_count: number | null;
  /** Unix seconds when the cell ended. */
  time: number;
  first_line: string;
  wall_time: number;
  failed: boolean;
  devices: IHistoryCellDevice[];
}

export interface IHistoryResult {
  /** Oldest first. */
  cells: IHistoryCell[];
}

export interface IReleaseTracebackResult {
  /** Frames released. */
  frames: number;
  /** Bytes no longer allocated, per device index. */
  freed: Record<string, number>;
}

export interface IReplyOk<R = Record<string, unknown>> {
  protocol: number;
  action: Action;
  status: 'ok';
  result: R;
}

export interface IReplyError {
  protocol: number;
  action: Action;
  status: 'error';
  error: { code: ErrorCode; message: string };
}

export type Reply<R = Record<string, unknown>> = IReplyOk<R> | IReplyError;

/** The first message after the stream (re)starts. */
export interface ICommOpenData {
  protocol: number;
  type: 'open';
  /** Per kernel process, like the other messages' (absent before). */
  seq?: number;
  stream: IStreamState;
}

export interface ICommSampleData {
  protocol: number;
  type: 'sample';
  seq: number;
  sample: ISample;
}

export interface ICommHeartbeatData {
  protocol: number;
  type: 'heartbeat';
  seq: number;
  time: number;
  busy: boolean;
}

export interface ICommCellData {
  protocol: number;
  type: 'cell';
  seq: number;
  cell: ICellMarker;
}

export type CommData =
  ICommSampleData | ICommHeartbeatData | ICommCellData | ICommOpenData;

/**
 * Build the content of a `gpumem_request`.
 */
export function makeRequest(
  action: Action,
  args: Record<string, unknown> = {}
): IRequestContent {
  return { protocol: PROTOCOL_VERSION, action, args };
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * Check the shape of a reply well enough to read it safely.
 *
 * Returns a reason string when the content is not a protocol reply.
 */
export function checkReply(content: unknown): Reply | string {
  if (!isObject(content)) {
    return 'reply is not an object';
  }
  if (content.protocol !== PROTOCOL_VERSION) {
    return `unsupported protocol ${JSON.stringify(content.protocol)}`;
  }
  if (content.status === 'ok') {
    if (!isObject(content.result)) {
      return 'reply has no result';
    }
    return content as unknown as IReplyOk;
  }
  if (content.status === 'error') {
    if (!isObject(content.error)) {
      return 'error reply has no error';
    }
    return content as unknown as IReplyError;
  }
  return `unknown reply status ${JSON.stringify(content.status)}`;
}

/**
 * Check the shape of a comm message's data; null when it is not ours.
 */
export function checkCommData(data: unknown): CommData | null {
  if (!isObject(data) || data.protocol !== PROTOCOL_VERSION) {
    return null;
  }
  switch (data.type) {
    case 'open':
      return isObject(data.stream) ? (data as unknown as ICommOpenData) : null;
    case 'sample':
      return typeof data.seq === 'number' && isObject(data.sample)
        ? (data as unknown as ICommSampleData)
        : null;
    case 'heartbeat':
      return typeof data.seq === 'number'
        ? (data as unknown as ICommHeartbeatData)
        : null;
    case 'cell':
      return typeof data.seq === 'number' && isObject(data.cell)
        ? (data as unknown as ICommCellData)
        : null;
    default:
      return null;
  }
}
