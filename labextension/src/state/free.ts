/**
 * The Free slice of the Who tab: the preview (`free` with `dry`) of letting go
 * of named objects, then what the free did. One at a time; it belongs to the
 * kernel process (a restart drops it). Pure.
 */
import { IFreeReport, IFreeResult, Reply } from '../protocol';
import { applySample } from './samples';
import { FreeOrigin, IGpuMemState, IFreeState, withProcess } from './types';

/** Whether two origins are the same row or fix. */
export function sameOrigin(a: FreeOrigin, b: FreeOrigin): boolean {
  if (a.kind === 'owner' && b.kind === 'owner') {
    return a.device === b.device && a.key === b.key;
  }
  if (a.kind === 'fix' && b.kind === 'fix') {
    return a.device === b.device && a.index === b.index;
  }
  return false;
}

/** A request of the Free is on its way (it waits for its answer). */
export function freeInFlight(free: IFreeState | null): boolean {
  return (
    free !== null && (free.status === 'previewing' || free.status === 'freeing')
  );
}

function sameNames(a: readonly string[], b: unknown): boolean {
  return (
    Array.isArray(b) && a.length === b.length && a.every((n, i) => n === b[i])
  );
}

/**
 * A `free` request went out: a preview opens the Free at its origin (the
 * one open before is closed); the free keeps the preview it confirms.
 */
export function freeSent(
  state: IGpuMemState,
  names: readonly string[],
  dry: boolean,
  origin: FreeOrigin
): IGpuMemState {
  const before = state.process.free;
  if (state.kernelId === null || freeInFlight(before)) {
    return state;
  }
  const same =
    before !== null &&
    sameOrigin(before.origin, origin) &&
    sameNames(before.names, names);
  return withProcess(state, {
    free: {
      names: [...names],
      origin,
      status: dry ? 'previewing' : 'freeing',
      dry,
      preview: same ? before.preview : null,
      result: null,
      error: null
    }
  });
}

/**
 * Apply the reply to `free`, unless it is not the Free waiting for it (closed
 * meanwhile, another kernel). A real free's sample moves the figures.
 */
export function applyFree(
  state: IGpuMemState,
  reply: Reply,
  args: Record<string, unknown>
): IGpuMemState {
  const free = state.process.free;
  if (
    free === null ||
    !freeInFlight(free) ||
    !sameNames(free.names, args.names) ||
    (args.dry === true) !== free.dry
  ) {
    return state;
  }
  if (reply.status === 'error') {
    const busy = reply.error.code === 'busy';
    return withProcess(state, {
      free: {
        ...free,
        status: busy ? 'busy' : 'error',
        error: {
          action: 'free',
          code: reply.error.code,
          message: reply.error.message
        }
      }
    });
  }
  const result = reply.result as unknown as Partial<IFreeResult>;
  const report = readReport(result.report);
  if (report === null) {
    return freeFailed(state, 'failed', 'the reply has no report');
  }
  let next = withProcess(state, {
    free: free.dry
      ? { ...free, status: 'preview', preview: report, error: null }
      : { ...free, status: 'done', result: report, error: null }
  });
  if (result.sample && typeof result.sample === 'object') {
    next = applySample(next, result.sample);
  }
  return next;
}

/** A `free` request got no protocol reply. */
export function freeFailed(
  state: IGpuMemState,
  code: string,
  message: string
): IGpuMemState {
  const free = state.process.free;
  if (free === null || !freeInFlight(free)) {
    return state;
  }
  return withProcess(state, {
    free: { ...free, status: 'error', error: { action: 'free', code, message } }
  });
}

/** The Free was closed (Cancel, Close). */
export function freeClosed(state: IGpuMemState): IGpuMemState {
  return state.process.free === null
    ? state
    : withProcess(state, { free: null });
}

/** A report safe to read: its lists are lists. */
function readReport(value: unknown): IFreeReport | null {
  if (typeof value !== 'object' || value === null) {
    return null;
  }
  const r = value as Partial<IFreeReport>;
  const list = <T>(x: T[] | undefined): T[] => (Array.isArray(x) ? x : []);
  return {
    names: list(r.names),
    let_go: list(r.let_go),
    kept: list(r.kept),
    devices: list(r.devices),
    done: r.done === true,
    still: list(r.still),
    notes: list(r.notes),
    elapsed_ms: typeof r.elapsed_ms === 'number' ? r.elapsed_ms : 0
  };
}
