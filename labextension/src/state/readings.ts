/**
 * The reading views' slice (Segments, History): each view's last reading
 * and where the next one stands. Pure.
 */
import { Reply } from '../protocol';
import {
  IGpuMemState,
  IReading,
  IReadings,
  ISegmentsSource,
  READING_IDLE,
  READING_VIEWS,
  ReadingView,
  withProcess
} from './types';

export function isReadingView(action: string): action is ReadingView {
  return (READING_VIEWS as readonly string[]).includes(action);
}

function withReading(
  state: IGpuMemState,
  view: ReadingView,
  reading: IReading<unknown>
): IGpuMemState {
  return withProcess(state, {
    readings: { ...state.process.readings, [view]: reading } as IReadings
  });
}

/**
 * Apply the reply of a reading view, unless none was asked for (the kernel
 * changed or restarted since).
 */
export function applyReading(
  state: IGpuMemState,
  view: ReadingView,
  reply: Reply,
  at: number | null
): IGpuMemState {
  const before = state.process.readings[view];
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
  const worker = result.worker;
  const data =
    view === 'segments'
      ? {
          devices: Array.isArray(result.devices) ? result.devices : [],
          ...(typeof worker === 'object' && worker !== null ? { worker } : {})
        }
      : { cells: Array.isArray(result.cells) ? result.cells : [] };
  return withReading(state, view, {
    status: 'ok',
    data,
    error: null,
    fetchedAt: at
  });
}

export function readingFailed(
  state: IGpuMemState,
  view: ReadingView,
  code: string,
  message: string
): IGpuMemState {
  const before = state.process.readings[view];
  if (before.status !== 'loading') {
    return state;
  }
  return withReading(state, view, {
    ...before,
    status: 'error',
    error: { action: view, code, message }
  });
}

/** A reading went out: keep its last data, mark it loading. */
export function readingSent(
  state: IGpuMemState,
  view: ReadingView
): IGpuMemState {
  const before = state.process.readings[view];
  if (state.kernelId === null || before.status === 'loading') {
    return state;
  }
  return withReading(state, view, {
    ...before,
    status: 'loading',
    error: null
  });
}

/**
 * The Segments tab shows another process's map: the last reading (and one on
 * its way, whose reply is then dropped) was of the one before.
 */
export function segmentsSource(
  state: IGpuMemState,
  source: ISegmentsSource | null
): IGpuMemState {
  const before = state.process.segmentsSource;
  if (
    before === source ||
    (before !== null &&
      source !== null &&
      before.pid === source.pid &&
      before.rank === source.rank)
  ) {
    return state;
  }
  return withReading(
    withProcess(state, { segmentsSource: source }),
    'segments',
    READING_IDLE
  );
}
