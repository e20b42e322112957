/**
 * Words for a forecast before the OOM (`CellMarker.forecasts`, protocol
 * revision 10): allocated grew steadily over the last measured cells, and at
 * that rate reaches the limit in about N cells. The kernel side writes the same
 * sentence in its reports (jupyter_gpumem/reporters/_rows.py), sizes as it
 * writes them (formatSize). Pure.
 */
import { ITrans } from './trans';
import { IForecast } from '../protocol';
import { formatSize } from './format';

/** A time span as people say it: "45 s", "12 min", "3.5 h", "2.5 days". */
export function formatDuration(seconds: number): string {
  if (seconds < 59.5) {
    return `${Math.max(1, Math.round(seconds))} s`;
  }
  if (seconds < 3570) {
    return `${Math.round(seconds / 60)} min`;
  }
  if (seconds < 47.95 * 3600) {
    return `${(seconds / 3600).toFixed(1)} h`;
  }
  return `${(seconds / 86400).toFixed(1)} days`;
}

/** "cuda:0", or a worker's device: "rank 1 (pid 4242) cuda:0". */
export function forecastTarget(f: IForecast): string {
  return `${f.worker ? `${f.worker} ` : ''}cuda:${f.device}`;
}

/** "at this rate, out of memory in about 112 cells (about 3.5 h)". */
export function forecastText(f: IForecast, trans: ITrans): string {
  if (f.cells_left <= 0) {
    return trans.__('at this rate, out of memory in the next cell');
  }
  const cells = trans._n(
    'at this rate, out of memory in about %1 cell',
    'at this rate, out of memory in about %1 cells',
    f.cells_left
  );
  return typeof f.seconds_left === 'number'
    ? trans.__('%1 (about %2)', cells, formatDuration(f.seconds_left))
    : cells;
}

/**
 * Where the forecast comes from: the rate, the window, the limit and, with
 * tracking, the line that grows.
 */
export function forecastDetail(f: IForecast, trans: ITrans): string {
  const limit =
    f.limit_kind === 'cap'
      ? trans.__('against the cap of %1', formatSize(f.limit))
      : trans.__(
          "against %1, reserved + the device's free memory",
          formatSize(f.limit)
        );
  const rate = trans.__(
    '%1 a cell over the last %2 cells (%3 allocated), %4',
    (f.bytes_per_cell > 0 ? '+' : '') + formatSize(f.bytes_per_cell),
    f.cells,
    formatSize(f.allocated),
    limit
  );
  return f.who ? trans.__('%1; grows at %2', rate, f.who) : rate;
}
