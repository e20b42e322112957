/**
 * The protocol client of one kernel: follows the kernel of a notebook's or
 * console's session, and tells the process now running from one a restart
 * replaced. Its collaborators do the rest: the greeting (`greeting.ts`:
 * `hello`, again for a new process), the sample subscription
 * (`subscription.ts`: the comm, the lease, the watchdog, the fallback
 * polling), the readings tabs ask for (`readings.ts`: `who`, segments,
 * history), the user's actions (`actions.ts`: Attach, the buttons) and the
 * status bar's samples while the panel is hidden (`glance.ts`). Everything
 * they learn goes to the store as events. No DOM.
 */
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { Signal } from '@lumino/signaling';

import { Action, IHelloResult } from '../protocol';
import { FreeOrigin, GpuMemEvent, IGpuMemState, ReadingView } from '../state';
import { GpuMemStore } from '../state';
import { ActionSender } from './actions';
import { IClientContext } from './context';
import { GlanceReader } from './glance';
import { Greeter } from './greeting';
import { ProcessTracker } from './process';
import { OnDemandReadings } from './readings';
import { RequestOutcome, sendRequest } from './request';
import { SampleSubscription } from './subscription';
import { IKernelLike, IKernelSource, ISessionLike, kernelOf } from './types';

export class GpuMemClient implements IDisposable, IClientContext {
  constructor(options: GpuMemClient.IOptions) {
    this._store = options.store;
    this.refreshRateMs = options.refreshRateMs;
    this.requestTimeoutMs = options.requestTimeoutMs;
    this._subscription = new SampleSubscription(this, () =>
      // A measured cell ended: read `who` again once the kernel is idle
      // (now, or at the status that ends the cell).
      this._readings.whoChanged()
    );
    this._readings = new OnDemandReadings(this, options.whoTimeoutMs ?? 15000);
    this._greeter = new Greeter(this, options.helloTimeoutMs, {
      starting: () => {
        this._needHello = true;
      },
      greeted: (kernel, result) => this._greeted(kernel, result)
    });
    this._glance = new GlanceReader(this, () => this._start());
    this._actions = new ActionSender(
      this,
      {
        attached: () => this._greeter.hello(false),
        whoChanged: () => this._readings.whoChanged()
      },
      options.whoTimeoutMs ?? 15000
    );
  }

  // -- the context the collaborators share ------------------------------------
  readonly requestTimeoutMs: number;
  readonly refreshRateMs: () => number;
  readonly processes = new ProcessTracker();

  get kernel(): IKernelLike | null {
    return this._kernel;
  }

  get generation(): number {
    return this._generation;
  }

  /** Whether the panel is shown: the stream runs only then. */
  get visible(): boolean {
    return this._visible;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  get state(): IGpuMemState {
    return this._store.state;
  }

  dispatch(event: GpuMemEvent): void {
    const wasBusy = this.state.process.busy;
    this._store.dispatch(event);
    if (wasBusy && !this.state.process.busy) {
      // A cell ended (or the process went away: then nothing is read).
      this._readings.cellEnded();
    }
    // Also once `hello` told the actions, after a restart, when shown.
    this._readings.maybeFetchReadings();
  }

  /**
   * Send one `gpumem_request` to the followed kernel on the control channel
   * and wait for its reply.
   */
  request(
    action: Action,
    args: Record<string, unknown>,
    timeoutMs: number
  ): Promise<RequestOutcome> {
    return sendRequest(this._kernel, action, args, timeoutMs, msg =>
      this.processes.accept(msg)
    );
  }

  // -- what the model asks -----------------------------------------------------
  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._setSession(null, '');
    this._greeter.dispose();
    this._subscription.dispose();
    this._readings.dispose();
    this._glance.dispose();
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
      this._readings.hidden();
      this._subscription.stop();
    }
  }

  /** Read a sample every `ms` while the panel is hidden; null: never. */
  setGlance(ms: number | null): void {
    if (!this._isDisposed) {
      this._glance.setInterval(ms);
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
    if (!this._isDisposed) {
      this._readings.setWhoShown(shown);
    }
  }

  /** Read who holds the memory now (the Refresh button). */
  fetchWho(): Promise<void> {
    return this._readings.fetchWho();
  }

  /**
   * A reading view's tab (Segments, History) is shown or not. It is read when
   * shown with an older reading, and after each cell while shown; the kernel
   * answers these also while a cell runs (no namespace is read).
   */
  setReadingShown(view: ReadingView, shown: boolean): void {
    if (!this._isDisposed) {
      this._readings.setReadingShown(view, shown);
    }
  }

  /** Read a view now (its Refresh button). */
  fetchReading(view: ReadingView): Promise<void> {
    return this._readings.fetchReading(view);
  }

  /**
   * The interval of pushed samples changed: a subscribed stream re-subscribes.
   */
  intervalChanged(): void {
    if (this._subscription.subscribed) {
      void this._subscription.subscribe();
    }
  }

  /**
   * Ask the kernel again (after an error, or from a refresh button).
   */
  refresh(): void {
    if (this._kernel) {
      void this._greeter.hello(false);
    }
  }

  /** Load the kernel extension (Attach), then greet the kernel again. */
  attach(): Promise<void> {
    return this._actions.attach();
  }

  /** Send a user action and apply its reply; one at a time. */
  perform(action: Action, args: Record<string, unknown>): Promise<void> {
    return this._actions.perform(action, args);
  }

  /** Free `names` (with `dry`: the preview only), shown at `origin`. */
  free(
    names: readonly string[],
    dry: boolean,
    origin: FreeOrigin
  ): Promise<void> {
    return this._actions.free(names, dry, origin);
  }

  // -- following the kernel ------------------------------------------------------
  private _dispatchFollow(): void {
    this.dispatch({
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
    this._setKernel(kernelOf(session));
  }

  private _onKernelChanged(): void {
    const kernel = kernelOf(this._session);
    if (kernel !== this._kernel) {
      this._setKernel(kernel);
    }
  }

  private _setKernel(kernel: IKernelLike | null): void {
    this._disconnect();
    this._kernel = kernel;
    this._generation += 1;
    this._readings.reset();
    this.processes.reset();
    this._dispatchFollow();
    this._glance.kernelChanged();
    if (!kernel) {
      return;
    }
    kernel.statusChanged.connect(this._onStatus, this);
    kernel.iopubMessage.connect(this._onIopub, this);
    kernel.anyMessage.connect(this._onAnyMessage, this);
    kernel.disposed.connect(this._onKernelDisposed, this);
    this.dispatch({ type: 'busy', busy: kernel.status === 'busy' });
    if (kernel.status === 'dead') {
      this.dispatch({ type: 'kernel_status', status: 'dead' });
    } else if (
      kernel.status === 'restarting' ||
      kernel.status === 'autorestarting'
    ) {
      this.dispatch({ type: 'kernel_status', status: kernel.status });
      this._needHello = true;
    } else if (this._visible) {
      this._start();
    }
  }

  private _disconnect(): void {
    const kernel = this._kernel;
    this._subscription.stop();
    this._subscription.dropComm();
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
    const dead = this.state.status.kind === 'dead';
    this._setKernel(null);
    if (dead) {
      this.dispatch({ type: 'kernel_status', status: 'dead' });
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
        this.processes.replaced();
        this._subscription.reset();
        this._generation += 1;
        this._readings.reset();
        this._needHello = status !== 'dead';
        this.dispatch({ type: 'kernel_status', status });
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
      this.processes.accept(args.msg);
    }
  }

  private _onIopub(
    kernel: IKernelLike,
    msg: KernelMessage.IIOPubMessage
  ): void {
    if (kernel !== this._kernel) {
      return;
    }
    if (msg.header.msg_type === 'execute_input') {
      this._glance.sawCode((msg.content as { code?: unknown }).code);
    }
    if (msg.header.msg_type !== 'status') {
      return;
    }
    // After a restart JupyterLab still shows statuses of the old process for a
    // moment ("idle" right after "restarting"): only the new one counts.
    if (!this.processes.accept(msg)) {
      return;
    }
    const state = (msg.content as { execution_state?: string }).execution_state;
    if (state === 'idle' && this._needHello && this._visible) {
      this._needHello = false;
      void this._greeter.hello(false);
    }
    // Only cells count as busy: our own control requests also publish
    // busy/idle, which JupyterLab < 4.5 shows as the kernel's status.
    const parent = msg.parent_header as Partial<KernelMessage.IHeader>;
    if (parent.msg_type !== 'execute_request') {
      return;
    }
    if (state === 'busy') {
      this.dispatch({ type: 'busy', busy: true });
    } else if (state === 'idle') {
      this.dispatch({ type: 'busy', busy: false });
      // The user may have run %load_ext themselves.
      if (
        this.state.status.kind === 'not_loaded' &&
        (this._visible || this._glance.takeLoadHint())
      ) {
        void this._greeter.hello(true);
      } else {
        this._greeter.cellEnded();
      }
    }
  }

  private _start(): void {
    if (!this._kernel || this._isDisposed) {
      return;
    }
    const kind = this.state.status.kind;
    if (kind === 'dead') {
      return;
    }
    if (kind === 'restarting' || this._needHello) {
      // Greet the new process only once it has spoken (its first "idle").
      const status = this._kernel.status;
      const spoken = this.processes.hasSpoken;
      if (spoken && (status === 'idle' || status === 'busy')) {
        this._needHello = false;
        void this._greeter.hello(false);
      }
      return;
    }
    void this._greeter.hello(kind === 'ok' || kind === 'not_initialized');
  }

  /** The kernel answered `hello` with `ok`; the subscribe to wait for. */
  private _greeted(
    kernel: IKernelLike,
    result: Partial<IHelloResult>
  ): Promise<void> | null {
    // The Who tab may be waiting for a kernel that knows `who`.
    this._readings.maybeFetchWho();
    // Listen before subscribing: the first messages of the stream may travel
    // faster (IOPub) than the reply to subscribe (control).
    const stream = result.stream;
    if (stream && stream.comm_id && kernel.handleComms) {
      if (!this._subscription.adoptComm(kernel, stream.comm_id)) {
        this._subscription.startPolling();
        return null;
      }
    }
    return this._visible ? this._subscription.subscribe() : null;
  }

  private _store: GpuMemStore;
  private _greeter: Greeter;
  private _subscription: SampleSubscription;
  private _readings: OnDemandReadings;
  private _glance: GlanceReader;
  private _actions: ActionSender;
  private _session: ISessionLike | null = null;
  private _label = '';
  private _kernel: IKernelLike | null = null;
  private _generation = 0;
  private _visible = false;
  private _needHello = false;
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
