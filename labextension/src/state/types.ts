/**
 * The panel's state and the events that change it: the types every slice
 * shares, the limits, the initial state.
 */
import {
  Action,
  CommData,
  ICellMarker,
  IForecast,
  IFreeReport,
  IHistoryResult,
  ILimit,
  IPostMortem,
  ISample,
  ISegmentsResult,
  IStreamState,
  IWhoResult,
  Reply,
  SampleState
} from '../protocol';

/**
 * What the panel shows, one message per kind; never a blank panel.
 */
export type PanelStatus =
  | { kind: 'no_kernel' }
  | { kind: 'loading' }
  | { kind: 'not_loaded' }
  | { kind: 'incompatible'; message: string }
  | { kind: 'restarting' }
  | { kind: 'dead' }
  | { kind: SampleState; sample: ISample };

export type StatusKind = PanelStatus['kind'];

/**
 * User actions; all but `attach` are protocol actions.
 */
export type UserAction =
  | 'attach'
  | 'empty_cache'
  | 'set_caching'
  | 'reset_peak'
  | 'set_limit'
  | 'track'
  | 'release_traceback';

/**
 * One point of the trend line of a device.
 */
export interface ITrendPoint {
  time: number;
  allocated: number;
  reserved: number;
  /** What this process uses on the device (NVML); null when unknown. */
  process: number | null;
}

/**
 * The outcome of a successful action, as data; the view words it.
 */
export type Notice =
  | { kind: 'released'; released: Record<string, number> }
  | { kind: 'caching'; requested: boolean; caching: boolean }
  | { kind: 'peak_reset'; device: number | null }
  | { kind: 'limit'; device: number | null; limit: ILimit | null }
  | { kind: 'attached' }
  | {
      kind: 'tracking';
      requested: boolean;
      tracking: boolean;
      /** The kernel's words. */
      message: string;
    }
  | {
      kind: 'traceback_released';
      frames: number;
      freed: Record<string, number>;
    };

/**
 * A refused or failed action with the kernel's reason.
 */
export interface IActionError {
  action: string;
  code: string;
  message: string;
}

/**
 * Where the reading of `who` stands: never read, on its way, refused because a
 * cell runs, failed, or read.
 */
export type WhoStatus = 'idle' | 'loading' | 'busy' | 'error' | 'ok';

export interface IWhoState {
  status: WhoStatus;
  /**
   * The last reading; kept while the next one loads, comes back busy or
   * fails (the view marks it as older).
   */
  data: IWhoResult | null;
  /** Why the last reading failed (status `error`). */
  error: IActionError | null;
  /** When `data` was read: ms since the epoch, the panel's clock. */
  fetchedAt: number | null;
}

export const WHO_IDLE: IWhoState = {
  status: 'idle',
  data: null,
  error: null,
  fetchedAt: null
};

/**
 * Where a Free was asked from, so that the view shows its preview and result
 * there: an owner row of a device's Who table, or a fix of a device's
 * out-of-memory post-mortem (by its place in the list).
 */
export type FreeOrigin =
  | { kind: 'owner'; device: number; key: string }
  | { kind: 'fix'; device: number; index: number };

/**
 * Where a Free stands: its preview (a dry run) on its way, shown, the free on
 * its way, done; `busy` (a cell runs: the kernel lets go of nothing then) and
 * `error` (refused, failed, no answer) for the last request (`dry` says which).
 */
export type FreeStatus =
  'previewing' | 'preview' | 'freeing' | 'done' | 'busy' | 'error';

export interface IFreeState {
  /** The names to free (a variable, `Out[N]`, `_`). */
  names: readonly string[];
  origin: FreeOrigin;
  status: FreeStatus;
  /** The last request (or the one on its way) was a dry run. */
  dry: boolean;
  /** The plan, from the dry run; kept while the free goes. */
  preview: IFreeReport | null;
  /** What was let go and what came back. */
  result: IFreeReport | null;
  /** Why the last request failed (status `error`). */
  error: IActionError | null;
}

/**
 * Whose segment map the Segments tab reads: a worker process of the kernel
 * (by pid, with its rank as the sample showed it); null: the kernel's own.
 */
export interface ISegmentsSource {
  pid: number;
  rank: number | null;
}

/** The views read on request (their tab shown), not streamed. */
export type ReadingView = 'segments' | 'history';

export const READING_VIEWS: readonly ReadingView[] = ['segments', 'history'];

/** What each reading view reads. */
export interface IReadings {
  segments: IReading<ISegmentsResult>;
  history: IReading<IHistoryResult>;
}

/**
 * A reading of a view: never read, on its way, failed or read. The last data
 * stays while the next reading loads or fails.
 */
export interface IReading<T> {
  status: 'idle' | 'loading' | 'error' | 'ok';
  data: T | null;
  error: IActionError | null;
  /** When `data` was read: ms since the epoch, the panel's clock. */
  fetchedAt: number | null;
}

export const READING_IDLE: IReading<never> = {
  status: 'idle',
  data: null,
  error: null,
  fetchedAt: null
};

export const NO_READINGS: IReadings = {
  segments: READING_IDLE,
  history: READING_IDLE
};

/**
 * What belongs to the kernel process now running: it goes as a whole when the
 * process goes (a restart, a dead kernel; `NO_PROCESS`).
 */
export interface IProcessState {
  /** A cell is executing in the kernel. */
  busy: boolean;
  /** Newest applied sample; cleared when the kernel process goes away. */
  sample: ISample | null;
  stream: IStreamState | null;
  commId: string | null;
  lastSeq: number | null;
  /** Kernel time (unix seconds) of the newest sample or heartbeat. */
  lastHeard: number | null;
  /** Trend points per device index, oldest first. */
  history: Readonly<Record<number, readonly ITrendPoint[]>>;
  /** Measured cells, oldest first. */
  cells: readonly ICellMarker[];
  /** The action waiting for its reply. */
  pending: UserAction | null;
  /** Who holds the memory: the last `who` reading. */
  who: IWhoState;
  /**
   * Allocation tracking is recording in the kernel, from `hello`, `who` and
   * `track`; null: unknown.
   */
  tracking: boolean | null;
  /** Tracking was asked for (it starts once the notebook imports torch). */
  trackingWanted: boolean;
  /** The segment map and the measured cells, read while their tab shows. */
  readings: IReadings;
  /**
   * Whose segment map the Segments tab shows; null: the kernel's own (a
   * worker goes with the process that started it).
   */
  segmentsSource: ISegmentsSource | null;
  /**
   * The last out-of-memory post-mortems, from a `who` reply or a cell marker
   * (the kernel keeps those of the last cell that ran out of memory).
   */
  postmortems: readonly IPostMortem[];
  /**
   * The forecasts before the OOM made after the last measured cell that
   * touched a device (its marker); null before any.
   */
  forecast: IForecastState | null;
  /** The Free opened in the Who tab (one at a time); null: none. */
  free: IFreeState | null;
}

/** The process fields before a process talked, and after it went. */
export const NO_PROCESS: Readonly<IProcessState> = {
  busy: false,
  sample: null,
  stream: null,
  commId: null,
  lastSeq: null,
  lastHeard: null,
  history: {},
  cells: [],
  pending: null,
  who: WHO_IDLE,
  tracking: null,
  trackingWanted: false,
  readings: NO_READINGS,
  segmentsSource: null,
  postmortems: [],
  forecast: null,
  free: null
};

export interface IGpuMemState {
  /** What belongs to the kernel process now running (`NO_PROCESS`: none). */
  process: IProcessState;
  status: PanelStatus;
  /** Id of the followed kernel; replies are only applied for it. */
  kernelId: string | null;
  /** Name of the followed notebook or console. */
  source: string | null;
  /** Version of the kernel-side package, from `hello`. */
  version: string | null;
  /** The protocol revision the kernel speaks, from `hello`; null: unknown. */
  revision: number | null;
  /** Actions the kernel side says it supports. */
  actions: readonly string[];
  notice: Notice | null;
  lastError: IActionError | null;
  /** Length of the trend history. */
  trendMinutes: number;
}

/** What the last measured cell's marker forecast (`CellMarker.forecasts`). */
export interface IForecastState {
  /** Execution count of that cell. */
  cell: number | null;
  /** One per device that grew steadily; empty: none does. */
  forecasts: readonly IForecast[];
}

export type GpuMemEvent =
  | { type: 'follow'; kernelId: string | null; source: string | null }
  | { type: 'kernel_status'; status: string }
  | { type: 'hello_sent'; quiet: boolean }
  | { type: 'hello_timeout' }
  | {
      type: 'reply';
      action: Action;
      reply: Reply;
      args?: Record<string, unknown>;
      /** When the reply came: ms since the epoch (who: its `fetchedAt`). */
      at?: number;
    }
  | { type: 'who_sent' }
  /** A `free` request went out (a preview when `dry`). */
  | {
      type: 'free_sent';
      names: readonly string[];
      dry: boolean;
      origin: FreeOrigin;
    }
  /** A `free` request got no protocol reply (timeout, no kernel, bad reply). */
  | { type: 'free_failed'; code: string; message: string }
  /** The Free's preview or result was closed (Cancel, Close). */
  | { type: 'free_closed' }
  | { type: 'reading_sent'; view: ReadingView }
  /** The Segments tab's chooser: a worker process's map, or the kernel's. */
  | { type: 'segments_source'; source: ISegmentsSource | null }
  /** A reading got no protocol reply (timeout, no kernel, bad reply). */
  | { type: 'reading_failed'; view: ReadingView; code: string; message: string }
  /** A `who` request got no protocol reply (timeout, no kernel, bad reply). */
  | { type: 'who_failed'; code: string; message: string }
  | { type: 'no_reply'; action: Action }
  | { type: 'comm'; commId: string; data: CommData }
  | { type: 'busy'; busy: boolean }
  | { type: 'pending'; action: UserAction | null }
  | { type: 'attach_result'; error: string | null }
  | { type: 'local_error'; action: string; message: string; code?: string }
  | { type: 'dismiss' }
  | { type: 'configure'; trendMinutes: number };

/** Most trend points kept per device, whatever the interval. */
export const MAX_TREND_POINTS = 6000;

/** Most cell markers kept. */
export const MAX_CELLS = 500;

export const SAMPLE_STATES: readonly string[] = [
  'ok',
  'no_torch',
  'cpu_only',
  'not_initialized',
  'no_gpu'
];

export function initialState(trendMinutes = 5): IGpuMemState {
  return {
    process: NO_PROCESS,
    status: { kind: 'no_kernel' },
    kernelId: null,
    source: null,
    version: null,
    revision: null,
    actions: [],
    notice: null,
    lastError: null,
    trendMinutes
  };
}

/** The state with some of its process's fields changed. */
export function withProcess(
  state: IGpuMemState,
  change: Partial<IProcessState>
): IGpuMemState {
  return { ...state, process: { ...state.process, ...change } };
}
