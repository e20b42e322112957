/**
 * What the user asks of the followed kernel: load the extension (Attach), the
 * allocator actions of the panel's buttons, one at a time, and the Who tab's
 * Free (its preview, then the free). No DOM.
 */
import { KernelMessage } from '@jupyterlab/services';

import { Action } from '../protocol';
import { FreeOrigin, freeInFlight, UserAction } from '../state';
import { IClientContext } from './context';

/** Code run by Attach. */
export const ATTACH_CODE = '%load_ext jupyter_gpumem';

export class ActionSender {
  constructor(
    private readonly _ctx: IClientContext,
    private readonly _on: {
      /** The extension loaded: greet the kernel again. */
      attached: () => Promise<void>;
      /** An action changed what `who` shows (tracking, a released traceback). */
      whoChanged: () => void;
    },
    /**
     * Time to wait for `free`: it runs on the kernel's shell thread, as `who`
     * does (the kernel waits up to 10.5 s for it).
     */
    private readonly _freeTimeoutMs: number
  ) {}

  /**
   * Load the kernel extension with `%load_ext jupyter_gpumem`, only while the
   * kernel is idle, then greet it again.
   */
  async attach(): Promise<void> {
    const ctx = this._ctx;
    const kernel = ctx.kernel;
    if (!kernel || ctx.state.status.kind !== 'not_loaded') {
      return;
    }
    if (kernel.status !== 'idle' || ctx.state.process.busy) {
      ctx.dispatch({
        type: 'local_error',
        action: 'attach',
        code: 'busy',
        message: ''
      });
      return;
    }
    const generation = ctx.generation;
    ctx.dispatch({ type: 'pending', action: 'attach' });
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
    if (generation !== ctx.generation) {
      return;
    }
    ctx.dispatch({ type: 'attach_result', error });
    if (error === null) {
      await this._on.attached();
    }
  }

  /**
   * Send a user action and apply its reply; one at a time.
   */
  async perform(action: Action, args: Record<string, unknown>): Promise<void> {
    const ctx = this._ctx;
    const kernel = ctx.kernel;
    if (!kernel || ctx.state.process.pending !== null) {
      return;
    }
    const generation = ctx.generation;
    ctx.dispatch({
      type: 'pending',
      action: action as UserAction
    });
    const outcome = await ctx.request(action, args, ctx.requestTimeoutMs);
    if (generation !== ctx.generation || kernel !== ctx.kernel) {
      return;
    }
    switch (outcome.kind) {
      case 'reply':
        ctx.dispatch({ type: 'reply', action, reply: outcome.reply, args });
        if (
          outcome.reply.status === 'ok' &&
          (action === 'track' || action === 'release_traceback')
        ) {
          // Lines appear or go with tracking; a released traceback frees.
          this._on.whoChanged();
        }
        break;
      case 'timeout':
      case 'stale':
        ctx.dispatch({ type: 'no_reply', action });
        break;
      case 'error':
        ctx.dispatch({ type: 'pending', action: null });
        ctx.dispatch({ type: 'local_error', action, message: outcome.message });
        break;
    }
  }

  /**
   * Ask the kernel to free `names` (with `dry`: the preview only) and apply
   * its answer where the Free was opened; after a real free, read `who`
   * again. Not while another `free` waits for its answer.
   */
  async free(
    names: readonly string[],
    dry: boolean,
    origin: FreeOrigin
  ): Promise<void> {
    const ctx = this._ctx;
    const kernel = ctx.kernel;
    if (!kernel || names.length === 0 || freeInFlight(ctx.state.process.free)) {
      return;
    }
    const generation = ctx.generation;
    const args = { names: [...names], dry };
    ctx.dispatch({ type: 'free_sent', names, dry, origin });
    const outcome = await ctx.request('free', args, this._freeTimeoutMs);
    if (generation !== ctx.generation || kernel !== ctx.kernel) {
      return;
    }
    switch (outcome.kind) {
      case 'reply':
        ctx.dispatch({
          type: 'reply',
          action: 'free',
          reply: outcome.reply,
          args
        });
        if (outcome.reply.status === 'ok' && !dry) {
          // What was let go leaves the table.
          this._on.whoChanged();
        }
        break;
      case 'timeout':
      case 'stale':
        ctx.dispatch({ type: 'free_failed', code: 'timeout', message: '' });
        break;
      case 'error':
        ctx.dispatch({
          type: 'free_failed',
          code: 'local',
          message: outcome.message
        });
        break;
    }
  }
}
