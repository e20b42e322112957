/**
 * Replies to `hello`, the subscription and the user's actions: what the
 * kernel offers, tracking, and the notice or error the status line shows.
 * Pure.
 */
import {
  Action,
  IEmptyCacheResult,
  IHelloResult,
  IReleaseTracebackResult,
  ISample,
  ISetCachingResult,
  ISetLimitResult,
  IStreamState,
  ITrackResult,
  ITracking,
  Reply
} from '../protocol';
import { applySample, withCommId } from './samples';
import { applyFree } from './free';
import { applyReading, isReadingView } from './readings';
import { IGpuMemState, UserAction, withProcess } from './types';
import { applyWho } from './who';

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

export function clearPending(
  state: IGpuMemState,
  action: string
): UserAction | null {
  const pending = state.process.pending;
  return pending === action ? null : pending;
}

export function applyReply(
  state: IGpuMemState,
  action: Action,
  reply: Reply,
  args: Record<string, unknown>,
  at: number | null
): IGpuMemState {
  if (action === 'who') {
    return applyWho(state, reply, at);
  }
  if (action === 'free') {
    // Shown in the Who tab where it was asked, not in the status line.
    return applyFree(state, reply, args);
  }
  if (isReadingView(action)) {
    return applyReading(state, action, reply, at);
  }
  const pending = clearPending(state, action);
  if (reply.status === 'error') {
    if (action === 'hello') {
      return {
        ...withProcess(state, { pending }),
        status: { kind: 'incompatible', message: reply.error.message }
      };
    }
    return {
      ...withProcess(state, { pending }),
      notice: null,
      lastError: {
        action,
        code: reply.error.code,
        message: reply.error.message
      }
    };
  }
  const result = reply.result as Record<string, unknown>;
  let next = withProcess(state, { pending });
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
        revision: typeof hello.revision === 'number' ? hello.revision : null,
        actions: Array.isArray(hello.actions) ? hello.actions : [],
        process: { ...next.process, stream: hello.stream ?? null }
      };
      next = withCommId(next, hello.stream ?? null);
      const tracking = readTracking(hello.tracking);
      if (tracking) {
        next = withProcess(next, {
          tracking: tracking.active,
          trackingWanted: tracking.wanted
        });
      }
      break;
    }
    case 'subscribe':
    case 'unsubscribe': {
      const stream = (result.stream as IStreamState | undefined) ?? null;
      next = withCommId(withProcess(next, { stream }), stream);
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
        ...withProcess(next, {
          tracking,
          trackingWanted: read !== null && read.wanted
        }),
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
