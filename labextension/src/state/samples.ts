/**
 * The samples slice: the newest sample, the trend per device, the stream's
 * comm and its order, heartbeats and the measured cells' markers. Pure.
 */
import { CommData, ISample, IStreamState } from '../protocol';
import { acceptSeq, IBounds, pushBounded, trimBounded } from './ring';
import {
  IGpuMemState,
  ITrendPoint,
  MAX_CELLS,
  MAX_TREND_POINTS,
  NO_PROCESS,
  PanelStatus,
  SAMPLE_STATES,
  withProcess
} from './types';

export function bounds(state: IGpuMemState): IBounds {
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
 * A kernel that went away takes its process-wide figures with it (its
 * workers too).
 */
export function forgetProcess(state: IGpuMemState): IGpuMemState {
  return { ...state, process: NO_PROCESS };
}

/**
 * Apply a sample unless a newer one was applied already (replies and pushed
 * samples travel on different channels and can cross).
 */
export function applySample(
  state: IGpuMemState,
  sample: ISample
): IGpuMemState {
  const process = state.process;
  if (process.sample !== null && sample.time < process.sample.time) {
    return state;
  }
  const limits = bounds(state);
  const history: Record<number, readonly ITrendPoint[]> = {
    ...process.history
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
    ...withProcess(state, {
      sample,
      history,
      lastHeard: Math.max(process.lastHeard ?? -Infinity, sample.time)
    }),
    status: statusOf(sample)
  };
}

/**
 * Follow the comm id a reply names (stable for the kernel process).
 */
export function withCommId(
  state: IGpuMemState,
  stream: IStreamState | null
): IGpuMemState {
  if (stream && stream.comm_id && stream.comm_id !== state.process.commId) {
    return withProcess(state, { commId: stream.comm_id, lastSeq: null });
  }
  return state;
}

export function applyComm(
  state: IGpuMemState,
  commId: string,
  data: CommData
): IGpuMemState {
  let next = state;
  if (commId !== state.process.commId) {
    // Another comm (another kernel process) numbers its messages afresh.
    next = withProcess(next, { commId, lastSeq: null });
  }
  if (data.type === 'open') {
    // The stream (re)started. Its seq goes on from the kernel's last message.
    if (typeof data.seq !== 'number') {
      return withProcess(next, { stream: data.stream });
    }
    if (!acceptSeq(next.process.lastSeq, data.seq)) {
      return state;
    }
    return withProcess(next, { stream: data.stream, lastSeq: data.seq });
  }
  if (!acceptSeq(next.process.lastSeq, data.seq)) {
    return state;
  }
  next = withProcess(next, { lastSeq: data.seq });
  switch (data.type) {
    case 'sample':
      return applySample(next, data.sample);
    case 'heartbeat':
      return withProcess(next, {
        busy: data.busy === true,
        lastHeard: Math.max(next.process.lastHeard ?? -Infinity, data.time)
      });
    case 'cell': {
      const postmortems = data.cell.postmortems;
      const forecasts = Array.isArray(data.cell.forecasts)
        ? data.cell.forecasts
        : [];
      // A cell that touched no device changes no forecast; any other replaces it.
      const touched =
        forecasts.length > 0 ||
        (Array.isArray(data.cell.devices) && data.cell.devices.length > 0);
      return withProcess(next, {
        cells: pushBounded(next.process.cells, data.cell, {
          maxAgeS: bounds(next).maxAgeS,
          maxLength: MAX_CELLS
        }),
        // The kernel keeps these until a cell runs out of memory again.
        ...(Array.isArray(postmortems) && postmortems.length > 0
          ? { postmortems }
          : {}),
        ...(touched
          ? { forecast: { cell: data.cell.execution_count, forecasts } }
          : {})
      });
    }
    default:
      return next;
  }
}

/** The trend length changed: trim what is kept to it. */
export function withTrendMinutes(
  state: IGpuMemState,
  trendMinutes: number
): IGpuMemState {
  if (trendMinutes === state.trendMinutes) {
    return state;
  }
  const next = { ...state, trendMinutes };
  const limits = bounds(next);
  const process = state.process;
  const now = process.lastHeard ?? undefined;
  const history: Record<number, readonly ITrendPoint[]> = {};
  for (const key of Object.keys(process.history)) {
    const index = Number(key);
    history[index] = trimBounded(process.history[index], limits, now);
  }
  return withProcess(next, {
    history,
    cells: trimBounded(process.cells, { ...limits, maxLength: MAX_CELLS }, now)
  });
}
