/**
 * Parsing of a memory cap typed by the user, at once, for the panel's feedback.
 *
 * The kernel is the authority: `jupyter_gpumem/core/actions.py` (`parse_limit`
 * for text, `set_limit` for what a cap may be) decides; this reading must agree
 * with it on every input of `tests/fixtures/cap_inputs.json`, which both sides'
 * tests read.
 */
import { formatBytes } from './format';
import { ITrans, plainTrans } from './trans';

/**
 * A cap as the `set_limit` action takes it; null removes the cap.
 */
export type CapValue = { bytes: number } | { fraction: number } | null;

export type CapParse =
  { ok: true; value: CapValue } | { ok: false; error: string };

const OFF_WORDS = new Set(['off', 'none', 'no', 'clear', 'unlimited']);

// As `parse_size` in jupyter_gpumem/units.py: decimal units (K, KB, M, MB, ...)
// are powers of 1000, binary ones (KiB, MiB, ...) powers of 1024.
const UNIT_FACTORS: Record<string, number> = {
  b: 1,
  k: 1000,
  kb: 1000,
  kib: 1024,
  m: 1000 ** 2,
  mb: 1000 ** 2,
  mib: 1024 ** 2,
  g: 1000 ** 3,
  gb: 1000 ** 3,
  gib: 1024 ** 3,
  t: 1000 ** 4,
  tb: 1000 ** 4,
  tib: 1024 ** 4
};

// A number as units.py's NUMBER reads it (no sign, no exponent), then a unit.
const PATTERN = /^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-z%]*)$/i;

const TOO_LARGE = 2 ** 64; // bytes: parse_size refuses this much and more

/**
 * Parse "24GiB", "512M", "0.3", "30%" or "off". "24 GB" (powers of 1000,
 * as a datasheet writes them) is read too; the panel shows it in GiB.
 *
 * A bare number from 0 to 1 is a fraction of the device; a bare number above 1
 * is refused (bytes or gigabytes?): the user must say. When `total` (the
 * device capacity) is known, a cap above it is refused, as the kernel would.
 */
export function parseCap(
  text: string,
  options: { total?: number | null; trans?: ITrans } = {}
): CapParse {
  const trans = options.trans ?? plainTrans;
  const input = text.trim();
  if (input === '') {
    return {
      ok: false,
      error: trans.__('Type a cap such as 24 GiB or 0.3, or "off".')
    };
  }
  if (OFF_WORDS.has(input.toLowerCase())) {
    return { ok: true, value: null };
  }
  const match = PATTERN.exec(input);
  if (!match) {
    return {
      ok: false,
      error: trans.__(
        '"%1" is not a cap: type a size such as 24 GiB, a fraction such as 0.3, or "off".',
        input
      )
    };
  }
  const number = Number(match[1]);
  const unit = match[2].toLowerCase();
  if (unit === '' || unit === '%') {
    const fraction = unit === '%' ? number / 100 : number;
    if (unit === '' && fraction > 1) {
      return {
        ok: false,
        error: trans.__(
          '"%1" needs a unit: type 24 GiB for a size, or a fraction from 0 to 1.',
          input
        )
      };
    }
    if (!(fraction > 0) || fraction > 1) {
      return {
        ok: false,
        error: trans.__(
          'A fraction of the device must be above 0 and at most 1 (%1).',
          '100%'
        )
      };
    }
    return { ok: true, value: { fraction } };
  }
  const factor = UNIT_FACTORS[unit];
  if (factor === undefined) {
    return {
      ok: false,
      error: trans.__(
        '"%1" is not a unit: use B, KiB, MiB, GiB or TiB.',
        match[2]
      )
    };
  }
  const value = number * factor;
  if (value >= TOO_LARGE) {
    return { ok: false, error: trans.__('A cap must be under 16 EiB.') };
  }
  if (!(value >= 1)) {
    return { ok: false, error: trans.__('A cap must be above 0 bytes.') };
  }
  const bytes = Math.floor(value); // whole bytes, as the kernel truncates them
  const total = options.total;
  if (typeof total === 'number' && total > 0 && bytes > total) {
    return {
      ok: false,
      error: trans.__(
        '%1 is more than the device has (%2).',
        formatBytes(bytes),
        formatBytes(total)
      )
    };
  }
  return { ok: true, value: { bytes } };
}
