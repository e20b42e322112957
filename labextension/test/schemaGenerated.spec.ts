/**
 * The panel's protocol types are generated from the kernel's schema: the
 * committed file is what the generator gives for today's schema.
 */
import * as fs from 'fs';
import { describe, expect, it } from 'vitest';

import { generate, OUTPUT } from '../scripts/generate-protocol.mjs';

describe('schema.generated.ts', () => {
  it('is what the schema gives (else: npm run generate)', async () => {
    const expected: string = await generate();
    expect(fs.readFileSync(OUTPUT, 'utf-8')).toBe(expected);
  });

  it('says it is generated and names every action of the schema', async () => {
    const text = fs.readFileSync(OUTPUT, 'utf-8');
    expect(text).toContain('do not edit');
    const schema = JSON.parse(
      fs.readFileSync('../jupyter_gpumem/protocol/schema.json', 'utf-8')
    );
    for (const action of Object.keys(schema.actions)) {
      expect(text).toContain(`  ${action}: `);
    }
  });
});
