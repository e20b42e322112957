/**
 * What the kernel client's collaborators share: the followed kernel and its
 * generation (a new kernel or a restarted process makes a new one: answers of
 * an older generation are dropped), the panel's visibility, the store, and one
 * way to send a request.
 */
import { Poll } from '@lumino/polling';

import { Action } from '../protocol';
import { GpuMemEvent, IGpuMemState } from '../state';
import { ProcessTracker } from './process';
import { RequestOutcome } from './request';
import { IKernelLike } from './types';

export interface IClientContext {
  /** The followed kernel's connection, or null. */
  readonly kernel: IKernelLike | null;
  /** Bumped for each kernel and each process of it. */
  readonly generation: number;
  /** The panel is shown: the stream and the readings run only then. */
  readonly visible: boolean;
  readonly isDisposed: boolean;
  readonly state: IGpuMemState;
  /** Which kernel process is talking; which ones a restart replaced. */
  readonly processes: ProcessTracker;
  /** Time to wait for the reply of an action, ms. */
  readonly requestTimeoutMs: number;
  /** The interval of pushed samples now set, ms. */
  refreshRateMs(): number;
  /** Send an event to the store (and let the collaborators react). */
  dispatch(event: GpuMemEvent): void;
  /** One request to the followed kernel, on the control channel. */
  request(
    action: Action,
    args: Record<string, unknown>,
    timeoutMs: number
  ): Promise<RequestOutcome>;
}

/** How a poll made by `every` behaves besides its interval. */
export interface IEveryOptions {
  /**
   * `'when-hidden'`: stand by while the browser tab is hidden (for what only
   * matters on screen: a tick then runs nothing and the next comes one
   * interval later); `'never'`: keep ticking (a lease renewal, a watchdog).
   */
  standby: Poll.Standby;
  /**
   * A tick that rejects makes the next come later (lumino's backoff, up to
   * 30 s or the interval if longer) until one resolves; false: every
   * interval whatever the outcome.
   */
  backoff: boolean;
}

/**
 * Run `tick` every `ms` (the first time after `ms`, as `setInterval` does)
 * until the poll is stopped; a tick that returns a promise delays the next
 * until it settles. Stop it with `stopPoll`.
 */
export function every(
  name: string,
  ms: number,
  tick: () => void | Promise<unknown>,
  options: IEveryOptions
): Poll {
  const poll = new Poll({
    name: `jupyter-gpumem:${name}`,
    auto: false,
    factory: async () => {
      await tick();
    },
    frequency: { interval: ms, backoff: options.backoff },
    standby: options.standby,
    // Hidden: stand by from the next tick on.
    linger: 0
  });
  // Started with the first tick `ms` from now (an automatic start would tick
  // at once, one timer turn later).
  void poll.schedule({ interval: ms, phase: 'started' });
  return poll;
}

/**
 * Stop and dispose of a poll: disposing alone leaves its pending timer
 * behind.
 */
export function stopPoll(poll: Poll | null): void {
  if (poll && !poll.isDisposed) {
    void poll.stop();
    poll.dispose();
  }
}
