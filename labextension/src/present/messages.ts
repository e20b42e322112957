/**
 * Words for states, results and disabled controls. Pure: the translator is
 * passed in.
 */
import { formatBytes, formatPercent } from './format';
import { IDevice } from '../protocol';
import {
  freeInFlight,
  IActionError,
  IGpuMemState,
  Notice,
  ReadingView,
  PanelStatus,
  UserAction
} from '../state';
import { ITrans } from './trans';

export interface IStatusText {
  title: string;
  detail: string;
}

/**
 * The panel's message for a state; null when the state shows figures only.
 */
export function statusText(
  status: PanelStatus,
  trans: ITrans
): IStatusText | null {
  switch (status.kind) {
    case 'no_kernel':
      return {
        title: trans.__('No kernel'),
        detail: trans.__('Open a notebook or a console with a Python kernel.')
      };
    case 'loading':
      return {
        title: trans.__('Connecting to the kernel…'),
        detail: ''
      };
    case 'not_loaded':
      return {
        title: trans.__('The gpumem extension is not loaded in this kernel'),
        detail: trans.__(
          'Attach runs %1 in the kernel.',
          '%load_ext jupyter_gpumem'
        )
      };
    case 'incompatible':
      return {
        title: trans.__(
          "The kernel's gpumem extension does not speak this panel's protocol"
        ),
        detail: status.message
      };
    case 'restarting':
      return { title: trans.__('Kernel restarting…'), detail: '' };
    case 'dead':
      return {
        title: trans.__('Kernel is dead'),
        detail: trans.__('Restart the kernel to see its GPU memory.')
      };
    case 'no_torch':
      return {
        title: trans.__('torch is not imported yet'),
        detail: status.sample.message
      };
    case 'cpu_only':
      return {
        title: trans.__('This torch is a CPU-only build'),
        detail: status.sample.message
      };
    case 'no_gpu':
      return {
        title: trans.__('No GPU'),
        detail: status.sample.message
      };
    case 'not_initialized':
      return {
        title: trans.__('CUDA not initialised: showing NVML figures only'),
        detail: status.sample.message
      };
    case 'ok':
      return null;
    default:
      return null;
  }
}

/**
 * Label of a device: "GPU 0".
 */
export function deviceLabel(index: number, trans: ITrans): string {
  return trans.__('GPU %1', index);
}

/** The bytes released per device index, in total and per device. */
function releasedText(released: Record<string, number>, trans: ITrans): string {
  const entries = Object.entries(released).sort(
    ([a], [b]) => Number(a) - Number(b)
  );
  const total = entries.reduce((sum, [, bytes]) => sum + bytes, 0);
  if (total <= 0) {
    return trans.__('Nothing to release: the cache held no free blocks.');
  }
  if (entries.length === 1) {
    return trans.__('Released %1 to the driver', formatBytes(total));
  }
  const parts = entries
    .map(
      ([index, bytes]) =>
        `${deviceLabel(Number(index), trans)}: ${formatBytes(bytes)}`
    )
    .join(', ');
  return trans.__('Released %1 to the driver (%2)', formatBytes(total), parts);
}

/** The traceback's frames dropped, and the bytes that freed per device. */
function tracebackReleasedText(
  frames: number,
  freedBytes: Record<string, number>,
  trans: ITrans
): string {
  if (frames <= 0) {
    return trans.__('No traceback was kept: nothing to release.');
  }
  const entries = Object.entries(freedBytes).sort(
    ([a], [b]) => Number(a) - Number(b)
  );
  const total = entries.reduce((sum, [, bytes]) => sum + bytes, 0);
  if (total <= 0) {
    return trans._n(
      'Released the traceback (%1 frame): no GPU memory freed',
      'Released the traceback (%1 frames): no GPU memory freed',
      frames
    );
  }
  const freed =
    entries.length === 1
      ? formatBytes(total)
      : trans.__(
          '%1 (%2)',
          formatBytes(total),
          entries
            .map(
              ([index, bytes]) =>
                `${deviceLabel(Number(index), trans)}: ${formatBytes(bytes)}`
            )
            .join(', ')
        );
  return trans._n(
    'Released the traceback (%1 frame): %2 freed',
    'Released the traceback (%1 frames): %2 freed',
    frames,
    freed
  );
}

/**
 * Words for the outcome of an action.
 */
export function noticeText(notice: Notice, trans: ITrans): string {
  switch (notice.kind) {
    case 'released':
      return releasedText(notice.released, trans);
    case 'caching':
      if (notice.requested === notice.caching) {
        return notice.caching
          ? trans.__('Caching is on: freed blocks stay with PyTorch for reuse.')
          : trans.__(
              'Caching is off: each allocation goes to the driver; allocator figures no longer count new allocations.'
            );
      }
      return notice.caching
        ? trans.__('Caching is still on: this kernel could not switch it off.')
        : trans.__('Caching is still off: this kernel could not switch it on.');
    case 'peak_reset':
      return notice.device === null
        ? trans.__('Peak reset to the current allocation')
        : trans.__(
            'Peak of %1 reset to the current allocation',
            deviceLabel(notice.device, trans)
          );
    case 'limit':
      if (notice.limit === null) {
        return notice.device === null
          ? trans.__('Cap removed')
          : trans.__('Cap removed on %1', deviceLabel(notice.device, trans));
      }
      return trans.__(
        'Capped %1 at %2 (%3 of the device)',
        notice.device === null
          ? trans.__('the GPUs')
          : deviceLabel(notice.device, trans),
        formatBytes(notice.limit.bytes),
        formatPercent(notice.limit.fraction)
      );
    case 'attached':
      return trans.__('Loaded jupyter_gpumem in the kernel');
    case 'tracking':
      if (notice.message) {
        // The kernel's words say the special cases (torch not imported yet,
        // the user's own recording).
        return capitalize(notice.message);
      }
      if (notice.requested === notice.tracking) {
        return notice.tracking
          ? trans.__('Allocation tracking is on')
          : trans.__('Allocation tracking is off');
      }
      return notice.tracking
        ? trans.__('Allocation tracking is still on')
        : trans.__('Allocation tracking is still off');
    case 'traceback_released':
      return tracebackReleasedText(notice.frames, notice.freed, trans);
    default:
      return '';
  }
}

function capitalize(text: string): string {
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/**
 * Name of an action in messages.
 */
export function actionLabel(action: string, trans: ITrans): string {
  switch (action) {
    case 'attach':
      return trans.__('Attach');
    case 'empty_cache':
      return trans.__('Empty cache');
    case 'set_caching':
      return trans.__('Switching caching');
    case 'reset_peak':
      return trans.__('Reset peak');
    case 'set_limit':
      return trans.__('Set cap');
    case 'subscribe':
      return trans.__('Live updates');
    case 'who':
      return trans.__('Who holds it');
    case 'track':
      return trans.__('Allocation tracking');
    case 'release_traceback':
      return trans.__('Release traceback');
    case 'free':
      return trans.__('Free');
    case 'segments':
      return trans.__('Segments');
    case 'history':
      return trans.__('History');
    case 'scroll_to_cell':
      return trans.__('Go to cell');
    case 'hello':
    case 'sample':
      return trans.__('Reading the kernel');
    default:
      return action;
  }
}

/**
 * Words for a refused or failed action, with the kernel's reason.
 */
export function errorText(error: IActionError, trans: ITrans): string {
  const label = actionLabel(error.action, trans);
  switch (error.code) {
    case 'refused':
      return trans.__('%1 refused: %2', label, error.message);
    case 'timeout':
      return trans.__('%1: the kernel did not answer in time.', label);
    case 'local':
      return error.message;
    case 'busy':
      if (error.action === 'attach') {
        return trans.__('Wait for the running cell to finish, then attach.');
      }
      // The kernel reads the namespace only between cells.
      return trans.__('%1: busy, available when the cell ends.', label);
    case 'not_found':
      if (error.action === 'scroll_to_cell') {
        return trans.__(
          'Cell [%1] is not in the notebook any more (re-run or deleted).',
          error.message
        );
      }
      return trans.__('%1: not found.', label);
    case 'unknown_action':
      return trans.__(
        "%1: this kernel's jupyter_gpumem is older than the panel (upgrade it and restart the kernel).",
        label
      );
    case 'no_answer':
      return trans.__(
        'The kernel loaded jupyter_gpumem, but it does not answer the panel: is its version older than the panel?'
      );
    default:
      return trans.__('%1 failed: %2', label, error.message);
  }
}

/**
 * Whether a control can be used now, and why not.
 */
export interface IAvailability {
  enabled: boolean;
  reason: string;
}

const ENABLED: IAvailability = { enabled: true, reason: '' };

function disabled(reason: string): IAvailability {
  return { enabled: false, reason };
}

function initializedDevices(state: IGpuMemState): IDevice[] {
  const sample = state.process.sample;
  return sample ? sample.devices.filter(d => d.initialized) : [];
}

/**
 * Availability of an action for the whole kernel (device omitted) or for one
 * device.
 */
export function availability(
  state: IGpuMemState,
  action: UserAction | 'who' | 'free' | ReadingView,
  trans: ITrans,
  device?: IDevice
): IAvailability {
  const kind = state.status.kind;
  if (action === 'attach') {
    if (kind !== 'not_loaded') {
      return disabled(trans.__('The extension is loaded already'));
    }
    if (state.process.pending !== null) {
      return disabled(trans.__('Waiting for the kernel…'));
    }
    if (state.process.busy) {
      return disabled(trans.__('Wait for the running cell to finish'));
    }
    return ENABLED;
  }
  if (kind !== 'ok' && kind !== 'not_initialized') {
    const text = statusText(state.status, trans);
    return disabled(text ? text.title : trans.__('Not available now'));
  }
  if (state.actions.length > 0 && !state.actions.includes(action)) {
    return disabled(
      trans.__("This kernel's jupyter_gpumem does not offer this action")
    );
  }
  if (action === 'who') {
    // A reading, not an action: the other actions do not wait for it.
    return state.process.who.status === 'loading'
      ? disabled(trans.__('Reading who holds the memory…'))
      : ENABLED;
  }
  if (action === 'free') {
    // One Free at a time; the other actions do not wait for it.
    return freeInFlight(state.process.free)
      ? disabled(trans.__('Waiting for the kernel to answer…'))
      : ENABLED;
  }
  if (action === 'segments' || action === 'history') {
    return state.process.readings[action].status === 'loading'
      ? disabled(trans.__('Reading…'))
      : ENABLED;
  }
  if (state.process.pending !== null) {
    return disabled(trans.__('Waiting for the kernel to answer…'));
  }
  switch (action) {
    case 'empty_cache':
    case 'reset_peak': {
      const devices = device
        ? [device].filter(d => d.initialized)
        : initializedDevices(state);
      if (devices.length === 0) {
        return disabled(
          trans.__(
            'CUDA is not initialised in this kernel: the allocator holds nothing'
          )
        );
      }
      return ENABLED;
    }
    case 'set_caching': {
      if (!state.process.sample || state.process.sample.caching === null) {
        return disabled(
          trans.__('The caching state is unknown for this kernel')
        );
      }
      if (initializedDevices(state).length === 0) {
        return disabled(trans.__('CUDA is not initialised in this kernel'));
      }
      return ENABLED;
    }
    case 'set_limit': {
      if (!device) {
        return initializedDevices(state).length > 0
          ? ENABLED
          : disabled(trans.__('CUDA is not initialised in this kernel'));
      }
      if (!device.initialized) {
        return disabled(
          trans.__(
            'CUDA is not initialised on %1: setting a cap would create a context',
            deviceLabel(device.index, trans)
          )
        );
      }
      return ENABLED;
    }
    default:
      return ENABLED;
  }
}
