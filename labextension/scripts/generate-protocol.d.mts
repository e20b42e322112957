/** Types of scripts/generate-protocol.mjs, for the test that imports it. */
export const SCHEMA: string;
export const OUTPUT: string;
export function generateSource(schema: unknown): string;
export function generate(schemaPath?: string): Promise<string>;
