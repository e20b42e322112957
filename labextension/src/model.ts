/**
 * The panel's model: follows one kernel, talks the gpumem protocol with it and
 * keeps the state the view draws. No DOM.
 */
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { Units } from './format';
import { CapValue } from './cap';
import {
  Action,
  checkCommData,
  checkReply,
  COMM_TARGET,
  IHelloResult,
  IStreamState,
  makeRequest,
  Reply,
  REQUEST_MSG_TYPE
} from './protocol';
import { GpuMemEvent, IGpuMemState, initialState, reduce } from './reducer';

/**
 * The part of a kernel connection the model uses (a subset of
 * `Kernel.IKernelConnection`, so that tests can pass a fake).
 */
export type IKernelLike = Pick<
  Kernel.IKernelConnection,
  | 'id'
  | 'clientId'
  | 'status'
  | 'statusChanged'
  | 'iopubMessage'
  | 'anyMessage'
  | 'disposed'
  | 'isDisposed'
  | 'handleComms'
  | 'sendControlMessage'
  | 'createComm'
  | 'hasComm'
  | 'requestExecute'
>;

/**
 * The part of a session context the model uses.
 */
export interface ISessionLike {
  readonly session: { readonly kernel: IKernelLike | null } | null;
  readonly kernelChanged: ISignal<any, any>;
  readonly isDisposed: boolean;
}

/**
 * What the model follows: a notebook's or console's session and its name.
 */
export interface IKernelSource {
  label: string;
  sessionContext: ISessionLike;
}

export interface ISettings {
  /** Interval of pushed samples, ms (100..10000). */
  refreshRateMs: number;
  units: Units;
  /** Length of the trend line. */
  trendMinutes: number;
}

export const DEFAULT_SETTINGS: ISettings = {
  refreshRateMs: 500,
  units: 'binary',
  trendMinutes: 5
};

/** Code run by Attach. */
export const ATTACH_CODE = '%load_ext jupyter_gpumem';

type RequestOutcome =
  | { kind: 'reply'; reply: Reply }
  | { kind: 'timeout' }
  /** Answered by the process a restart replaced. */
  | { kind: 'stale' }
  | { kind: 'error'; message: string };

type Comm = Kernel.IComm;

/** What the stream timers depend on. */
function timerKey(stream: IStreamState | undefined): string {
  return stream ? `${stream.heartbeat_ms}/${stream.lease_s}` : '';
}

function clampInterval(ms: number): number {
  if (!Number.isFinite(ms)) {
    return DEFAULT_SETTINGS.refreshRateMs;
  }
  return Math.min(10000, Math.max(100, Math.round(ms)));
}

export class GpuMemModel implements IDisposable {
  constructor(options: GpuMemModel.IOptions = {}) {
    this._helloTimeoutMs = options.helloTimeoutMs ?? 1500;
    this._requestTimeoutMs = options.requestTimeoutMs ?? 10000;
    this._settings = { ...DEFAULT_SETTINGS, ...options.settings };
    this._settings.refreshRateMs = clampInterval(this._settings.refreshRateMs);
    this._state = initialState(this._settings.trendMinutes);
  }

  /** Emitted with the new state after every change. */
  get stateChanged(): ISignal<this, IGpuMemState> {
    return this._stateChanged;
  }

  get state(): IGpuMemState {
    return this._state;
  }

  get settings(): Readonly<ISettings> {
    return this._settings;
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
      this._dispatch({
        type: 'configure',
        trendMinutes: this._settings.trendMinutes
      });
    }
    if (
      this._settings.refreshRateMs !== before.refreshRateMs &&
      this._subscribed
    ) {
      void this._subscribe();
    }
    if (this._settings.units !== before.units) {
      this._stateChanged.emit(this._state);
    }
  }

  /**
   * Follow another notebook or console (null: none).
   */
  setSource(source: IKernelSource | null): void {
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
      this._stop();
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
   * Release cached blocks of every device to the driver. No `gc.collect()`
   * first: with torch loaded it takes ~100 ms and would stall a running cell.
   */
  emptyCache(): Promise<void> {
    return this._action('empty_cache', {});
  }

  /** Switch PyTorch's caching allocator; the reply tells the real state. */
  setCaching(enabled: boolean): Promise<void> {
    return this._action('set_caching', { enabled });
  }

  /** Set the peak counters to the current figures. */
  resetPeak(device?: number): Promise<void> {
    return this._action('reset_peak', device === undefined ? {} : { device });
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
    return this._action('set_limit', args);
  }

  /** Report an error found before anything was sent (bad input). */
  reportError(action: string, message: string): void {
    this._dispatch({ type: 'local_error', action, message });
  }

  /** Clear the status line. */
  dismiss(): void {
    this._dispatch({ type: 'dismiss' });
  }

  // ---------------------------------------------------------------------------

  private _dispatch(event: GpuMemEvent): void {
    const next = reduce(this._state, event);
    if (next !== this._state) {
      this._state = next;
      this._stateChanged.emit(next);
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
    this._processSession = null;
    this._staleSessions.clear();
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
        if (this._processSession !== null) {
          this._staleSessions.add(this._processSession);
          this._processSession = null;
        }
        this._clearTimers();
        this._subscribed = false;
        this._dropComm();
        this._generation += 1;
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
      // Learn which process is talking (see _fromCurrentProcess).
      this._fromCurrentProcess(args.msg);
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
    if (!this._fromCurrentProcess(msg)) {
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
      const spoken =
        this._processSession !== null || this._staleSessions.size === 0;
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
        { interval_ms: this._settings.refreshRateMs, client: kernel.clientId },
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
        !this._fromCurrentProcess(msg)
      ) {
        return;
      }
      const data = checkCommData(msg.content.data);
      if (data) {
        this._lastCommAt = Date.now();
        this._dispatch({ type: 'comm', commId: comm.commId, data });
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
    const period = Math.max(
      3 * heartbeat,
      3 * this._settings.refreshRateMs,
      3000
    );
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
    }, this._settings.refreshRateMs);
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

  private async _action(
    action: Action,
    args: Record<string, unknown>
  ): Promise<void> {
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

  /**
   * Whether a message comes from the kernel process now running, not from one
   * a restart replaced (JupyterLab accepts those for a moment). Remembers the
   * process's session id from its messages.
   */
  private _fromCurrentProcess(msg: KernelMessage.IMessage): boolean {
    const session = msg.header.session;
    if (!session) {
      return true;
    }
    if (this._staleSessions.has(session)) {
      return false;
    }
    this._processSession = session;
    return true;
  }

  /**
   * Send one `gpumem_request` on the control channel and wait for its reply.
   */
  private _request(
    action: Action,
    args: Record<string, unknown>,
    timeoutMs: number
  ): Promise<RequestOutcome> {
    const kernel = this._kernel;
    if (!kernel || kernel.isDisposed) {
      return Promise.resolve({ kind: 'error', message: 'no kernel' });
    }
    // The message type union of @jupyterlab/services is closed: a custom
    // control message needs casts.
    const msg = KernelMessage.createMessage<any>({
      msgType: REQUEST_MSG_TYPE as any,
      channel: 'control',
      session: kernel.clientId,
      content: makeRequest(action, args)
    } as any);
    let future: Kernel.IControlFuture<any, any>;
    try {
      future = kernel.sendControlMessage(msg, true, true);
    } catch (reason) {
      return Promise.resolve({ kind: 'error', message: String(reason) });
    }
    return new Promise<RequestOutcome>(resolve => {
      let settled = false;
      const settle = (outcome: RequestOutcome) => {
        if (!settled) {
          settled = true;
          clearTimeout(timer);
          resolve(outcome);
        }
      };
      const onReply = (reply: KernelMessage.IMessage) => {
        if (!this._fromCurrentProcess(reply)) {
          settle({ kind: 'stale' });
          return;
        }
        const checked = checkReply(reply.content);
        settle(
          typeof checked === 'string'
            ? { kind: 'error', message: checked }
            : { kind: 'reply', reply: checked }
        );
      };
      const timer = setTimeout(() => {
        settle({ kind: 'timeout' });
        if (!future.isDisposed) {
          future.dispose();
        }
      }, timeoutMs);
      // onReply comes before the kernel's idle status, which `done` waits for.
      future.onReply = onReply;
      future.done.then(
        reply => {
          if (reply) {
            onReply(reply);
          }
        },
        reason => settle({ kind: 'error', message: String(reason) })
      );
    });
  }

  private _state: IGpuMemState;
  private _settings: ISettings;
  private _stateChanged = new Signal<this, IGpuMemState>(this);
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
  /** Session id of the kernel process that answered last. */
  private _processSession: string | null = null;
  /** Session ids of processes a restart replaced. */
  private _staleSessions = new Set<string>();
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
  private _isDisposed = false;
}

export namespace GpuMemModel {
  export interface IOptions {
    settings?: Partial<ISettings>;
    /** No `hello` reply within this time means "extension not loaded". */
    helloTimeoutMs?: number;
    /** Time to wait for the reply of an action. */
    requestTimeoutMs?: number;
  }
}

/**
 * A notebook or console panel, as far as following its kernel goes.
 */
export interface IKernelWidget {
  readonly title: {
    readonly label: string;
    readonly changed: ISignal<any, any>;
  };
  readonly sessionContext: ISessionLike;
  readonly isDisposed: boolean;
  readonly disposed: ISignal<any, any>;
}

/**
 * The part of a widget tracker the follower uses.
 */
export interface ITrackerLike {
  readonly currentWidget: IKernelWidget | null;
  readonly currentChanged: ISignal<any, any>;
  has(widget: any): boolean;
}

/**
 * The part of the lab shell the follower uses.
 */
export interface IShellLike {
  readonly currentWidget: unknown;
  readonly currentChanged: ISignal<any, any>;
}

/**
 * Points the model at the active notebook or console. A focused widget without
 * a kernel (an editor, the launcher) keeps the last one followed, so that the
 * panel stays useful next to a file; closing it falls back to the trackers.
 */
export class ActiveKernelFollower implements IDisposable {
  constructor(options: ActiveKernelFollower.IOptions) {
    this._model = options.model;
    this._shell = options.shell ?? null;
    this._trackers = options.trackers.filter(
      (tracker): tracker is ITrackerLike => !!tracker
    );
    if (this._shell) {
      this._shell.currentChanged.connect(this._onChanged, this);
    }
    for (const tracker of this._trackers) {
      tracker.currentChanged.connect(this._onChanged, this);
    }
    this._onChanged();
  }

  get widget(): IKernelWidget | null {
    return this._widget;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this._follow(null);
    Signal.disconnectReceiver(this);
  }

  private _tracked(widget: unknown): IKernelWidget | null {
    for (const tracker of this._trackers) {
      if (widget && tracker.has(widget)) {
        return widget as IKernelWidget;
      }
    }
    return null;
  }

  private _fallback(): IKernelWidget | null {
    for (const tracker of this._trackers) {
      const widget = tracker.currentWidget;
      if (widget && !widget.isDisposed) {
        return widget;
      }
    }
    return null;
  }

  private _onChanged(): void {
    if (this._isDisposed) {
      return;
    }
    const active = this._shell
      ? this._tracked(this._shell.currentWidget)
      : null;
    if (active) {
      this._follow(active);
      return;
    }
    if (this._widget && !this._widget.isDisposed) {
      return;
    }
    this._follow(this._fallback());
  }

  private _follow(widget: IKernelWidget | null): void {
    if (widget === this._widget) {
      return;
    }
    if (this._widget) {
      this._widget.disposed.disconnect(this._onDisposed, this);
      this._widget.title.changed.disconnect(this._onTitle, this);
    }
    this._widget = widget;
    if (widget) {
      widget.disposed.connect(this._onDisposed, this);
      widget.title.changed.connect(this._onTitle, this);
      this._model.setSource({
        label: widget.title.label,
        sessionContext: widget.sessionContext
      });
    } else {
      this._model.setSource(null);
    }
  }

  private _onDisposed(): void {
    this._follow(null);
    this._onChanged();
  }

  private _onTitle(): void {
    if (this._widget) {
      this._model.setSource({
        label: this._widget.title.label,
        sessionContext: this._widget.sessionContext
      });
    }
  }

  private _model: GpuMemModel;
  private _shell: IShellLike | null;
  private _trackers: ITrackerLike[];
  private _widget: IKernelWidget | null = null;
  private _isDisposed = false;
}

export namespace ActiveKernelFollower {
  export interface IOptions {
    model: GpuMemModel;
    shell?: IShellLike | null;
    trackers: (ITrackerLike | null | undefined)[];
  }
}
