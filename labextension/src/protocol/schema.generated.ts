/**
 * Generated from jupyter_gpumem/protocol/schema.json by
 * scripts/generate-protocol.mjs: do not edit. `npm run generate` writes it
 * again; a test fails when it is stale.
 */

export const PROTOCOL_VERSION = 1;

/** Additions an older peer can ignore raise the revision. */
export const PROTOCOL_REVISION = 14;

export const REQUEST_MSG_TYPE = 'gpumem_request';

export const REPLY_MSG_TYPE = 'gpumem_reply';

export const COMM_TARGET = 'jupyter_gpumem';

/** Every action the kernel answers, in the schema's order. */
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
  'history',
  'free',
  'last_cell'
] as const;

export type Action = (typeof ACTIONS)[number];

/** The error codes of an error reply. */
export const ERROR_CODES = [
  'bad_request',
  'unknown_action',
  'unsupported_protocol',
  'refused',
  'failed',
  'busy'
] as const;

export type ErrorCode = (typeof ERROR_CODES)[number];

export interface IErrorBody {
  code:
    | 'bad_request'
    | 'unknown_action'
    | 'unsupported_protocol'
    | 'refused'
    | 'failed'
    | 'busy';
  message: string;
}

export interface IStreamState {
  active: boolean;
  interval_ms: number;
  heartbeat_ms: number;
  comm_id: string | null;
  lease_s: number;
  clients: number;
}

export interface ILimit {
  fraction: number;
  bytes: number;
}

export interface ISample {
  time: number;
  state: 'ok' | 'no_torch' | 'cpu_only' | 'not_initialized' | 'no_gpu';
  message: string;
  torch_version: string | null;
  host_rss: number | null;
  caching: boolean | null;
  devices: IDevice[];
  workers?: IWorker[];
  replay?: IReplay;
}

export interface IReplay {
  gpu: string;
  torch_version: string | null;
  recorded?: string | null;
  description: string;
}

export interface IWorker {
  pid: number;
  rank: number | null;
  host: string;
  status: 'exited' | 'running' | 'silent';
  started_in_cell: boolean;
  age: number;
  devices: {
    index: number;
    name: string;
    allocated: number;
    reserved: number;
    peak_allocated: number;
    peak_reserved: number;
    ooms: number;
  }[];
}

export interface IDevice {
  index: number;
  name: string;
  backend: 'cuda' | 'rocm' | 'xpu' | 'mps' | 'nvml';
  initialized: boolean;
  allocated: number | null;
  reserved: number | null;
  active: number | null;
  requested: number | null;
  inactive_split: number | null;
  peak_allocated: number | null;
  peak_reserved: number | null;
  device_allocs: number | null;
  device_frees: number | null;
  alloc_retries: number | null;
  ooms: number | null;
  total: number | null;
  device_used: number | null;
  process_used: number | null;
  limit: null | ILimit;
  error: string | null;
  children?: { pid: number; name: string; used: number }[];
}

export interface ICellMarker {
  execution_count: number | null;
  time: number;
  wall_time: number;
  failed: boolean;
  first_line: string;
  devices: {
    index: number;
    allocated_delta: number;
    reserved_delta: number;
    peak_allocated: number | null;
    kept_at?: ILineShare[];
  }[];
  postmortems?: IPostMortem[];
  forecasts?: IForecast[];
}

export interface IForecast {
  device: number;
  worker: string | null;
  bytes_per_cell: number;
  cells_left: number;
  seconds_left: number | null;
  limit: number;
  limit_kind: 'cap' | 'device';
  allocated: number;
  cells: number;
  first_cell: number | null;
  who: string | null;
}

export interface ISegmentMap {
  device: number;
  summary: {
    segments: number;
    reserved: number;
    allocated: number;
    cached_free: number;
    releasable: number;
    pieces: number;
    pieces_bytes: number;
    largest_free_block: number;
    fragmentation: number;
  };
  segments: {
    address: number;
    size: number;
    pool: string;
    stream: number;
    expandable: boolean;
    blocks: [
      number,
      number,
      'allocated' | 'pending' | 'piece' | 'cached',
      number
    ][];
  }[];
  labels: string[];
  omitted: number;
  omitted_bytes: number;
  tracking: boolean;
}

export interface ISegmentsWorker {
  pid: number;
  rank: number | null;
  host: string;
  label: string;
  note: string;
  trimmed: boolean;
}

export interface IHistoryCell {
  execution_count: number | null;
  time: number;
  first_line: string;
  wall_time: number;
  failed: boolean;
  devices: {
    index: number;
    allocated: number | null;
    allocated_delta: number | null;
    reserved: number | null;
    reserved_delta: number | null;
    peak_allocated: number | null;
    peak_above_start: number | null;
    kept_at: string | null;
    ooms?: number | null;
    worker?: string | null;
    oom?: string;
  }[];
}

export interface ILastCell {
  execution_count: number | null;
  devices: {
    index: number;
    peak_reserved: number | null;
    peak_exact: boolean;
    kept_lines: null | ILineShare[];
    breakdown: null | IBreakdown;
  }[];
  breakdown_note: string | null;
}

export interface IBreakdown {
  device: number;
  peak: number;
  base: number;
  categories: { category: string; bytes: number; blocks: number }[];
  phase: 'forward' | 'backward' | 'optimizer step' | 'other';
  modules: { module: string; activations: number; temporaries: number }[];
  reserved_at_peak: number | null;
  outside_torch: number | null;
  exact: boolean;
  events: number;
  peak_event: number;
  counter_peak: number | null;
  note: string;
}

export interface ILineShare {
  line: number;
  text: string;
  bytes: number;
  blocks: number;
}

export interface ITracking {
  active: boolean;
  wanted: boolean;
}

export interface IWhoRow {
  key: string;
  detail: string;
  bytes: number;
  blocks: number;
  example: string;
  kind: 'owner' | 'site' | 'cell' | 'unreachable' | 'untracked' | 'rest';
  site: string;
}

export interface IWhoReport {
  device: number;
  by: 'variable' | 'line' | 'cell';
  allocated: number;
  explained: number;
  rows: IWhoRow[];
  tracking: boolean;
  notes: string[];
  outside_allocator: number;
  elapsed_ms: number;
}

export interface IFix {
  kind:
    | 'fragmentation'
    | 'cap'
    | 'traceback'
    | 'output_history'
    | 'graph'
    | 'other_process'
    | 'delete'
    | 'empty_cache'
    | 'smaller';
  text: string;
  frees: number | null;
  fits: boolean | null;
  command: string;
  first_step?: boolean;
  shortfall?: number | null;
  free_names?: string[];
}

export interface IPostMortem {
  execution_count: number | null;
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
  other_processes: { pid: number; name: string; bytes: number }[];
  owners: IWhoRow[];
  lines: IWhoRow[];
  fixes: IFix[];
  need?: number | null;
  need_full?: number | null;
  room?: number | null;
  hint?: string;
}

export interface IFreeReport {
  names: string[];
  let_go: IFreeLetGo[];
  kept: IFreeHolder[];
  devices: IFreeDevice[];
  done: boolean;
  still: IFreeHolder[];
  notes: string[];
  elapsed_ms: number;
}

export interface IFreeLetGo {
  holder: string;
  action: 'delete' | 'forget' | 'release' | 'detach' | 'unhook' | 'teardown';
  why: string;
  bytes: number;
  code: string;
}

export interface IFreeHolder {
  holder: string;
  bytes: number;
  example: string;
  why: string;
  fix: string;
}

export interface IFreeDevice {
  device: number;
  held: number;
  expected_freed: number;
  expected_returned: number;
  cached_free: number;
  freed: number | null;
  returned: number | null;
  still_held: number | null;
}

/** Each action's arguments. */
export interface IActionArgs {
  hello: Record<string, never>;
  sample: Record<string, never>;
  empty_cache: { collect_garbage?: boolean };
  set_caching: { enabled: boolean };
  reset_peak: { device?: number };
  set_limit: { device?: number; bytes?: number; fraction?: number };
  subscribe: { interval_ms: number; heartbeat_ms?: number; client?: string };
  unsubscribe: { client?: string };
  who: { device?: number; n?: number };
  track: { enabled: boolean };
  release_traceback: Record<string, never>;
  segments: {
    device?: number;
    max_segments?: number;
    rank?: number;
    pid?: number;
  };
  history: { n?: number };
  free: { names: string[]; dry?: boolean };
  last_cell: Record<string, never>;
}

/** Each action's result (the `result` of an ok reply). */
export interface IActionResults {
  hello: {
    protocol: 1;
    revision?: number;
    tracking?: ITracking;
    version: string;
    actions: string[];
    sample: ISample;
    stream: IStreamState;
  };
  sample: { sample: ISample };
  empty_cache: { released: Record<string, number>; sample: ISample };
  set_caching: { caching: boolean; sample: ISample };
  reset_peak: { sample: ISample };
  set_limit: { limit: null | ILimit; sample: ISample };
  subscribe: { stream: IStreamState };
  unsubscribe: { stream: IStreamState };
  who: {
    devices: {
      index: number;
      by_variable: IWhoReport;
      by_line: null | IWhoReport;
    }[];
    tracking: boolean;
    postmortems: IPostMortem[];
  };
  track: { tracking: ITracking; message: string };
  release_traceback: { frames: number; freed: Record<string, number> };
  segments: { devices: ISegmentMap[]; worker?: ISegmentsWorker };
  history: { cells: IHistoryCell[] };
  free: { report: IFreeReport; sample: ISample };
  last_cell: { cell: null | ILastCell };
}

/** What the kernel pushes on the comm. */
export type CommMessage =
  | { protocol: 1; type: 'open'; seq: number; stream: IStreamState }
  | { protocol: 1; type: 'sample'; seq: number; sample: ISample }
  | { protocol: 1; type: 'heartbeat'; seq: number; time: number; busy: boolean }
  | { protocol: 1; type: 'cell'; seq: number; cell: ICellMarker };
