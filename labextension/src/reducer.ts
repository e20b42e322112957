/**
 * The panel's state and the pure function that folds protocol messages and
 * kernel events into it. No DOM, no JupyterLab: the model feeds it, tests too.
 */
import {
  Action,
  CommData,
  ICellMarker,
  IEmptyCacheResult,
  IHelloResult,
  IHistoryResult,
  ILimit,
  IPostMortem,
  IReleaseTracebackResult,
  ISample,
  ISegmentsResult,
  ISetCachingResult,
  ISetLimitResult,
  IStreamState,
  ITrackResult,
  ITracking,
  IWhoResult,
  Reply,
  SampleState
} from './protocol';
import { acceptSeq, IBounds, pushBounded, trimBounded } from './ring';

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

const NO_READINGS: IReadings = {
  segments: READING_IDLE,
  history: READING_IDLE
};

export interface IGpuMemState {
  status: PanelStatus;
  /** Id of the followed kernel; replies are only applied for it. */
  kernelId: string | null;
  /** Name of the followed notebook or console. */
  source: string | null;
  /** A cell is executing in the kernel. */
  busy: boolean;
  /** Newest applied sample; cleared when the kernel process goes away. */
  sample: ISample | null;
  /** Version of the kernel-side package, from `hello`. */
  version: string | null;
  /** Actions the kernel side says it supports. */
  actions: readonly string[];
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
  notice: Notice | null;
  lastError: IActionError | null;
  /** Length of the trend history. */
  trendMinutes: number;
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
   * The last out-of-memory post-mortems, from a `who` reply or a cell marker
   * (the kernel keeps those of the last cell that ran out of memory).
   */
  postmortems: readonly IPostMortem[];
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
  | { type: 'reading_sent'; view: ReadingView }
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

const SAMPLE_STATES: readonly string[] = [
  'ok',
  'no_torch',
  'cpu_only',
  'not_initialized',
  'no_gpu'
];

export function initialState(trendMinutes = 5): IGpuMemState {
  return {
    status: { kind: 'no_kernel' },
    kernelId: null,
    source: null,
    busy: false,
    sample: null,
    version: null,
    actions: [],
    stream: null,
    commId: null,
    lastSeq: null,
    lastHeard: null,
    history: {},
    cells: [],
    pending: null,
    notice: null,
    lastError: null,
    trendMinutes,
    who: WHO_IDLE,
    tracking: null,
    trackingWanted: false,
    readings: NO_READINGS,
    postmortems: []
  };
}

/**
 * Read a tracking figure: `{active, wanted}` since revision 3, a boolean
 * before.
 */
export function readTracking(value: unknown): ITracking | null {
  if (typeof value === 'boolean') {
    return { active: value, wanted: value };
  }
  if (typeof value === 'object' && value !== null) {
    const v = value as Partial<ITracking>;
    const active = v.active === true;
    return { active, wanted: active || v.wanted === true };
  }
  return null;
}

function bounds(state: IGpuMemState): IBounds {
  return {
    maxAgeS: Math.max(0, state.trendMinutes) * 60,
    maxLength: MAX_TREND_POINTS
  };
}

function statusOf(sample: ISample): PanelStatus {
  if (SAMPLE_STATES.includes(sample.state)) {
    return { kind: sample.state, sample };
  }
  // A newer kernel side may add states: show what it measured.
  return { kind: sample.devices.length > 0 ? 'ok' : 'no_gpu', sample };
}

/**
 * A kernel that went away takes its process-wide figures with it.
 */
function forgetProcess(state: IGpuMemState): IGpuMemState {
  return {
    ...state,
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
    postmortems: []
  };
}

/**
 * Apply a sample unless a newer one was applied already (replies and pushed
 * samples travel on different channels and can cross).
 */
export function applySample(
  state: IGpuMemState,
  sample: ISample
): IGpuMemState {
  if (state.sample !== null && sample.time < state.sample.time) {
    return state;
  }
  const limits = bounds(state);
  const history: Record<number, readonly ITrendPoint[]> = {
    ...state.history
  };
  for (const device of sample.devices) {
    if (
      device.initialized &&
      typeof device.allocated === 'number' &&
      typeof device.reserved === 'number'
    ) {
      history[device.index] = pushBounded(
        history[device.index] ?? [],
        {
          time: sample.time,
          allocated: device.allocated,
          reserved: device.reserved,
          process:
            typeof device.process_used === 'number' ? device.process_used : null
        },
        limits
      );
    }
  }
  for (const key of Object.keys(history)) {
    const index = Number(key);
    history[index] = trimBounded(history[index], limits, sample.time);
  }
  return {
    ...state,
    sample,
    status: statusOf(sample),
    history,
    lastHeard: Math.max(state.lastHeard ?? -Infinity, sample.time)
  };
}

function isGone(state: IGpuMemState): boolean {
  const kind = state.status.kind;
  return kind === 'no_kernel' || kind === 'restarting' || kind === 'dead';
}

function clearPending(state: IGpuMemState, action: string): UserAction | null {
  return state.pending === action ? null : state.pending;
}

/**
 * Follow the comm id a reply names (stable for the kernel process).
 */
function withCommId(
  state: IGpuMemState,
  stream: IStreamState | null
): IGpuMemState {
  if (stream && stream.comm_id && stream.comm_id !== state.commId) {
    return { ...state, commId: stream.comm_id, lastSeq: null };
  }
  return state;
}

/**
 * Apply the reply to `who`, unless none was asked for (the kernel changed or
 * restarted since: its reading is stale). Not an action of the status line:
 * its outcome shows in the Who tab.
 */
function applyWho(
  state: IGpuMemState,
  reply: Reply,
  at: number | null
): IGpuMemState {
  if (state.who.status !== 'loading') {
    return state;
  }
  if (reply.status === 'error') {
    if (reply.error.code === 'busy') {
      return { ...state, who: { ...state.who, status: 'busy', error: null } };
    }
    return {
      ...state,
      who: {
        ...state.who,
        status: 'error',
        error: {
          action: 'who',
          code: reply.error.code,
          message: reply.error.message
        }
      }
    };
  }
  const result = reply.result as unknown as IWhoResult;
  const data: IWhoResult = {
    devices: Array.isArray(result.devices) ? result.devices : [],
    tracking: result.tracking === true,
    postmortems: Array.isArray(result.postmortems) ? result.postmortems : []
  };
  return {
    ...state,
    who: { status: 'ok', data, error: null, fetchedAt: at },
    tracking: data.tracking,
    postmortems: data.postmortems
  };
}

function whoFailed(
  state: IGpuMemState,
  code: string,
  message: string
): IGpuMemState {
  if (state.who.status !== 'loading') {
    return state;
  }
  return {
    ...state,
    who: {
      ...state.who,
      status: 'error',
      error: { action: 'who', code, message }
    }
  };
}

function isReadingView(action: string): action is ReadingView {
  return (READING_VIEWS as readonly string[]).includes(action);
}

function withReading(
  state: IGpuMemState,
  view: ReadingView,
  reading: IReading<unknown>
): IGpuMemState {
  return {
    ...state,
    readings: { ...state.readings, [view]: reading } as IReadings
  };
}

/**
 * Apply the reply of a reading view, unless none was asked for (the kernel
 * changed or restarted since).
 */
function applyReading(
  state: IGpuMemState,
  view: ReadingView,
  reply: Reply,
  at: number | null
): IGpuMemState {
  const before = state.readings[view];
  if (before.status !== 'loading') {
    return state;
  }
  if (reply.status === 'error') {
    return withReading(state, view, {
      ...before,
      status: 'error',
      error: {
        action: view,
        code: reply.error.code,
        message: reply.error.message
      }
    });
  }
  const result = reply.result as Record<string, unknown>;
  const data =
    view === 'segments'
      ? { devices: Array.isArray(result.devices) ? result.devices : [] }
      : { cells: Array.isArray(result.cells) ? result.cells : [] };
  return withReading(state, view, {
    status: 'ok',
    data,
    error: null,
    fetchedAt: at
  });
}

function readingFailed(
  state: IGpuMemState,
  view: ReadingView,
  code: string,
  message: string
): IGpuMemState {
  const before = state.readings[view];
  if (before.status !== 'loading') {
    return state;
  }
  return withReading(state, view, {
    ...before,
    status: 'error',
    error: { action: view, code, message }
  });
}

function applyReply(
  state: IGpuMemState,
  action: Action,
  reply: Reply,
  args: Record<string, unknown>,
  at: number | null
): IGpuMemState {
  if (action === 'who') {
    return applyWho(state, reply, at);
  }
  if (isReadingView(action)) {
    return applyReading(state, action, reply, at);
  }
  const pending = clearPending(state, action);
  if (reply.status === 'error') {
    if (action === 'hello') {
      return {
        ...state,
        pending,
        status: { kind: 'incompatible', message: reply.error.message }
      };
    }
    return {
      ...state,
      pending,
      notice: null,
      lastError: {
        action,
        code: reply.error.code,
        message: reply.error.message
      }
    };
  }
  const result = reply.result as Record<string, unknown>;
  let next: IGpuMemState = { ...state, pending };
  switch (action) {
    case 'hello': {
      const hello = result as unknown as IHelloResult;
      const stale =
        state.lastError !== null &&
        (state.lastError.action === 'attach' ||
          state.lastError.action === 'hello');
      next = {
        ...next,
        // The kernel answers now: an earlier failure to connect is over.
        lastError: stale ? null : state.lastError,
        version: typeof hello.version === 'string' ? hello.version : null,
        actions: Array.isArray(hello.actions) ? hello.actions : [],
        stream: hello.stream ?? null
      };
      next = withCommId(next, hello.stream ?? null);
      const tracking = readTracking(hello.tracking);
      if (tracking) {
        next = {
          ...next,
          tracking: tracking.active,
          trackingWanted: tracking.wanted
        };
      }
      break;
    }
    case 'subscribe':
    case 'unsubscribe': {
      const stream = (result.stream as IStreamState | undefined) ?? null;
      next = withCommId({ ...next, stream }, stream);
      break;
    }
    case 'empty_cache': {
      const released = (result as unknown as IEmptyCacheResult).released ?? {};
      next = { ...next, notice: { kind: 'released', released } };
      break;
    }
    case 'set_caching': {
      const caching = (result as unknown as ISetCachingResult).caching;
      next = {
        ...next,
        notice: {
          kind: 'caching',
          requested: args.enabled === true,
          caching: caching === true
        }
      };
      break;
    }
    case 'reset_peak':
      next = {
        ...next,
        notice: {
          kind: 'peak_reset',
          device: typeof args.device === 'number' ? args.device : null
        }
      };
      break;
    case 'set_limit':
      next = {
        ...next,
        notice: {
          kind: 'limit',
          device: typeof args.device === 'number' ? args.device : null,
          limit: (result as unknown as ISetLimitResult).limit ?? null
        }
      };
      break;
    case 'track': {
      const track = result as unknown as ITrackResult;
      const read = readTracking(track.tracking);
      const tracking = read !== null && read.active;
      next = {
        ...next,
        tracking,
        trackingWanted: read !== null && read.wanted,
        notice: {
          kind: 'tracking',
          requested: args.enabled === true,
          tracking,
          message: typeof track.message === 'string' ? track.message : ''
        }
      };
      break;
    }
    case 'release_traceback': {
      const released = result as unknown as IReleaseTracebackResult;
      next = {
        ...next,
        notice: {
          kind: 'traceback_released',
          frames: typeof released.frames === 'number' ? released.frames : 0,
          freed: released.freed ?? {}
        }
      };
      break;
    }
    default:
      break;
  }
  if (
    action !== 'hello' &&
    action !== 'subscribe' &&
    action !== 'unsubscribe' &&
    action !== 'sample'
  ) {
    next = { ...next, lastError: null };
  }
  const sample = result.sample as ISample | undefined;
  if (sample && typeof sample === 'object') {
    next = applySample(next, sample);
  }
  return next;
}

function applyComm(
  state: IGpuMemState,
  commId: string,
  data: CommData
): IGpuMemState {
  let next = state;
  if (commId !== state.commId) {
    // Another comm (another kernel process) numbers its messages afresh.
    next = { ...next, commId, lastSeq: null };
  }
  if (data.type === 'open') {
    // The stream (re)started. Its seq goes on from the kernel's last message.
    if (typeof data.seq !== 'number') {
      return { ...next, stream: data.stream };
    }
    if (!acceptSeq(next.lastSeq, data.seq)) {
      return state;
    }
    return { ...next, stream: data.stream, lastSeq: data.seq };
  }
  if (!acceptSeq(next.lastSeq, data.seq)) {
    return state;
  }
  next = { ...next, lastSeq: data.seq };
  switch (data.type) {
    case 'sample':
      return applySample(next, data.sample);
    case 'heartbeat':
      return {
        ...next,
        busy: data.busy === true,
        lastHeard: Math.max(next.lastHeard ?? -Infinity, data.time)
      };
    case 'cell': {
      const postmortems = data.cell.postmortems;
      return {
        ...next,
        cells: pushBounded(next.cells, data.cell, {
          maxAgeS: bounds(next).maxAgeS,
          maxLength: MAX_CELLS
        }),
        // The kernel keeps these until a cell runs out of memory again.
        ...(Array.isArray(postmortems) && postmortems.length > 0
          ? { postmortems }
          : {})
      };
    }
    default:
      return next;
  }
}

/**
 * Fold one event into the state. Returns the same object when nothing changed.
 */
export function reduce(state: IGpuMemState, event: GpuMemEvent): IGpuMemState {
  switch (event.type) {
    case 'follow': {
      const fresh = initialState(state.trendMinutes);
      return {
        ...fresh,
        kernelId: event.kernelId,
        source: event.source,
        status:
          event.kernelId === null ? { kind: 'no_kernel' } : { kind: 'loading' }
      };
    }
    case 'kernel_status':
      switch (event.status) {
        case 'restarting':
        case 'autorestarting':
          return { ...forgetProcess(state), status: { kind: 'restarting' } };
        case 'dead':
          return { ...forgetProcess(state), status: { kind: 'dead' } };
        default:
          return state;
      }
    case 'hello_sent':
      if (event.quiet || state.kernelId === null) {
        return state;
      }
      return { ...state, status: { kind: 'loading' } };
    case 'hello_timeout':
      if (isGone(state)) {
        return state;
      }
      return {
        ...state,
        ...(state.notice && state.notice.kind === 'attached'
          ? {
              notice: null,
              lastError: {
                action: 'attach',
                code: 'no_answer',
                message: ''
              }
            }
          : {}),
        status: { kind: 'not_loaded' },
        sample: null,
        stream: null,
        version: null,
        actions: [],
        who: WHO_IDLE,
        tracking: null,
        trackingWanted: false,
        readings: NO_READINGS,
        postmortems: []
      };
    case 'reply':
      if (state.kernelId === null) {
        return state;
      }
      return applyReply(
        state,
        event.action,
        event.reply,
        event.args ?? {},
        event.at ?? null
      );
    case 'who_sent':
      if (state.kernelId === null || state.who.status === 'loading') {
        return state;
      }
      return {
        ...state,
        who: { ...state.who, status: 'loading', error: null }
      };
    case 'who_failed':
      return whoFailed(state, event.code, event.message);
    case 'reading_sent': {
      const before = state.readings[event.view];
      if (state.kernelId === null || before.status === 'loading') {
        return state;
      }
      return withReading(state, event.view, {
        ...before,
        status: 'loading',
        error: null
      });
    }
    case 'reading_failed':
      return readingFailed(state, event.view, event.code, event.message);
    case 'no_reply':
      if (event.action === 'who') {
        return whoFailed(state, 'timeout', '');
      }
      if (isReadingView(event.action)) {
        return readingFailed(state, event.action, 'timeout', '');
      }
      return {
        ...state,
        pending: clearPending(state, event.action),
        notice: null,
        lastError: {
          action: event.action,
          code: 'timeout',
          message: ''
        }
      };
    case 'comm':
      if (state.kernelId === null || isGone(state)) {
        return state;
      }
      return applyComm(state, event.commId, event.data);
    case 'busy':
      return state.busy === event.busy ? state : { ...state, busy: event.busy };
    case 'pending':
      return {
        ...state,
        pending: event.action,
        lastError: event.action ? null : state.lastError,
        notice: event.action ? null : state.notice
      };
    case 'attach_result':
      if (event.error === null) {
        return {
          ...state,
          pending: clearPending(state, 'attach'),
          notice: { kind: 'attached' },
          lastError: null
        };
      }
      return {
        ...state,
        pending: clearPending(state, 'attach'),
        notice: null,
        lastError: { action: 'attach', code: 'failed', message: event.error }
      };
    case 'local_error':
      return {
        ...state,
        notice: null,
        lastError: {
          action: event.action,
          code: event.code ?? 'local',
          message: event.message
        }
      };
    case 'dismiss':
      return { ...state, notice: null, lastError: null };
    case 'configure': {
      if (event.trendMinutes === state.trendMinutes) {
        return state;
      }
      const next = { ...state, trendMinutes: event.trendMinutes };
      const limits = bounds(next);
      const now = state.lastHeard ?? undefined;
      const history: Record<number, readonly ITrendPoint[]> = {};
      for (const key of Object.keys(state.history)) {
        const index = Number(key);
        history[index] = trimBounded(state.history[index], limits, now);
      }
      return {
        ...next,
        history,
        cells: trimBounded(next.cells, { ...limits, maxLength: MAX_CELLS }, now)
      };
    }
    default:
      return state;
  }
}
