/**
 * Which kernel process a message comes from. After a restart JupyterLab keeps
 * the same connection and still accepts, for a moment, messages of the process
 * the restart replaced: they carry that process's session id.
 */
import { KernelMessage } from '@jupyterlab/services';

export class ProcessTracker {
  /**
   * Whether the process now running has spoken since the last restart (or no
   * restart was seen): only then is it safe to greet it.
   */
  get hasSpoken(): boolean {
    return this._current !== null || this._stale.size === 0;
  }

  /**
   * Whether a message comes from the kernel process now running, not from one
   * a restart replaced (JupyterLab accepts those for a moment). Remembers the
   * process's session id from its messages.
   */
  accept(msg: KernelMessage.IMessage): boolean {
    const session = msg.header.session;
    if (!session) {
      return true;
    }
    if (this._stale.has(session)) {
      return false;
    }
    this._current = session;
    return true;
  }

  /**
   * The process is gone (restarting, dead): what it still sends is stale.
   */
  replaced(): void {
    if (this._current !== null) {
      this._stale.add(this._current);
      this._current = null;
    }
  }

  /** Another kernel: forget every process. */
  reset(): void {
    this._current = null;
    this._stale.clear();
  }

  /** Session id of the kernel process that answered last. */
  private _current: string | null = null;
  /** Session ids of processes a restart replaced. */
  private _stale = new Set<string>();
}
