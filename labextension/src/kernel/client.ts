/**
 * The protocol client of one kernel: follows the kernel of a notebook's or
 * console's session, greets it (`hello`), subscribes to its stream on the comm
 * while the panel is shown (with a watchdog and lease renewal), falls back to
 * polling, sends the allocator actions on the control channel, reads `who`
 * for the Who tab (see `setWhoShown`), and tells the process now running from
 * one a restart replaced. Everything it learns goes to the store as events.
 * No DOM.
 */
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { Signal } from '@lumino/signaling';

import {
  Action,
  checkCommData,
  COMM_TARGET,
  IHelloResult,
  IStreamState
} from '../protocol';
import {
  GpuMemEvent,
  IGpuMemState,
  READING_VIEWS,
  ReadingView
} from '../reducer';
import { GpuMemStore } from '../store';
import { ProcessTracker } from './process';
import { RequestOutcome, sendRequest } from './request';
import { IKernelLike, IKernelSource, ISessionLike } from './types';

/** Code run by Attach. */
export const ATTACH_CODE = '%load_ext jupyter_gpumem';

/** Rows per `who` report (the kernel sums the rest into its last rows). */
export const WHO_ROWS = 10;

/** What a reading view asks for. */
export const READING_ARGS: Record<ReadingView, Record<string, unknown>> = {
  // The map draws at most this many segments; the kernel says how many more.
  segments: { max_segments: 200 },
  history: { n: 500 }
};

/**
 * After a `busy` reply while the panel has not seen the cell (its busy status
 * still on the way, or a cell too short to see): ask again this many times, 1,
 * 2, 4 s later. The end of a cell the panel sees asks again anyway.
 */
const WHO_BUSY_RETRIES = 3;

type Comm = Kernel.IComm;

/** What the stream timers depend on. */
function timerKey(stream: IStreamState | undefined): string {
  return stream ? `${stream.heartbeat_ms}/${stream.lease_s}` : '';
}

export class GpuMemClient implements IDisposable {
  constructor(options: GpuMemClient.IOptions) {
    this._store = options.store;
    this._refreshRateMs = options.refreshRateMs;
    this._helloTimeoutMs = options.helloTimeoutMs;
    this._requestTimeoutMs = options.requestTimeoutMs;
    this._whoTimeoutMs = options.whoTimeoutMs ?? 15000;
  }

  get kernel(): IKernelLike | null {
    return this._kernel;
  }

  /** Whether the panel is shown: the stream runs only then. */
  get visible(): boolean {
    return this._visible;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._setSession(null, '');
    this._clearWhoRetry();
    this._isDisposed = true;
    Signal.clearData(this);
  }

  /**
   * Follow another notebook or console (null: none).
   */
  follow(source: IKernelSource | null): void {
    if (source === null) {
      this._setSession(null, '');
      return;
    }
    if (source.sessionContext === this._session) {
      if (source.label !== this._label) {
        this._label = source.label;
        this._dispatchFollow();
      }
      return;
    }
    this._setSession(source.sessionContext, source.label);
  }

  /**
   * The panel was shown or hidden.
   */
  setVisible(visible: boolean): void {
    if (visible === this._visible || this._isDisposed) {
      return;
    }
    this._visible = visible;
    if (visible) {
      this._start();
    } else {
      // Cells may run unseen meanwhile: read `who` again when shown.
      this._whoDue = true;
      for (const view of READING_VIEWS) {
        this._readingDue.add(view);
      }
      this._clearWhoRetry();
      this._stop();
    }
  }

  /**
   * The Who tab is shown or not. `who` reads the kernel's namespace (on its
   * shell thread, between cells): it is read only while the tab is shown and
   * the panel visible, when the tab is shown with an older reading, after each
   * measured cell once the kernel is idle, and again once the cell ends after a
   * `busy` reply.
   */
  setWhoShown(shown: boolean): void {
    if (shown === this._whoShown || this._isDisposed) {
      return;
    }
    this._whoShown = shown;
    if (shown) {
      this._maybeFetchWho();
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
    if (this._whoInFlight !== this._generation) {
      this._whoBusyRetries = 0;
    }
    await this._fetchWho();
  }

  /**
   * A reading view's tab (Segments, History) is shown or not. It is read when
   * shown with an older reading, and after each cell while shown; the kernel
   * answers these also while a cell runs (no namespace is read).
   */
  setReadingShown(view: ReadingView, shown: boolean): void {
    if (this._isDisposed || shown === this._readingShown.has(view)) {
      return;
    }
    if (shown) {
      this._readingShown.add(view);
      this._maybeFetchReadings();
    } else {
      this._readingShown.delete(view);
    }
  }

  /** Read a view now (its Refresh button). */
  async fetchReading(view: ReadingView): Promise<void> {
    this._readingDue.add(view);
    await this._fetchReading(view);
  }

  /**
   * The interval of pushed samples changed: a subscribed stream re-subscribes.
   */
  intervalChanged(): void {
    if (this._subscribed) {
      void this._subscribe();
    }
  }

  /**
   * Ask the kernel again (after an error, or from a refresh button).
   */
  refresh(): void {
    if (this._kernel) {
      void this._hello(false);
    }
  }

  /**
   * Load the kernel extension with `%load_ext jupyter_gpumem`, only while the
   * kernel is idle, then greet it again.
   */
  async attach(): Promise<void> {
    const kernel = this._kernel;
    if (!kernel || this._state.status.kind !== 'not_loaded') {
      return;
    }
    if (kernel.status !== 'idle' || this._state.busy) {
      this._dispatch({
        type: 'local_error',
        action: 'attach',
        code: 'busy',
        message: ''
      });
      return;
    }
    const generation = this._generation;
    this._dispatch({ type: 'pending', action: 'attach' });
    let error: string | null = null;
    try {
      const future = kernel.requestExecute({
        code: ATTACH_CODE,
        silent: true,
        store_history: false,
        allow_stdin: false,
        // A failed attach must not abort cells the user queued meanwhile.
        stop_on_error: false
      });
      const reply = await future.done;
      const content =
        reply.content as KernelMessage.IExecuteReplyMsg['content'];
      if (content.status === 'error') {
        error = `${content.ename}: ${content.evalue}`;
      } else if (content.status !== 'ok') {
        error = `execution ${content.status}`;
      }
    } catch (reason) {
      error = String(reason);
    }
    if (generation !== this._generation) {
      return;
    }
    this._dispatch({ type: 'attach_result', error });
    if (error === null) {
      await this._hello(false);
    }
  }

  /**
   * Send a user action and apply its reply; one at a time.
   */
  async perform(action: Action, args: Record<string, unknown>): Promise<void> {
    const kernel = this._kernel;
    if (!kernel || this._state.pending !== null) {
      return;
    }
    const generation = this._generation;
    this._dispatch({
      type: 'pending',
      action: action as IGpuMemState['pending']
    });
    const outcome = await this._request(action, args, this._requestTimeoutMs);
    if (generation !== this._generation || kernel !== this._kernel) {
      return;
    }
    switch (outcome.kind) {
      case 'reply':
        this._dispatch({ type: 'reply', action, reply: outcome.reply, args });
        if (
          outcome.reply.status === 'ok' &&
          (action === 'track' || action === 'release_traceback')
        ) {
          // Lines appear or go with tracking; a released traceback frees.
          this._whoDue = true;
          this._maybeFetchWho();
        }
        break;
      case 'timeout':
      case 'stale':
        this._dispatch({ type: 'no_reply', action });
        break;
      case 'error':
        this._dispatch({ type: 'pending', action: null });
        this._dispatch({
          type: 'local_error',
          action,
          message: outcome.message
        });
        break;
    }
  }

  // ---------------------------------------------------------------------------

  private get _state(): IGpuMemState {
    return this._store.state;
  }

  private _dispatch(event: GpuMemEvent): void {
    const wasBusy = this._state.busy;
    this._store.dispatch(event);
    if (wasBusy && !this._state.busy) {
      // A cell ended (or the process went away: then nothing is read).
      for (const view of READING_VIEWS) {
        this._readingDue.add(view);
      }
      this._maybeFetchWho();
    }
    if (this._readingShown.size > 0) {
      // Also once `hello` told the actions, after a restart, when shown.
      this._maybeFetchReadings();
    }
  }

  /** Read each shown view whose reading is out of date, if it can be. */
  private _maybeFetchReadings(): void {
    const kind = this._state.status.kind;
    if (
      !this._visible ||
      this._kernel === null ||
      (kind !== 'ok' && kind !== 'not_initialized')
    ) {
      return;
    }
    for (const view of this._readingShown) {
      if (
        this._readingDue.has(view) &&
        this._readingInFlight.get(view) !== this._generation &&
        this._state.actions.includes(view)
      ) {
        void this._fetchReading(view);
      }
    }
  }

  private async _fetchReading(view: ReadingView): Promise<void> {
    const kernel = this._kernel;
    const generation = this._generation;
    if (
      !kernel ||
      this._isDisposed ||
      this._readingInFlight.get(view) === generation
    ) {
      return;
    }
    if (!this._state.actions.includes(view)) {
      this._dispatch({ type: 'reading_sent', view });
      this._dispatch({
        type: 'reading_failed',
        view,
        code: 'unknown_action',
        message: ''
      });
      return;
    }
    this._readingDue.delete(view);
    this._readingInFlight.set(view, generation);
    this._dispatch({ type: 'reading_sent', view });
    let outcome: RequestOutcome;
    try {
      outcome = await this._request(
        view,
        READING_ARGS[view],
        this._requestTimeoutMs
      );
    } finally {
      if (this._readingInFlight.get(view) === generation) {
        this._readingInFlight.delete(view);
      }
    }
    if (generation !== this._generation || kernel !== this._kernel) {
      return;
    }
    switch (outcome.kind) {
      case 'reply':
        this._dispatch({
          type: 'reply',
          action: view,
          reply: outcome.reply,
          at: Date.now()
        });
        break;
      case 'timeout':
      case 'stale':
        this._dispatch({
          type: 'reading_failed',
          view,
          code: 'timeout',
          message: ''
        });
        break;
      case 'error':
        this._dispatch({
          type: 'reading_failed',
          view,
          code: 'local',
          message: outcome.message
        });
        break;
    }
  }

  /**
   * Whether the Who tab wants readings now: shown, in the visible panel, of
   * a kernel that answers and knows `who`.
   */
  private _whoWanted(): boolean {
    const kind = this._state.status.kind;
    return (
      this._whoShown &&
      this._visible &&
      this._kernel !== null &&
      (kind === 'ok' || kind === 'not_initialized') &&
      this._state.actions.includes('who')
    );
  }

  /**
   * Read `who` if the tab wants it, its reading is out of date and no cell
   * runs (it would answer `busy`).
   */
  private _maybeFetchWho(): void {
    if (
      this._whoDue &&
      !this._state.busy &&
      this._whoInFlight !== this._generation &&
      this._whoWanted()
    ) {
      void this._fetchWho();
    }
  }

  private async _fetchWho(): Promise<void> {
    const kernel = this._kernel;
    const generation = this._generation;
    if (
      !kernel ||
      this._isDisposed ||
      !this._state.actions.includes('who') ||
      this._whoInFlight === generation
    ) {
      return;
    }
    this._clearWhoRetry();
    this._whoDue = false;
    this._whoInFlight = generation;
    this._dispatch({ type: 'who_sent' });
    let outcome: RequestOutcome;
    try {
      outcome = await this._request('who', { n: WHO_ROWS }, this._whoTimeoutMs);
    } finally {
      if (this._whoInFlight === generation) {
        this._whoInFlight = null;
      }
    }
    if (generation !== this._generation || kernel !== this._kernel) {
      // Another kernel, or the process restarted: its reading is stale.
      return;
    }
    switch (outcome.kind) {
      case 'reply': {
        const reply = outcome.reply;
        this._dispatch({ type: 'reply', action: 'who', reply, at: Date.now() });
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
        this._dispatch({ type: 'who_failed', code: 'timeout', message: '' });
        break;
      case 'error':
        this._dispatch({
          type: 'who_failed',
          code: 'local',
          message: outcome.message
        });
        break;
    }
    // A cell ended or tracking switched while it travelled: read again.
    this._maybeFetchWho();
  }

  /**
   * The kernel answered `busy`: read again when the cell ends. The end of a
   * cell the panel has seen start does that (`_dispatch`); otherwise look
   * again shortly, a few times.
   */
  private _whoBusy(): void {
    this._whoDue = true;
    if (this._state.busy || this._whoBusyRetries >= WHO_BUSY_RETRIES) {
      return;
    }
    const delay = 1000 * 2 ** this._whoBusyRetries;
    this._whoBusyRetries += 1;
    const generation = this._generation;
    this._clearWhoRetry();
    this._whoRetry = setTimeout(() => {
      this._whoRetry = null;
      if (generation === this._generation) {
        this._maybeFetchWho();
      }
    }, delay);
  }

  private _clearWhoRetry(): void {
    if (this._whoRetry !== null) {
      clearTimeout(this._whoRetry);
      this._whoRetry = null;
    }
  }

  private _dispatchFollow(): void {
    this._dispatch({
      type: 'follow',
      kernelId: this._kernel ? this._kernel.id : null,
      source: this._session ? this._label : null
    });
  }

  private _setSession(session: ISessionLike | null, label: string): void {
    if (this._session) {
      this._session.kernelChanged.disconnect(this._onKernelChanged, this);
    }
    this._session = session;
    this._label = label;
    if (session) {
      session.kernelChanged.connect(this._onKernelChanged, this);
    }
    const kernel =
      session && !session.isDisposed && session.session
        ? session.session.kernel
        : null;
    this._setKernel(kernel);
  }

  private _onKernelChanged(): void {
    const session = this._session;
    const kernel =
      session && !session.isDisposed && session.session
        ? session.session.kernel
        : null;
    if (kernel !== this._kernel) {
      this._setKernel(kernel);
    }
  }

  private _setKernel(kernel: IKernelLike | null): void {
    this._disconnect();
    this._kernel = kernel;
    this._generation += 1;
    this._whoReset();
    this._processes.reset();
    this._dispatchFollow();
    if (!kernel) {
      return;
    }
    kernel.statusChanged.connect(this._onStatus, this);
    kernel.iopubMessage.connect(this._onIopub, this);
    kernel.anyMessage.connect(this._onAnyMessage, this);
    kernel.disposed.connect(this._onKernelDisposed, this);
    this._dispatch({ type: 'busy', busy: kernel.status === 'busy' });
    if (kernel.status === 'dead') {
      this._dispatch({ type: 'kernel_status', status: 'dead' });
    } else if (
      kernel.status === 'restarting' ||
      kernel.status === 'autorestarting'
    ) {
      this._dispatch({ type: 'kernel_status', status: kernel.status });
      this._needHello = true;
    } else if (this._visible) {
      this._start();
    }
  }

  private _disconnect(): void {
    const kernel = this._kernel;
    this._stop();
    this._dropComm();
    this._needHello = false;
    if (!kernel) {
      return;
    }
    kernel.statusChanged.disconnect(this._onStatus, this);
    kernel.iopubMessage.disconnect(this._onIopub, this);
    kernel.anyMessage.disconnect(this._onAnyMessage, this);
    kernel.disposed.disconnect(this._onKernelDisposed, this);
  }

  /** Another kernel or process: nothing of `who` carries over. */
  private _whoReset(): void {
    for (const view of READING_VIEWS) {
      this._readingDue.add(view);
    }
    this._readingInFlight.clear();
    this._clearWhoRetry();
    this._whoDue = true;
    this._whoInFlight = null;
    this._whoBusyRetries = 0;
  }

  private _onKernelDisposed(): void {
    // JupyterLab disposes a connection whose kernel died: keep saying so.
    const dead = this._state.status.kind === 'dead';
    this._setKernel(null);
    if (dead) {
      this._dispatch({ type: 'kernel_status', status: 'dead' });
    }
  }

  private _onStatus(kernel: IKernelLike, status: Kernel.Status): void {
    if (kernel !== this._kernel) {
      return;
    }
    switch (status) {
      case 'restarting':
      case 'autorestarting':
      case 'dead':
        // The process is gone: so are its comm and its stream. It may still
        // answer for a moment while it shuts down: its messages are stale.
        this._processes.replaced();
        this._clearTimers();
        this._subscribed = false;
        this._dropComm();
        this._generation += 1;
        this._whoReset();
        this._needHello = status !== 'dead';
        this._dispatch({ type: 'kernel_status', status });
        break;
      default:
        break;
    }
  }

  private _onAnyMessage(
    kernel: IKernelLike,
    args: Kernel.IAnyMessageArgs
  ): void {
    if (kernel === this._kernel && args.direction === 'recv') {
      // Learn which process is talking (see ProcessTracker.accept).
      this._processes.accept(args.msg);
    }
  }

  private _onIopub(
    kernel: IKernelLike,
    msg: KernelMessage.IIOPubMessage
  ): void {
    if (kernel !== this._kernel || msg.header.msg_type !== 'status') {
      return;
    }
    // After a restart JupyterLab still shows statuses of the old process for a
    // moment ("idle" right after "restarting"): only the new one counts.
    if (!this._processes.accept(msg)) {
      return;
    }
    const state = (msg.content as { execution_state?: string }).execution_state;
    if (state === 'idle' && this._needHello && this._visible) {
      this._needHello = false;
      void this._hello(false);
    }
    // Only cells count as busy: our own control requests also publish
    // busy/idle, which JupyterLab < 4.5 shows as the kernel's status.
    const parent = msg.parent_header as Partial<KernelMessage.IHeader>;
    if (parent.msg_type !== 'execute_request') {
      return;
    }
    if (state === 'busy') {
      this._dispatch({ type: 'busy', busy: true });
    } else if (state === 'idle') {
      this._dispatch({ type: 'busy', busy: false });
      // The user may have run %load_ext themselves.
      if (this._state.status.kind === 'not_loaded' && this._visible) {
        void this._hello(true);
      } else if (this._helloGeneration === this._generation) {
        // A cell ended while a hello waits: it may have loaded the extension
        // after the kernel got that hello; ask again if it times out.
        this._helloAfterCell = true;
      }
    }
  }

  private _start(): void {
    if (!this._kernel || this._isDisposed) {
      return;
    }
    const kind = this._state.status.kind;
    if (kind === 'dead') {
      return;
    }
    if (kind === 'restarting' || this._needHello) {
      // Greet the new process only once it has spoken (its first "idle").
      const status = this._kernel.status;
      const spoken = this._processes.hasSpoken;
      if (spoken && (status === 'idle' || status === 'busy')) {
        this._needHello = false;
        void this._hello(false);
      }
      return;
    }
    void this._hello(kind === 'ok' || kind === 'not_initialized');
  }

  private _stop(): void {
    this._clearTimers();
    if (this._subscribed && this._kernel && !this._kernel.isDisposed) {
      this._subscribed = false;
      const generation = this._generation;
      // The kernel stops streaming once no client is left.
      const args = { client: this._kernel.clientId };
      void this._request('unsubscribe', args, this._requestTimeoutMs).then(
        outcome => {
          if (outcome.kind === 'reply' && generation === this._generation) {
            this._dispatch({
              type: 'reply',
              action: 'unsubscribe',
              reply: outcome.reply
            });
          }
        }
      );
    }
    this._subscribed = false;
  }

  private async _hello(quiet: boolean): Promise<void> {
    const kernel = this._kernel;
    const generation = this._generation;
    if (!kernel || this._helloGeneration === generation) {
      return;
    }
    this._helloGeneration = generation;
    this._helloAfterCell = false;
    this._dispatch({ type: 'hello_sent', quiet });
    let outcome: RequestOutcome;
    try {
      outcome = await this._request('hello', {}, this._helloTimeoutMs);
    } finally {
      if (this._helloGeneration === generation) {
        this._helloGeneration = null;
      }
    }
    if (generation !== this._generation || kernel !== this._kernel) {
      return;
    }
    if (outcome.kind === 'stale') {
      // The old process took our hello: ask the new one.
      setTimeout(() => {
        if (generation === this._generation && this._visible) {
          void this._hello(quiet);
        }
      }, 300);
      return;
    }
    if (outcome.kind === 'timeout') {
      if (kernel.status === 'idle' || kernel.status === 'busy') {
        this._dispatch({ type: 'hello_timeout' });
        if (this._helloAfterCell && this._visible) {
          void this._hello(true);
        }
      } else {
        // Still starting: ask again once it is idle.
        this._needHello = true;
      }
      return;
    }
    if (outcome.kind === 'error') {
      this._dispatch({
        type: 'local_error',
        action: 'hello',
        message: outcome.message
      });
      return;
    }
    this._dispatch({ type: 'reply', action: 'hello', reply: outcome.reply });
    if (outcome.reply.status !== 'ok') {
      return;
    }
    // The Who tab may be waiting for a kernel that knows `who`.
    this._maybeFetchWho();
    // Listen before subscribing: the first messages of the stream may travel
    // faster (IOPub) than the reply to subscribe (control).
    const stream = (outcome.reply.result as Partial<IHelloResult>).stream;
    if (stream && stream.comm_id && kernel.handleComms) {
      if (!this._adoptComm(kernel, stream.comm_id)) {
        this._startPolling();
        return;
      }
    }
    if (this._visible) {
      await this._subscribe();
    }
  }

  /**
   * Subscribe this client, or renew its lease (`renew`: keep the timers
   * unless the kernel changed the lease or the heartbeat).
   */
  private async _subscribe(renew = false): Promise<void> {
    const kernel = this._kernel;
    if (!kernel) {
      return;
    }
    const canStream =
      kernel.handleComms &&
      (this._state.actions.length === 0 ||
        this._state.actions.includes('subscribe'));
    if (!canStream) {
      this._startPolling();
      return;
    }
    const generation = this._generation;
    this._subscribing += 1;
    let outcome: RequestOutcome;
    try {
      outcome = await this._request(
        'subscribe',
        { interval_ms: this._refreshRateMs(), client: kernel.clientId },
        this._requestTimeoutMs
      );
    } finally {
      this._subscribing -= 1;
    }
    if (generation !== this._generation || kernel !== this._kernel) {
      return;
    }
    if (!this._visible) {
      // Hidden while the first subscribe travelled: nothing unsubscribed it.
      if (
        !this._subscribed &&
        outcome.kind === 'reply' &&
        outcome.reply.status === 'ok'
      ) {
        void this._request(
          'unsubscribe',
          { client: kernel.clientId },
          this._requestTimeoutMs
        );
      }
      return;
    }
    if (outcome.kind !== 'reply') {
      if (renew && this._subscribed) {
        // The watchdog and the next renewal try again.
        return;
      }
      // No stream: fall back to asking for samples.
      this._startPolling();
      return;
    }
    this._dispatch({
      type: 'reply',
      action: 'subscribe',
      reply: outcome.reply
    });
    if (outcome.reply.status !== 'ok') {
      this._subscribed = false;
      this._startPolling();
      return;
    }
    const stream = (outcome.reply.result as { stream?: IStreamState }).stream;
    this._subscribed = true;
    if (stream && stream.comm_id && !this._adoptComm(kernel, stream.comm_id)) {
      this._startPolling();
      return;
    }
    if (this._poll === null && renew && this._timersFor === timerKey(stream)) {
      return;
    }
    this._startStreamTimers(stream);
  }

  /**
   * Make sure messages of the kernel's comm reach us. The kernel sends no
   * `comm_open` (a JupyterLab connection without a registered target would
   * answer it with `comm_close`): create the client side with the id that
   * `hello` and `subscribe` return. False when that failed.
   */
  private _adoptComm(kernel: IKernelLike, commId: string): boolean {
    if (
      this._comm &&
      this._comm.commId === commId &&
      !this._comm.isDisposed &&
      kernel.hasComm(commId)
    ) {
      return true;
    }
    // First: disposing our old comm unregisters its id from the connection.
    this._dropComm();
    if (kernel.hasComm(commId)) {
      // Another part of this page made a comm with this id: not ours to take.
      console.warn(`jupyter-gpumem: comm ${commId} is taken`);
      return false;
    }
    try {
      this._attachComm(kernel.createComm(COMM_TARGET, commId));
      return true;
    } catch (reason) {
      console.warn('jupyter-gpumem: cannot create the comm', reason);
      return false;
    }
  }

  private _attachComm(comm: Comm): void {
    this._comm = comm;
    const generation = this._generation;
    comm.onMsg = (msg: KernelMessage.ICommMsgMsg) => {
      if (
        generation !== this._generation ||
        comm !== this._comm ||
        !this._processes.accept(msg)
      ) {
        return;
      }
      const data = checkCommData(msg.content.data);
      if (data) {
        this._lastCommAt = Date.now();
        this._dispatch({ type: 'comm', commId: comm.commId, data });
        if (data.type === 'cell') {
          // A measured cell ended: read `who` again once the kernel is idle
          // (now, or at the status that ends the cell).
          this._whoDue = true;
          this._maybeFetchWho();
        }
      }
    };
    comm.onClose = () => {
      // The kernel never closes its comm: a comm_close is not the end of the
      // stream. Listen on with a new comm of the same id, once JupyterLab has
      // disposed of this one (which unregisters the id).
      if (comm !== this._comm || generation !== this._generation) {
        return;
      }
      this._comm = null;
      setTimeout(() => {
        const kernel = this._kernel;
        if (
          generation !== this._generation ||
          this._comm !== null ||
          !kernel ||
          kernel.isDisposed
        ) {
          return;
        }
        if (!this._adoptComm(kernel, comm.commId)) {
          this._startPolling();
        }
      }, 0);
    };
  }

  /**
   * Forget our side of the comm without closing it: the kernel owns it and
   * streams on it for its whole life.
   */
  private _dropComm(): void {
    const comm = this._comm;
    this._comm = null;
    if (comm) {
      comm.onMsg = () => undefined;
      comm.onClose = () => undefined;
      if (!comm.isDisposed) {
        comm.dispose();
      }
    }
  }

  /**
   * Re-subscribe when the stream went quiet for several heartbeats (a dropped
   * comm, a kernel that lost its thread), and renew the lease of this
   * client's subscription every third of it while the panel is shown.
   */
  private _startStreamTimers(stream: IStreamState | undefined): void {
    this._clearTimers();
    this._timersFor = timerKey(stream);
    const heartbeat =
      stream && stream.heartbeat_ms > 0 ? stream.heartbeat_ms : 2000;
    const period = Math.max(3 * heartbeat, 3 * this._refreshRateMs(), 3000);
    this._lastCommAt = Date.now();
    // Checked twice per period, so a stream is re-subscribed at most 1.5
    // periods after its last message.
    this._watchdog = setInterval(() => {
      if (!this._visible || !this._kernel) {
        return;
      }
      if (Date.now() - this._lastCommAt > period || this._comm === null) {
        this._lastCommAt = Date.now();
        void this._subscribe();
      }
    }, period / 2);
    const lease = stream && stream.lease_s > 0 ? stream.lease_s : 0;
    if (lease > 0) {
      this._renewal = setInterval(
        () => {
          if (
            this._visible &&
            this._kernel &&
            this._subscribed &&
            this._subscribing === 0
          ) {
            void this._subscribe(true);
          }
        },
        Math.max(1000, (lease * 1000) / 3)
      );
    }
  }

  private _startPolling(): void {
    this._clearTimers();
    const generation = this._generation;
    this._poll = setInterval(() => {
      if (
        generation !== this._generation ||
        !this._visible ||
        this._pollInFlight
      ) {
        return;
      }
      this._pollInFlight = true;
      void this._request('sample', {}, this._requestTimeoutMs).then(outcome => {
        this._pollInFlight = false;
        if (generation === this._generation && outcome.kind === 'reply') {
          this._dispatch({
            type: 'reply',
            action: 'sample',
            reply: outcome.reply
          });
        }
      });
    }, this._refreshRateMs());
  }

  private _clearTimers(): void {
    if (this._watchdog !== null) {
      clearInterval(this._watchdog);
      this._watchdog = null;
    }
    if (this._poll !== null) {
      clearInterval(this._poll);
      this._poll = null;
    }
    if (this._renewal !== null) {
      clearInterval(this._renewal);
      this._renewal = null;
    }
    this._timersFor = null;
  }

  /**
   * Send one `gpumem_request` to the followed kernel on the control channel
   * and wait for its reply.
   */
  private _request(
    action: Action,
    args: Record<string, unknown>,
    timeoutMs: number
  ): Promise<RequestOutcome> {
    return sendRequest(this._kernel, action, args, timeoutMs, msg =>
      this._processes.accept(msg)
    );
  }

  private _store: GpuMemStore;
  private _refreshRateMs: () => number;
  private _session: ISessionLike | null = null;
  private _label = '';
  private _kernel: IKernelLike | null = null;
  private _comm: Comm | null = null;
  private _generation = 0;
  private _visible = false;
  private _subscribed = false;
  private _needHello = false;
  /** Generation whose hello awaits its reply. */
  private _helloGeneration: number | null = null;
  private _pollInFlight = false;
  private _lastCommAt = 0;
  /** Which kernel process is talking; which ones a restart replaced. */
  private _processes = new ProcessTracker();
  private _watchdog: ReturnType<typeof setInterval> | null = null;
  private _poll: ReturnType<typeof setInterval> | null = null;
  /** Renews the lease of the subscription. */
  private _renewal: ReturnType<typeof setInterval> | null = null;
  /** The stream figures the watchdog and the renewal were set up for. */
  private _timersFor: string | null = null;
  /** Subscribe requests awaiting their reply. */
  private _subscribing = 0;
  private _helloTimeoutMs: number;
  private _requestTimeoutMs: number;
  private _whoTimeoutMs: number;
  /** A Who tab is shown. */
  private _whoShown = false;
  /** The `who` reading shown may be out of date: read when wanted. */
  private _whoDue = true;
  /** Generation whose `who` awaits its reply. */
  private _whoInFlight: number | null = null;
  /** Looks again after a `busy` the panel saw no cell for. */
  private _whoRetry: ReturnType<typeof setTimeout> | null = null;
  private _whoBusyRetries = 0;
  /** Reading views whose tab is shown. */
  private _readingShown = new Set<ReadingView>();
  /** Reading views whose data may be out of date. */
  private _readingDue = new Set<ReadingView>(READING_VIEWS);
  /** The generation each reading in flight was sent for. */
  private _readingInFlight = new Map<ReadingView, number>();
  /** A cell ended while a hello was waiting for its reply. */
  private _helloAfterCell = false;
  private _isDisposed = false;
}

export namespace GpuMemClient {
  export interface IOptions {
    /** Where the events go, and the state the client consults. */
    store: GpuMemStore;
    /** The interval of pushed samples now set, ms. */
    refreshRateMs: () => number;
    /** No `hello` reply within this time means "extension not loaded". */
    helloTimeoutMs: number;
    /** Time to wait for the reply of an action. */
    requestTimeoutMs: number;
    /**
     * Time to wait for `who` (the kernel waits up to 10.5 s for its shell
     * thread); 15 s when absent.
     */
    whoTimeoutMs?: number;
  }
}
