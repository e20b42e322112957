/**
 * The sample subscription of one followed kernel: subscribe while the panel is
 * shown, listen on the kernel's comm (which the kernel owns and never closes),
 * renew the subscription's lease, re-subscribe when the stream goes quiet
 * (the watchdog), and fall back to asking for samples when there is no stream.
 * Timers are lumino `Poll`s. No DOM.
 */
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { Poll } from '@lumino/polling';

import { checkCommData, COMM_TARGET, IStreamState } from '../protocol';
import { every, IClientContext, stopPoll } from './context';
import { RequestOutcome } from './request';
import { IKernelLike } from './types';

type Comm = Kernel.IComm;

/** What the stream timers depend on. */
function timerKey(stream: IStreamState | undefined): string {
  return stream ? `${stream.heartbeat_ms}/${stream.lease_s}` : '';
}

export class SampleSubscription {
  constructor(
    private readonly _ctx: IClientContext,
    /** A measured cell ended (its marker came on the comm). */
    private readonly _onCell: () => void
  ) {}

  /** The kernel has this client's subscription. */
  get subscribed(): boolean {
    return this._subscribed;
  }

  /**
   * Subscribe this client, or renew its lease (`renew`: keep the timers
   * unless the kernel changed the lease or the heartbeat).
   */
  async subscribe(renew = false): Promise<void> {
    const ctx = this._ctx;
    const kernel = ctx.kernel;
    if (!kernel) {
      return;
    }
    const canStream =
      kernel.handleComms &&
      (ctx.state.actions.length === 0 ||
        ctx.state.actions.includes('subscribe'));
    if (!canStream) {
      this.startPolling();
      return;
    }
    const generation = ctx.generation;
    this._subscribing += 1;
    let outcome: RequestOutcome;
    try {
      outcome = await ctx.request(
        'subscribe',
        { interval_ms: ctx.refreshRateMs(), client: kernel.clientId },
        ctx.requestTimeoutMs
      );
    } finally {
      this._subscribing -= 1;
    }
    if (generation !== ctx.generation || kernel !== ctx.kernel) {
      return;
    }
    if (!ctx.visible) {
      // Hidden while the first subscribe travelled: nothing unsubscribed it.
      if (
        !this._subscribed &&
        outcome.kind === 'reply' &&
        outcome.reply.status === 'ok'
      ) {
        void ctx.request(
          'unsubscribe',
          { client: kernel.clientId },
          ctx.requestTimeoutMs
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
      this.startPolling();
      return;
    }
    ctx.dispatch({ type: 'reply', action: 'subscribe', reply: outcome.reply });
    if (outcome.reply.status !== 'ok') {
      this._subscribed = false;
      this.startPolling();
      return;
    }
    const stream = (outcome.reply.result as { stream?: IStreamState }).stream;
    this._subscribed = true;
    if (stream && stream.comm_id && !this.adoptComm(kernel, stream.comm_id)) {
      this.startPolling();
      return;
    }
    if (
      this._polling === null &&
      renew &&
      this._timersFor === timerKey(stream)
    ) {
      return;
    }
    this._startStreamTimers(stream);
  }

  /**
   * The panel hid or the kernel changed: stop the timers, and tell the kernel
   * this client is gone (it stops streaming once no client is left).
   */
  stop(): void {
    const ctx = this._ctx;
    this.clearTimers();
    const kernel = ctx.kernel;
    if (this._subscribed && kernel && !kernel.isDisposed) {
      this._subscribed = false;
      const generation = ctx.generation;
      const args = { client: kernel.clientId };
      void ctx
        .request('unsubscribe', args, ctx.requestTimeoutMs)
        .then(outcome => {
          if (outcome.kind === 'reply' && generation === ctx.generation) {
            ctx.dispatch({
              type: 'reply',
              action: 'unsubscribe',
              reply: outcome.reply
            });
          }
        });
    }
    this._subscribed = false;
  }

  /** The client goes: no timer is left behind. */
  dispose(): void {
    this.clearTimers();
    stopPoll(this._readopt);
  }

  /** The process went away (a restart, death): its comm and stream too. */
  reset(): void {
    this.clearTimers();
    this._subscribed = false;
    this.dropComm();
  }

  /**
   * Make sure messages of the kernel's comm reach us. The kernel sends no
   * `comm_open` (a JupyterLab connection without a registered target would
   * answer it with `comm_close`): create the client side with the id that
   * `hello` and `subscribe` return. False when that failed.
   */
  adoptComm(kernel: IKernelLike, commId: string): boolean {
    if (
      this._comm &&
      this._comm.commId === commId &&
      !this._comm.isDisposed &&
      kernel.hasComm(commId)
    ) {
      return true;
    }
    // First: disposing our old comm unregisters its id from the connection.
    this.dropComm();
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

  /**
   * Forget our side of the comm without closing it: the kernel owns it and
   * streams on it for its whole life.
   */
  dropComm(): void {
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
   * Ask for samples every refresh interval (no stream to listen to), not
   * while the browser tab is hidden, less often while the kernel does not
   * answer.
   */
  startPolling(): void {
    const ctx = this._ctx;
    this.clearTimers();
    const generation = ctx.generation;
    // A request in flight delays the next tick: never two at once.
    this._polling = every(
      'poll',
      ctx.refreshRateMs(),
      async () => {
        if (generation !== ctx.generation || !ctx.visible) {
          return;
        }
        const outcome = await ctx.request('sample', {}, ctx.requestTimeoutMs);
        if (generation !== ctx.generation) {
          return;
        }
        if (outcome.kind === 'reply') {
          ctx.dispatch({
            type: 'reply',
            action: 'sample',
            reply: outcome.reply
          });
        } else if (outcome.kind !== 'stale') {
          // No answer: the poll backs off until one comes.
          throw new Error(`sample: ${outcome.kind}`);
        }
      },
      { standby: 'when-hidden', backoff: true }
    );
  }

  clearTimers(): void {
    for (const poll of [this._watchdog, this._polling, this._renewal]) {
      stopPoll(poll);
    }
    this._watchdog = null;
    this._polling = null;
    this._renewal = null;
    this._timersFor = null;
  }

  private _attachComm(comm: Comm): void {
    const ctx = this._ctx;
    this._comm = comm;
    const generation = ctx.generation;
    comm.onMsg = (msg: KernelMessage.ICommMsgMsg) => {
      if (
        generation !== ctx.generation ||
        comm !== this._comm ||
        !ctx.processes.accept(msg)
      ) {
        return;
      }
      const data = checkCommData(msg.content.data);
      if (data) {
        this._lastCommAt = Date.now();
        ctx.dispatch({ type: 'comm', commId: comm.commId, data });
        if (data.type === 'cell') {
          this._onCell();
        }
      }
    };
    comm.onClose = () => {
      // The kernel never closes its comm: a comm_close is not the end of the
      // stream. Listen on with a new comm of the same id, once JupyterLab has
      // disposed of this one (which unregisters the id).
      if (comm !== this._comm || generation !== ctx.generation) {
        return;
      }
      this._comm = null;
      this._readoptId = comm.commId;
      this._readoptGeneration = generation;
      void this._readopt.refresh();
    };
  }

  /** The tick of `_readopt`: listen again on the comm that closed. */
  private _readoptTick(): void {
    const ctx = this._ctx;
    const kernel = ctx.kernel;
    const commId = this._readoptId;
    this._readoptId = null;
    if (
      commId === null ||
      this._readoptGeneration !== ctx.generation ||
      this._comm !== null ||
      !kernel ||
      kernel.isDisposed
    ) {
      return;
    }
    if (!this.adoptComm(kernel, commId)) {
      this.startPolling();
    }
  }

  /**
   * Re-subscribe when the stream went quiet for several heartbeats (a dropped
   * comm, a kernel that lost its thread), and renew the lease of this
   * client's subscription every third of it while the panel is shown.
   */
  private _startStreamTimers(stream: IStreamState | undefined): void {
    const ctx = this._ctx;
    this.clearTimers();
    this._timersFor = timerKey(stream);
    const heartbeat =
      stream && stream.heartbeat_ms > 0 ? stream.heartbeat_ms : 2000;
    const period = Math.max(3 * heartbeat, 3 * ctx.refreshRateMs(), 3000);
    this._lastCommAt = Date.now();
    // Checked twice per period, so a stream is re-subscribed at most 1.5
    // periods after its last message.
    // Neither stands by while the browser tab is hidden: an expired lease
    // would stop the stream the panel shows when the tab comes back.
    this._watchdog = every(
      'watchdog',
      period / 2,
      () => {
        if (!ctx.visible || !ctx.kernel) {
          return;
        }
        if (Date.now() - this._lastCommAt > period || this._comm === null) {
          this._lastCommAt = Date.now();
          void this.subscribe();
        }
      },
      { standby: 'never', backoff: false }
    );
    const lease = stream && stream.lease_s > 0 ? stream.lease_s : 0;
    if (lease > 0) {
      this._renewal = every(
        'renewal',
        Math.max(1000, (lease * 1000) / 3),
        () => {
          if (
            ctx.visible &&
            ctx.kernel &&
            this._subscribed &&
            this._subscribing === 0
          ) {
            void this.subscribe(true);
          }
        },
        { standby: 'never', backoff: false }
      );
    }
  }

  private _comm: Comm | null = null;
  private _subscribed = false;
  private _lastCommAt = 0;
  private _watchdog: Poll | null = null;
  private _polling: Poll | null = null;
  /** Renews the lease of the subscription. */
  private _renewal: Poll | null = null;
  /** The stream figures the watchdog and the renewal were set up for. */
  private _timersFor: string | null = null;
  /** Subscribe requests awaiting their reply. */
  private _subscribing = 0;
  /**
   * Listens again on a comm the kernel closed, once JupyterLab has disposed
   * of the closed one (which unregisters its id): it ticks only when
   * `onClose` refreshes it, one timer turn later.
   */
  private readonly _readopt = new Poll({
    name: 'jupyter-gpumem:comm-readopt',
    auto: false,
    factory: async () => this._readoptTick(),
    frequency: { interval: Poll.NEVER, backoff: false },
    standby: 'never'
  });
  /** The id of the comm to listen on again, and its generation. */
  private _readoptId: string | null = null;
  private _readoptGeneration: number | null = null;
}
