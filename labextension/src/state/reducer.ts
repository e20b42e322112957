/**
 * The panel's state: the pure function that folds protocol messages and
 * kernel events into it, over the slices beside it (samples, who, readings,
 * replies). No DOM, no JupyterLab: the model feeds it, tests too.
 */
import { Action } from '../protocol';
import { applyReply, clearPending } from './replies';
import {
  isReadingView,
  readingFailed,
  readingSent,
  segmentsSource
} from './readings';
import { applyComm, forgetProcess, withTrendMinutes } from './samples';
import {
  GpuMemEvent,
  IGpuMemState,
  initialState,
  NO_READINGS,
  WHO_IDLE,
  withProcess
} from './types';
import { freeClosed, freeFailed, freeSent } from './free';
import { whoFailed, whoSent } from './who';

function isGone(state: IGpuMemState): boolean {
  const kind = state.status.kind;
  return kind === 'no_kernel' || kind === 'restarting' || kind === 'dead';
}

/**
 * No answer to `hello` from a running kernel: the extension is not loaded
 * there, so nothing it said holds (an Attach that got no answer failed).
 */
function notLoaded(state: IGpuMemState): IGpuMemState {
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
    version: null,
    revision: null,
    actions: [],
    // The process runs on: its comm, trend, cells, busy and pending stay.
    process: {
      ...state.process,
      sample: null,
      stream: null,
      who: WHO_IDLE,
      tracking: null,
      trackingWanted: false,
      readings: NO_READINGS,
      segmentsSource: null,
      postmortems: [],
      forecast: null,
      free: null
    }
  };
}

/** A request got no protocol reply in time: its view or the status line says so. */
function noReply(state: IGpuMemState, action: Action): IGpuMemState {
  if (action === 'who') {
    return whoFailed(state, 'timeout', '');
  }
  if (action === 'free') {
    return freeFailed(state, 'timeout', '');
  }
  if (isReadingView(action)) {
    return readingFailed(state, action, 'timeout', '');
  }
  return {
    ...withProcess(state, { pending: clearPending(state, action) }),
    notice: null,
    lastError: {
      action,
      code: 'timeout',
      message: ''
    }
  };
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
      return isGone(state) ? state : notLoaded(state);
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
      return whoSent(state);
    case 'who_failed':
      return whoFailed(state, event.code, event.message);
    case 'free_sent':
      return freeSent(state, event.names, event.dry, event.origin);
    case 'free_failed':
      return freeFailed(state, event.code, event.message);
    case 'free_closed':
      return freeClosed(state);
    case 'reading_sent':
      return readingSent(state, event.view);
    case 'segments_source':
      return segmentsSource(state, event.source);
    case 'reading_failed':
      return readingFailed(state, event.view, event.code, event.message);
    case 'no_reply':
      return noReply(state, event.action);
    case 'comm':
      if (state.kernelId === null || isGone(state)) {
        return state;
      }
      return applyComm(state, event.commId, event.data);
    case 'busy':
      return state.process.busy === event.busy
        ? state
        : withProcess(state, { busy: event.busy });
    case 'pending':
      return {
        ...withProcess(state, { pending: event.action }),
        lastError: event.action ? null : state.lastError,
        notice: event.action ? null : state.notice
      };
    case 'attach_result':
      if (event.error === null) {
        return {
          ...withProcess(state, { pending: clearPending(state, 'attach') }),
          notice: { kind: 'attached' },
          lastError: null
        };
      }
      return {
        ...withProcess(state, { pending: clearPending(state, 'attach') }),
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
    case 'configure':
      return withTrendMinutes(state, event.trendMinutes);
    default:
      return state;
  }
}
