/**
 * The Who-holds-it slice: the last `who` reading and where the next one
 * stands. Pure.
 */
import { IWhoResult, Reply } from '../protocol';
import { IGpuMemState, withProcess } from './types';

/**
 * Apply the reply to `who`, unless none was asked for (the kernel changed or
 * restarted since: its reading is stale). Not an action of the status line:
 * its outcome shows in the Who tab.
 */
export function applyWho(
  state: IGpuMemState,
  reply: Reply,
  at: number | null
): IGpuMemState {
  const who = state.process.who;
  if (who.status !== 'loading') {
    return state;
  }
  if (reply.status === 'error') {
    if (reply.error.code === 'busy') {
      return withProcess(state, {
        who: { ...who, status: 'busy', error: null }
      });
    }
    return withProcess(state, {
      who: {
        ...who,
        status: 'error',
        error: {
          action: 'who',
          code: reply.error.code,
          message: reply.error.message
        }
      }
    });
  }
  const result = reply.result as unknown as IWhoResult;
  const data: IWhoResult = {
    devices: Array.isArray(result.devices) ? result.devices : [],
    tracking: result.tracking === true,
    postmortems: Array.isArray(result.postmortems) ? result.postmortems : []
  };
  return withProcess(state, {
    who: { status: 'ok', data, error: null, fetchedAt: at },
    tracking: data.tracking,
    postmortems: data.postmortems
  });
}

export function whoFailed(
  state: IGpuMemState,
  code: string,
  message: string
): IGpuMemState {
  const who = state.process.who;
  if (who.status !== 'loading') {
    return state;
  }
  return withProcess(state, {
    who: { ...who, status: 'error', error: { action: 'who', code, message } }
  });
}

/** A `who` request went out: keep the last reading, mark it loading. */
export function whoSent(state: IGpuMemState): IGpuMemState {
  const who = state.process.who;
  if (state.kernelId === null || who.status === 'loading') {
    return state;
  }
  return withProcess(state, {
    who: { ...who, status: 'loading', error: null }
  });
}
