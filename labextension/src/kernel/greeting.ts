/**
 * The greeting of the followed kernel: one `hello` per kernel process, whose
 * reply tells the store what the kernel side can do and, when it is `ok`,
 * starts the sample stream. When the process a restart replaced takes the
 * hello (it may still answer for a moment while it shuts down), the new
 * process is greeted again, first `HELLO_RETRY_MS` later, then backing off
 * while the old one keeps answering. A hello that times out after a cell
 * ended (the cell may have loaded the extension) is sent again. No DOM.
 */
import { Poll } from '@lumino/polling';

import { IHelloResult } from '../protocol';
import { IClientContext, stopPoll } from './context';
import { RequestOutcome } from './request';
import { IKernelLike } from './types';

/** The first `hello` again after the old process took one, ms. */
export const HELLO_RETRY_MS = 300;

export class Greeter {
  constructor(
    private readonly _ctx: IClientContext,
    /** No `hello` reply within this time means "extension not loaded". */
    private readonly _timeoutMs: number,
    private readonly _on: {
      /** No reply while the kernel is still starting: greet it once idle. */
      starting: () => void;
      /**
       * The kernel answered `ok`: read what waits for it, start the stream;
       * the hello ends once the returned subscribe (if any) settles.
       */
      greeted: (
        kernel: IKernelLike,
        result: Partial<IHelloResult>
      ) => Promise<void> | null;
    }
  ) {}

  /**
   * Greet the kernel; when the process a restart replaced takes the hello,
   * greet the new one again (`_retry`).
   */
  async hello(quiet: boolean): Promise<void> {
    if ((await this._greet(quiet)) === 'stale') {
      this._retryQuiet = quiet;
      this._retryGeneration = this._ctx.generation;
      void this._retry.schedule({
        interval: HELLO_RETRY_MS,
        phase: 'started'
      });
    }
  }

  /**
   * A cell ended: when a hello of this process waits for its reply, the cell
   * may have loaded the extension after the kernel got it; ask again if it
   * times out.
   */
  cellEnded(): void {
    if (this._generation === this._ctx.generation) {
      this._afterCell = true;
    }
  }

  /** The client goes: no timer is left behind. */
  dispose(): void {
    stopPoll(this._retry);
  }

  /**
   * The tick of `_retry`: greet again while the same kernel process is
   * followed and the panel shown; rejects (and the poll backs off) while the
   * old process keeps answering.
   */
  private async _retryTick(): Promise<void> {
    const tick = this._retry.tick;
    if (
      this._retryGeneration === this._ctx.generation &&
      this._ctx.visible &&
      (await this._greet(this._retryQuiet)) === 'stale'
    ) {
      throw new Error('hello: answered by the replaced process');
    }
    if (this._retry.tick === tick) {
      // Done (unless another hello scheduled it meanwhile).
      void this._retry.stop();
    }
  }

  /** One `hello` and what follows its reply; 'stale': the old process took it. */
  private async _greet(quiet: boolean): Promise<'stale' | void> {
    const ctx = this._ctx;
    const kernel = ctx.kernel;
    const generation = ctx.generation;
    if (!kernel || this._generation === generation) {
      return;
    }
    this._generation = generation;
    this._afterCell = false;
    ctx.dispatch({ type: 'hello_sent', quiet });
    let outcome: RequestOutcome;
    try {
      outcome = await ctx.request('hello', {}, this._timeoutMs);
    } finally {
      if (this._generation === generation) {
        this._generation = null;
      }
    }
    if (generation !== ctx.generation || kernel !== ctx.kernel) {
      return;
    }
    if (outcome.kind === 'stale') {
      return 'stale';
    }
    if (outcome.kind === 'timeout') {
      if (kernel.status === 'idle' || kernel.status === 'busy') {
        ctx.dispatch({ type: 'hello_timeout' });
        if (this._afterCell && ctx.visible) {
          void this.hello(true);
        }
      } else {
        // Still starting: ask again once it is idle.
        this._on.starting();
      }
      return;
    }
    if (outcome.kind === 'error') {
      ctx.dispatch({
        type: 'local_error',
        action: 'hello',
        message: outcome.message
      });
      return;
    }
    ctx.dispatch({ type: 'reply', action: 'hello', reply: outcome.reply });
    if (outcome.reply.status !== 'ok') {
      return;
    }
    const subscribing = this._on.greeted(
      kernel,
      outcome.reply.result as Partial<IHelloResult>
    );
    if (subscribing) {
      await subscribing;
    }
  }

  /** Generation whose hello awaits its reply. */
  private _generation: number | null = null;
  /** A cell ended while a hello was waiting for its reply. */
  private _afterCell = false;
  /**
   * Greets the new process again after the old one took a hello: the first
   * time `HELLO_RETRY_MS` later, then backing off while the old process
   * keeps answering; it ticks only when `hello` schedules it.
   */
  private readonly _retry = new Poll({
    name: 'jupyter-gpumem:hello-retry',
    auto: false,
    factory: () => this._retryTick(),
    frequency: { interval: HELLO_RETRY_MS, backoff: true },
    standby: 'never'
  });
  /** What the hello the retry repeats was: its quietness, its generation. */
  private _retryQuiet = false;
  private _retryGeneration: number | null = null;
}
