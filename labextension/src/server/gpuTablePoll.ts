/**
 * When the On this GPU tab reads the server's table again: every
 * `GPU_TABLE_POLL_MS` while the panel is shown and the browser tab is not
 * hidden (lumino's Poll watches the document's visibility), never while a read
 * is unanswered (a slow server, a Refresh). No DOM of its own.
 */
import { Poll } from '@lumino/polling';

/** How often the tab reads again while the panel is visible. */
export const GPU_TABLE_POLL_MS = 5000;

export interface IGpuTablePollOptions {
  /** Read the table (the tab's own read, which Refresh calls too). */
  read: () => Promise<void>;
  /** The panel is shown. */
  visible: () => boolean;
  /** Reads sent and not answered yet. */
  inFlight: () => number;
}

/**
 * Read every `GPU_TABLE_POLL_MS`, the first time one interval from now (the
 * tab reads once itself when it opens); dispose it when the tab closes.
 */
export function pollGpuTable(options: IGpuTablePollOptions): Poll {
  const poll = new Poll({
    name: 'jupyter-gpumem:gpu-table',
    auto: false,
    factory: async () => {
      if (options.inFlight() === 0) {
        await options.read();
      }
    },
    frequency: { interval: GPU_TABLE_POLL_MS, backoff: false },
    // Stand by while the panel is hidden, or the browser tab is: a tick then
    // reads nothing and the next comes one interval later.
    standby: () => (options.visible() ? 'when-hidden' : true),
    linger: 0
  });
  void poll.schedule({ interval: GPU_TABLE_POLL_MS, phase: 'started' });
  return poll;
}

export { stopPoll } from '../kernel/context';
