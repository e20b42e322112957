/**
 * The panel's layers, bottom first. A source file may import its own layer and
 * the layers below it, never one above; every relative import counts (type-only
 * imports and re-exports too). README.md's Layout says what each layer holds.
 */
import { readdirSync, readFileSync } from 'fs';
import { dirname, join, normalize, relative } from 'path';
import { describe, expect, it } from 'vitest';

const SRC = join(__dirname, '..', 'src');

/** Layer name and the paths under src/ it owns (a folder ends with '/'). */
const LAYERS: readonly (readonly [string, readonly string[]])[] = [
  ['protocol', ['protocol/']],
  ['state', ['state/']],
  ['present', ['present/']],
  ['kernel', ['kernel/', 'server/']],
  ['model', ['model.ts', 'settings.ts']],
  ['views', ['views/']],
  ['lab', ['lab/', 'tokens.ts']],
  ['index', ['index.ts']]
];

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap(entry => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) {
      return sources(path);
    }
    return /\.tsx?$/.test(entry.name) ? [relative(SRC, path)] : [];
  });
}

const FILES = sources(SRC).map(f => f.split('\\').join('/'));

function rank(file: string): number {
  const index = LAYERS.findIndex(([, paths]) =>
    paths.some(p => (p.endsWith('/') ? file.startsWith(p) : file === p))
  );
  if (index < 0) {
    throw new Error(`${file} is in no layer: add it to LAYERS`);
  }
  return index;
}

/** The source files under src/ that `file` imports (relative imports only). */
function importsOf(file: string): string[] {
  const text = readFileSync(join(SRC, file), 'utf-8');
  const found: string[] = [];
  const pattern = /(?:\bfrom|\bimport)\s*\(?\s*['"](\.{1,2}\/[^'"]*)['"]/g;
  for (const match of text.matchAll(pattern)) {
    const target = normalize(join(dirname(file), match[1]))
      .split('\\')
      .join('/');
    const resolved = [
      `${target}.ts`,
      `${target}.tsx`,
      `${target}/index.ts`,
      target
    ].find(candidate => FILES.includes(candidate));
    if (resolved === undefined) {
      throw new Error(`${file} imports ${match[1]}, which is not under src/`);
    }
    found.push(resolved);
  }
  return found;
}

function upwardImports(): string[] {
  const upward: string[] = [];
  for (const file of FILES) {
    for (const target of importsOf(file)) {
      if (rank(target) > rank(file)) {
        upward.push(`${file} -> ${target}`);
      }
    }
  }
  return upward;
}

describe('the layers of labextension/src', () => {
  it('put every source file in a layer', () => {
    expect(FILES.length).toBeGreaterThan(50);
    for (const file of FILES) {
      expect(() => rank(file)).not.toThrow();
    }
  });

  it('have no import that runs up', () => {
    expect(upwardImports()).toEqual([]);
  });

  it('see the imports the check is about', () => {
    expect(importsOf('lab/panel.tsx')).toContain('model.ts');
    expect(importsOf('state/index.ts')).toContain('state/types.ts');
    expect(rank('views/frame/header.tsx')).toBeGreaterThan(rank('model.ts'));
  });
});
