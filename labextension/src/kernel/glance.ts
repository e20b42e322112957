/**
 * A glance at the followed kernel while the panel is hidden: the status bar
 * shows its figures with the panel closed. One `sample` request every
 * `intervalMs`; the replies go to the store as the panel's own do, so that
 * the panel opens on figures and a trend. No DOM.
 *
 * What it costs: one control message each way per interval (5 s from the
 * status bar), answered on the kernel's control thread from the allocator's
 * counters, also while a cell runs (p50 3.2 ms on an H200, README); a tenth
 * of the messages of the panel's own stream at its default 500 ms, which
 * changed a 0.74 ms training step by -0.1 %. Nothing while the panel is shown
 * (its stream feeds the store), nothing while the browser tab is hidden
 * (lumino's Poll stands by). A kernel gets one `hello` when it is followed;
 * one that lacks the extension (no answer in 1.5 s; ipykernel logs the
 * unknown message) is asked again only after a cell that names gpumem
 * (`%load_ext jupyter_gpumem`, say).
 */
import { Poll } from '@lumino/polling';

import { SAMPLE_STATES } from '../state';
import { IClientContext } from './context';

export class GlanceReader {
  constructor(
    private readonly _ctx: IClientContext,
    /** Greet the kernel when it has not answered `hello` yet. */
    private readonly _greet: () => void
  ) {}

  /** A glance interval is set: something wants figures while hidden. */
  get active(): boolean {
    return this._poll !== null;
  }

  /** Read every `ms` while the panel is hidden; null: never. */
  setInterval(ms: number | null): void {
    if (ms === this._intervalMs) {
      return;
    }
    this.dispose();
    this._intervalMs = ms;
    if (ms === null) {
      return;
    }
    this._poll = new Poll({
      name: 'jupyter-gpumem:glance',
      factory: () => this._tick(),
      frequency: { interval: ms, backoff: false },
      // The panel's stream feeds the store while it is shown; the browser
      // tab's visibility is lumino's 'when-hidden'.
      standby: () => (this._ctx.visible ? true : 'when-hidden'),
      linger: 0
    });
  }

  /** A new kernel (or none) is followed: look at it now. */
  kernelChanged(): void {
    this._loadHint = false;
    if (this._poll && this._ctx.kernel) {
      void this._poll.refresh();
    }
  }

  /**
   * A cell was sent to the kernel (its `execute_input`): one that names
   * gpumem may load the extension in a kernel that said it lacks it.
   */
  sawCode(code: unknown): void {
    if (typeof code === 'string' && /gpumem/.test(code)) {
      this._loadHint = true;
    }
  }

  /**
   * Whether to greet again a kernel that lacks the extension, now that a
   * cell ended: only when glancing and the cell may have loaded it. Without
   * the extension every request is an error line in the server's log.
   */
  takeLoadHint(): boolean {
    const hint = this._loadHint && this.active;
    this._loadHint = false;
    return hint;
  }

  dispose(): void {
    if (this._poll) {
      void this._poll.stop();
      this._poll.dispose();
    }
    this._poll = null;
    this._intervalMs = null;
  }

  private async _tick(): Promise<void> {
    const ctx = this._ctx;
    const kernel = ctx.kernel;
    if (ctx.visible || ctx.isDisposed || !kernel) {
      return;
    }
    const kind = ctx.state.status.kind;
    if (kind === 'loading' || kind === 'restarting') {
      // Not greeted yet, or a new process: the client greets it once it can.
      this._greet();
      return;
    }
    if (!SAMPLE_STATES.includes(kind)) {
      // No kernel side, an incompatible one, a dead kernel: nothing to read.
      return;
    }
    const generation = ctx.generation;
    const outcome = await ctx.request('sample', {}, ctx.requestTimeoutMs);
    if (
      generation === ctx.generation &&
      kernel === ctx.kernel &&
      outcome.kind === 'reply'
    ) {
      ctx.dispatch({ type: 'reply', action: 'sample', reply: outcome.reply });
    }
  }

  private _poll: Poll | null = null;
  private _intervalMs: number | null = null;
  /** A cell that names gpumem ran since the last hello. */
  private _loadHint = false;
}
