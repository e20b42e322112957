/**
 * The readings a tab asks for when shown: `who` (Who holds it: the kernel
 * reads its namespace on the shell thread, between cells) and the reading
 * views (Segments, History: answered also while a cell runs). Each is read
 * when its tab shows an out-of-date reading, again after each measured cell,
 * and, for `who` after a `busy` reply, once the cell ends or a few times
 * shortly after. No DOM.
 */
import { Poll } from '@lumino/polling';

import { IGpuMemState, READING_VIEWS, ReadingView } from '../state';
import { IClientContext } from './context';
import { RequestOutcome } from './request';

/** Rows per `who` report (the kernel sums the rest into its last rows). */
export const WHO_ROWS = 10;

/** What a reading view asks for. */
export const READING_ARGS: Record<ReadingView, Record<string, unknown>> = {
  // The map draws at most this many segments; the kernel says how many more.
  segments: { max_segments: 200 },
  history: { n: 500 }
};

/**
 * What a reading view asks for now: the Segments tab adds the worker process
 * its chooser shows (the kernel asks that worker for its own map).
 */
export function readingArgs(
  view: ReadingView,
  state: IGpuMemState
): Record<string, unknown> {
  const source = state.process.segmentsSource;
  if (view !== 'segments' || source === null) {
    return READING_ARGS[view];
  }
  return {
    ...READING_ARGS[view],
    pid: source.pid,
    ...(source.rank === null ? {} : { rank: source.rank })
  };
}

/**
 * After a `busy` reply while the panel has not seen the cell (its busy status
 * still on the way, or a cell too short to see): ask again after each of these
 * delays in turn (ms), while the replies stay `busy`. The end of a cell the
 * panel sees asks again anyway.
 */
export const WHO_BUSY_DELAYS_MS: readonly number[] = [1000, 2000, 4000];

export class OnDemandReadings {
  constructor(
    private readonly _ctx: IClientContext,
    /** Time to wait for `who` (the kernel waits up to 10.5 s for its shell). */
    private readonly _whoTimeoutMs: number
  ) {}

  dispose(): void {
    // Stopped first: a disposed Poll leaves its pending timer to run empty.
    this._clearWhoRetry();
    this._whoRetry.dispose();
  }

  /** The Who tab is shown or not. */
  setWhoShown(shown: boolean): void {
    if (shown === this._whoShown) {
      return;
    }
    this._whoShown = shown;
    if (shown) {
      this.maybeFetchWho();
    } else {
      this._clearWhoRetry();
    }
  }

  /**
   * Read who holds the memory now (the Refresh button): sent also while a
   * cell runs, when the kernel answers `busy` and the tab reads again once the
   * cell ends.
   */
  async fetchWho(): Promise<void> {
    if (this._whoInFlight !== this._ctx.generation) {
      this._whoBusyRetries = 0;
    }
    await this._fetchWho();
  }

  /** A reading view's tab (Segments, History) is shown or not. */
  setReadingShown(view: ReadingView, shown: boolean): void {
    if (shown === this._readingShown.has(view)) {
      return;
    }
    if (shown) {
      this._readingShown.add(view);
      this.maybeFetchReadings();
    } else {
      this._readingShown.delete(view);
    }
  }

  /** Read a view now (its Refresh button). */
  async fetchReading(view: ReadingView): Promise<void> {
    this._readingDue.add(view);
    await this._fetchReading(view);
  }

  /** A cell ended: every reading may be out of date. */
  cellEnded(): void {
    for (const view of READING_VIEWS) {
      this._readingDue.add(view);
    }
    this.maybeFetchWho();
  }

  /**
   * What `who` shows changed (a measured cell's marker, tracking switched, a
   * traceback released): read it again once the kernel is idle.
   */
  whoChanged(): void {
    this._whoDue = true;
    this.maybeFetchWho();
  }

  /** The panel hid: cells may run unseen meanwhile, read again when shown. */
  hidden(): void {
    this._whoDue = true;
    for (const view of READING_VIEWS) {
      this._readingDue.add(view);
    }
    this._clearWhoRetry();
  }

  /** Another kernel or process: nothing read carries over. */
  reset(): void {
    for (const view of READING_VIEWS) {
      this._readingDue.add(view);
    }
    this._readingInFlight.clear();
    this._clearWhoRetry();
    this._whoDue = true;
    this._whoInFlight = null;
    this._whoBusyRetries = 0;
  }

  /** Read each shown view whose reading is out of date, if it can be. */
  maybeFetchReadings(): void {
    const ctx = this._ctx;
    const kind = ctx.state.status.kind;
    if (
      this._readingShown.size === 0 ||
      !ctx.visible ||
      ctx.kernel === null ||
      (kind !== 'ok' && kind !== 'not_initialized')
    ) {
      return;
    }
    for (const view of this._readingShown) {
      if (
        this._readingDue.has(view) &&
        this._readingInFlight.get(view) !== ctx.generation &&
        ctx.state.actions.includes(view)
      ) {
        void this._fetchReading(view);
      }
    }
  }

  /**
   * Read `who` if the tab wants it, its reading is out of date and no cell
   * runs (it would answer `busy`).
   */
  maybeFetchWho(): void {
    if (
      this._whoDue &&
      !this._ctx.state.process.busy &&
      this._whoInFlight !== this._ctx.generation &&
      this._whoWanted()
    ) {
      void this._fetchWho();
    }
  }

  /**
   * Whether the Who tab wants readings now: shown, in the visible panel, of
   * a kernel that answers and knows `who`.
   */
  private _whoWanted(): boolean {
    const ctx = this._ctx;
    const kind = ctx.state.status.kind;
    return (
      this._whoShown &&
      ctx.visible &&
      ctx.kernel !== null &&
      (kind === 'ok' || kind === 'not_initialized') &&
      ctx.state.actions.includes('who')
    );
  }

  private async _fetchReading(view: ReadingView): Promise<void> {
    const ctx = this._ctx;
    const kernel = ctx.kernel;
    const generation = ctx.generation;
    if (
      !kernel ||
      ctx.isDisposed ||
      this._readingInFlight.get(view) === generation
    ) {
      return;
    }
    if (!ctx.state.actions.includes(view)) {
      ctx.dispatch({ type: 'reading_sent', view });
      ctx.dispatch({
        type: 'reading_failed',
        view,
        code: 'unknown_action',
        message: ''
      });
      return;
    }
    this._readingDue.delete(view);
    this._readingInFlight.set(view, generation);
    ctx.dispatch({ type: 'reading_sent', view });
    let outcome: RequestOutcome;
    try {
      outcome = await ctx.request(
        view,
        readingArgs(view, ctx.state),
        ctx.requestTimeoutMs
      );
    } finally {
      if (this._readingInFlight.get(view) === generation) {
        this._readingInFlight.delete(view);
      }
    }
    if (generation !== ctx.generation || kernel !== ctx.kernel) {
      return;
    }

    switch (outcome.kind) {
      case 'reply':
        ctx.dispatch({
          type: 'reply',
          action: view,
          reply: outcome.reply,
          at: Date.now()
        });
        break;
      case 'timeout':
      case 'stale':
        ctx.dispatch({
          type: 'reading_failed',
          view,
          code: 'timeout',
          message: ''
        });
        break;
      case 'error':
        ctx.dispatch({
          type: 'reading_failed',
          view,
          code: 'local',
          message: outcome.message
        });
        break;
    }
    if (this._readingDue.has(view)) {
      // Asked again while this one travelled (a cell ended, another process's
      // map was chosen: its reply was dropped): read again.
      this.maybeFetchReadings();
    }
  }

  private async _fetchWho(): Promise<void> {
    const ctx = this._ctx;
    const kernel = ctx.kernel;
    const generation = ctx.generation;
    if (
      !kernel ||
      ctx.isDisposed ||
      !ctx.state.actions.includes('who') ||
      this._whoInFlight === generation
    ) {
      return;
    }
    this._clearWhoRetry();
    this._whoDue = false;
    this._whoInFlight = generation;
    ctx.dispatch({ type: 'who_sent' });
    let outcome: RequestOutcome;
    try {
      outcome = await ctx.request('who', { n: WHO_ROWS }, this._whoTimeoutMs);
    } finally {
      if (this._whoInFlight === generation) {
        this._whoInFlight = null;
      }
    }
    if (generation !== ctx.generation || kernel !== ctx.kernel) {
      // Another kernel, or the process restarted: its reading is stale.
      return;
    }
    switch (outcome.kind) {
      case 'reply': {
        const reply = outcome.reply;
        ctx.dispatch({ type: 'reply', action: 'who', reply, at: Date.now() });
        if (reply.status === 'error' && reply.error.code === 'busy') {
          // Not now: when the cell ends.
          this._whoBusy();
          return;
        }
        this._whoBusyRetries = 0;
        break;
      }
      case 'timeout':
      case 'stale':
        ctx.dispatch({ type: 'who_failed', code: 'timeout', message: '' });
        break;
      case 'error':
        ctx.dispatch({
          type: 'who_failed',
          code: 'local',
          message: outcome.message
        });
        break;
    }
    // A cell ended or tracking switched while it travelled: read again.
    this.maybeFetchWho();
  }

  /**
   * The kernel answered `busy`: read again when the cell ends. The end of a
   * cell the panel has seen start does that (`cellEnded`); otherwise look
   * again shortly, a few times (`WHO_BUSY_DELAYS_MS`: 1, 2, 4 s).
   */
  private _whoBusy(): void {
    const ctx = this._ctx;
    this._whoDue = true;
    if (
      ctx.state.process.busy ||
      this._whoBusyRetries >= WHO_BUSY_DELAYS_MS.length ||
      this._whoRetry.isDisposed
    ) {
      return;
    }
    const delay = WHO_BUSY_DELAYS_MS[this._whoBusyRetries];
    this._whoBusyRetries += 1;
    this._whoRetryGeneration = ctx.generation;
    void this._whoRetry.schedule({ interval: delay, phase: 'started' });
  }

  private _clearWhoRetry(): void {
    void this._whoRetry.stop();
  }

  /** The look after a busy reply, when `_whoBusy` schedules it. */
  private _whoRetryTick(): void {
    if (this._whoRetryGeneration === this._ctx.generation) {
      this.maybeFetchWho();
    }
  }

  /** A Who tab is shown. */
  private _whoShown = false;
  /** The `who` reading shown may be out of date: read when wanted. */
  private _whoDue = true;
  /** Generation whose `who` awaits its reply. */
  private _whoInFlight: number | null = null;
  /**
   * Looks again after a `busy` the panel saw no cell for: a poll that ticks
   * only when `_whoBusy` schedules it (its own frequency never comes round);
   * stopped when the tab is left, the panel hides or the kernel changes.
   */
  private readonly _whoRetry = new Poll({
    name: 'jupyter-gpumem:who-busy',
    auto: false,
    factory: async () => this._whoRetryTick(),
    frequency: { interval: Poll.NEVER, backoff: false },
    // The panel stops it when hidden (`hidden`), as `every` does.
    standby: 'never'
  });
  private _whoRetryGeneration: number | null = null;
  private _whoBusyRetries = 0;
  /** Reading views whose tab is shown. */
  private _readingShown = new Set<ReadingView>();
  /** Reading views whose data may be out of date. */
  private _readingDue = new Set<ReadingView>(READING_VIEWS);
  /** The generation each reading in flight was sent for. */
  private _readingInFlight = new Map<ReadingView, number>();
}
