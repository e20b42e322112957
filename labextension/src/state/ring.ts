/**
 * Ordering and bounded-history helpers for the pushed stream.
 */

/**
 * Whether a comm message with sequence number `seq` should be applied after
 * `last` was: the kernel numbers messages on the comm one by one, and a message
 * arriving with a number not above the last applied one is a duplicate or came
 * out of order. Gaps (a lost message) are accepted.
 */
export function acceptSeq(last: number | null, seq: number): boolean {
  if (!Number.isInteger(seq)) {
    return false;
  }
  return last === null || seq > last;
}

/**
 * Anything that carries a unix time in seconds.
 */
export interface ITimed {
  time: number;
}

/**
 * Limits of a bounded history: entries older than `maxAgeS` seconds before the
 * newest one are dropped, and at most `maxLength` entries are kept.
 */
export interface IBounds {
  maxAgeS: number;
  maxLength: number;
}

/**
 * Append an entry to a time-ordered history and drop what falls out of the
 * bounds. Returns a new array; the input is not changed. An entry older than
 * the newest one is inserted at its place in time.
 */
export function pushBounded<T extends ITimed>(
  items: readonly T[],
  item: T,
  bounds: IBounds
): T[] {
  const next = items.slice();
  let at = next.length;
  while (at > 0 && next[at - 1].time > item.time) {
    at -= 1;
  }
  next.splice(at, 0, item);
  return trimBounded(next, bounds);
}

/**
 * Drop the entries of a time-ordered history that fall out of the bounds.
 * Returns the same array when nothing was dropped.
 */
export function trimBounded<T extends ITimed>(
  items: readonly T[],
  bounds: IBounds,
  now?: number
): T[] {
  if (items.length === 0) {
    return items as T[];
  }
  const newest = Math.max(now ?? -Infinity, items[items.length - 1].time);
  const oldest = newest - bounds.maxAgeS;
  let start = 0;
  while (start < items.length && items[start].time < oldest) {
    start += 1;
  }
  start = Math.max(start, items.length - Math.max(0, bounds.maxLength));
  return start === 0 ? (items as T[]) : items.slice(start);
}
