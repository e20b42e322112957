/**
 * The panel's model: the public face of the extension (the `IGpuMemModel`
 * token). It holds the settings, the state store and the protocol client of
 * the followed kernel, and hands the calls of the view and of other extensions
 * to them. No DOM.
 *
 * - kernel/client.ts: talks the gpumem protocol with the kernel
 * - state/store.ts, state/reducer.ts: the state and how events change it
 * - settings.ts: the user's settings and their defaults
 * - kernel/follower.ts (used by index.ts): points the model at the active
 *   notebook or console
 */
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { CapValue } from './present/cap';
import { GpuMemClient } from './kernel/client';
import { IKernelLike, IKernelSource } from './kernel/types';
import type { IServerApi } from './server/serverApi';
import { clampInterval, DEFAULT_SETTINGS, ISettings } from './settings';
import {
  FreeOrigin,
  GpuMemStore,
  IGpuMemState,
  ISegmentsSource,
  ReadingView
} from './state';

/** Scrolls the followed notebook to a cell; whether it found it. */
export type CellScroller = (executionCount: number) => Promise<boolean>;

export class GpuMemModel implements IDisposable {
  constructor(options: GpuMemModel.IOptions = {}) {
    this._server = options.server ?? null;
    this._settings = { ...DEFAULT_SETTINGS, ...options.settings };
    this._settings.refreshRateMs = clampInterval(this._settings.refreshRateMs);
    this._store = new GpuMemStore(this._settings.trendMinutes, state =>
      this._stateChanged.emit(state)
    );
    this._client = new GpuMemClient({
      store: this._store,
      refreshRateMs: () => this._settings.refreshRateMs,
      helloTimeoutMs: options.helloTimeoutMs ?? 1500,
      requestTimeoutMs: options.requestTimeoutMs ?? 10000,
      whoTimeoutMs: options.whoTimeoutMs
    });
  }

  /** Emitted with the new state after every change. */
  get stateChanged(): ISignal<this, IGpuMemState> {
    return this._stateChanged;
  }

  get state(): IGpuMemState {
    return this._store.state;
  }

  get settings(): Readonly<ISettings> {
    return this._settings;
  }

  /**
   * The Jupyter server the panel talks to through REST (the "On this GPU"
   * tab); null when none was given (tests, other front ends).
   */
  get server(): IServerApi | null {
    return this._server;
  }

  get kernel(): IKernelLike | null {
    return this._client.kernel;
  }

  /** Whether the panel is shown: the stream runs only then. */
  get visible(): boolean {
    return this._client.visible;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._client.dispose();
    this._isDisposed = true;
    Signal.clearData(this);
  }

  /**
   * Apply new settings; a changed interval re-subscribes.
   */
  configure(settings: Partial<ISettings>): void {
    const before = this._settings;
    this._settings = { ...before, ...settings };
    this._settings.refreshRateMs = clampInterval(this._settings.refreshRateMs);
    if (this._settings.trendMinutes !== before.trendMinutes) {
      this._store.dispatch({
        type: 'configure',
        trendMinutes: this._settings.trendMinutes
      });
    }
    if (this._settings.refreshRateMs !== before.refreshRateMs) {
      this._client.intervalChanged();
    }
    if (this._settings.barScale !== before.barScale) {
      this._stateChanged.emit(this._store.state);
    }
  }

  /**
   * Follow another notebook or console (null: none).
   */
  setSource(source: IKernelSource | null): void {
    this._client.follow(source);
  }

  /**
   * The panel was shown or hidden.
   */
  setVisible(visible: boolean): void {
    this._client.setVisible(visible);
  }

  /**
   * Read a sample every `ms` while the panel is hidden, for the status bar;
   * null: read nothing while hidden. kernel/glance.ts says what it costs.
   */
  setGlance(ms: number | null): void {
    this._client.setGlance(ms);
  }

  /**
   * Ask the kernel again (after an error, or from a refresh button).
   */
  refresh(): void {
    this._client.refresh();
  }

  /**
   * Load the kernel extension with `%load_ext jupyter_gpumem`, only while the
   * kernel is idle, then greet it again.
   */
  attach(): Promise<void> {
    return this._client.attach();
  }

  /**
   * Release cached blocks of every device to the driver. No `gc.collect()`
   * first: with torch loaded it takes ~100 ms and would stall a running cell.
   */
  emptyCache(): Promise<void> {
    return this._client.perform('empty_cache', {});
  }

  /** Switch PyTorch's caching allocator; the reply tells the real state. */
  setCaching(enabled: boolean): Promise<void> {
    return this._client.perform('set_caching', { enabled });
  }

  /** Set the peak counters to the current figures. */
  resetPeak(device?: number): Promise<void> {
    return this._client.perform(
      'reset_peak',
      device === undefined ? {} : { device }
    );
  }

  /** Cap the memory of a device (or all); null removes the cap. */
  setLimit(device: number | null, cap: CapValue): Promise<void> {
    const args: Record<string, unknown> = {};
    if (device !== null) {
      args.device = device;
    }
    if (cap !== null && 'bytes' in cap) {
      args.bytes = cap.bytes;
    } else if (cap !== null) {
      args.fraction = cap.fraction;
    }
    return this._client.perform('set_limit', args);
  }

  /**
   * The Who tab is shown or hidden: `who` costs the kernel a walk of its
   * namespace, so it is read only while the tab is shown in the visible
   * panel (the view says so when it mounts and unmounts).
   */
  setWhoShown(shown: boolean): void {
    this._client.setWhoShown(shown);
  }

  /**
   * Read who holds the GPU memory now (Refresh). While a cell runs the kernel
   * answers `busy`; the tab reads again once the cell ends.
   */
  who(): Promise<void> {
    return this._client.fetchWho();
  }

  /**
   * The Segments or History tab is shown or hidden: read while shown.
   */
  setReadingShown(view: ReadingView, shown: boolean): void {
    this._client.setReadingShown(view, shown);
  }

  /** Read the segment map or the measured cells now (Refresh). */
  fetchReading(view: ReadingView): Promise<void> {
    return this._client.fetchReading(view);
  }

  /**
   * Show a worker process's own segment map in the Segments tab (null: the
   * kernel's). The kernel asks the worker, which has 2 s to answer.
   */
  setSegmentsSource(source: ISegmentsSource | null): Promise<void> {
    const before = this._client.state.process.segmentsSource;
    this._client.dispatch({ type: 'segments_source', source });
    if (this._client.state.process.segmentsSource === before) {
      return Promise.resolve();
    }
    return this._client.fetchReading('segments');
  }

  /**
   * Scroll the followed notebook to the cell that ran with this execution
   * count (a trend marker or a History row was clicked). Says so in the status
   * line when the notebook has no such cell (any more).
   */
  async scrollToCell(executionCount: number): Promise<void> {
    const scroller = this._cellScroller;
    const found = scroller ? await scroller(executionCount) : false;
    if (!found) {
      this._store.dispatch({
        type: 'local_error',
        action: 'scroll_to_cell',
        code: 'not_found',
        message: String(executionCount)
      });
    }
  }

  /**
   * Who scrolls to a cell: the application sets it (index.ts); returns
   * whether the cell was found.
   */
  setCellScroller(scroller: CellScroller | null): void {
    this._cellScroller = scroller;
  }

  /**
   * Switch allocation-site tracking: blocks allocated from then on carry the
   * line that allocated them (the Who tab's lines).
   */
  setTracking(enabled: boolean): Promise<void> {
    return this._client.perform('track', { enabled });
  }

  /**
   * Drop the frames of the last error's traceback, which keep its tensors
   * alive; then read `who` again.
   */
  releaseTraceback(): Promise<void> {
    return this._client.perform('release_traceback', {});
  }

  /**
   * Preview freeing `names` (`%gpumem free --dry`): what would be let go,
   * what is left as it is, what should come back to the driver. Shown at
   * `origin` (an owner row, a post-mortem's fix).
   */
  previewFree(names: readonly string[], origin: FreeOrigin): Promise<void> {
    return this._client.free(names, true, origin);
  }

  /**
   * Free what the open preview names (`%gpumem free`): everything that keeps
   * their GPU memory alive is let go; then `who` is read again.
   */
  confirmFree(): Promise<void> {
    const free = this._store.state.process.free;
    if (free === null) {
      return Promise.resolve();
    }
    return this._client.free(free.names, false, free.origin);
  }

  /** Ask again what the last Free request asked (after `busy`, a failure). */
  retryFree(): Promise<void> {
    const free = this._store.state.process.free;
    if (free === null) {
      return Promise.resolve();
    }
    return this._client.free(free.names, free.dry, free.origin);
  }

  /** Close the Free's preview or result. */
  closeFree(): void {
    this._store.dispatch({ type: 'free_closed' });
  }

  /** Report an error found before anything was sent (bad input). */
  reportError(action: string, message: string): void {
    this._store.dispatch({ type: 'local_error', action, message });
  }

  /** Clear the status line. */
  dismiss(): void {
    this._store.dispatch({ type: 'dismiss' });
  }

  private _settings: ISettings;
  private _server: IServerApi | null;
  private _stateChanged = new Signal<this, IGpuMemState>(this);
  private _store: GpuMemStore;
  private _client: GpuMemClient;
  private _isDisposed = false;
  private _cellScroller: CellScroller | null = null;
}

export namespace GpuMemModel {
  export interface IOptions {
    settings?: Partial<ISettings>;
    /** No `hello` reply within this time means "extension not loaded". */
    helloTimeoutMs?: number;
    /** Time to wait for the reply of an action. */
    requestTimeoutMs?: number;
    /** Time to wait for `who` (15 s when absent). */
    whoTimeoutMs?: number;
    /** The Jupyter server's REST API, for the "On this GPU" tab. */
    server?: IServerApi;
  }
}
