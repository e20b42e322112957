import { readFileSync } from 'fs';
import { join } from 'path';
import { describe, expect, it } from 'vitest';

import { parseCap } from '../src/present/cap';

const GiB = 1024 ** 3;

type CapCase = {
  text: string;
  bytes?: number;
  fraction?: number;
  off?: boolean;
  error?: boolean;
};

// The inputs the kernel's parse_limit (core/actions.py) is tested on too.
const CAP_INPUTS: { cases: CapCase[] } = JSON.parse(
  readFileSync(
    join(__dirname, '..', '..', 'tests', 'fixtures', 'cap_inputs.json'),
    'utf8'
  )
);

describe('parseCap', () => {
  it('reads every shared input as the kernel does', () => {
    for (const c of CAP_INPUTS.cases) {
      const result = parseCap(c.text);
      if (c.error) {
        expect(result.ok, c.text).toBe(false);
        continue;
      }
      const value =
        c.off === true
          ? null
          : c.bytes !== undefined
            ? { bytes: c.bytes }
            : { fraction: c.fraction };
      expect(result, c.text).toEqual({ ok: true, value });
    }
  });

  it('reads sizes with binary and decimal units', () => {
    expect(parseCap('24GiB')).toEqual({ ok: true, value: { bytes: 24 * GiB } });
    expect(parseCap('24 GB')).toEqual({ ok: true, value: { bytes: 24e9 } });
    expect(parseCap('512 MiB')).toEqual({
      ok: true,
      value: { bytes: 512 * 1024 ** 2 }
    });
    expect(parseCap('1.5g')).toEqual({ ok: true, value: { bytes: 1.5e9 } });
    expect(parseCap('2048 B')).toEqual({ ok: true, value: { bytes: 2048 } });
  });

  it('reads fractions and percentages', () => {
    expect(parseCap('0.3')).toEqual({ ok: true, value: { fraction: 0.3 } });
    expect(parseCap('1')).toEqual({ ok: true, value: { fraction: 1 } });
    expect(parseCap('30%')).toEqual({ ok: true, value: { fraction: 0.3 } });
  });

  it('reads "off" as no cap', () => {
    for (const word of ['off', 'OFF', ' none ', 'clear']) {
      expect(parseCap(word)).toEqual({ ok: true, value: null });
    }
  });

  it('refuses an unknown unit with a clear reason', () => {
    const result = parseCap('12XB');
    expect(result.ok).toBe(false);
    expect(!result.ok && result.error).toBe(
      '"XB" is not a unit: use B, KiB, MiB, GiB or TiB.'
    );
  });

  it('refuses a bare number above 1 (bytes or gigabytes?)', () => {
    const result = parseCap('24');
    expect(result.ok).toBe(false);
    expect(!result.ok && result.error).toContain('needs a unit');
  });

  it('refuses garbage, empty input, zero and fractions above 1', () => {
    for (const text of [
      '',
      'lots',
      '1..2 GiB',
      '-1 GiB',
      '0',
      '0 GiB',
      '150%'
    ]) {
      expect(parseCap(text).ok, text).toBe(false);
    }
  });

  it('refuses a cap above the device capacity', () => {
    const result = parseCap('200 GiB', { total: 141 * GiB });
    expect(result.ok).toBe(false);
    expect(!result.ok && result.error).toBe(
      '200 GiB is more than the device has (141 GiB).'
    );
    expect(parseCap('100 GiB', { total: 141 * GiB }).ok).toBe(true);
  });
});
