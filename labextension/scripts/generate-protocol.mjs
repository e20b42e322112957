/**
 * The panel's protocol types, generated from the kernel's JSON Schema
 * (jupyter_gpumem/protocol/schema.json, the one source of the protocol).
 *
 *   node scripts/generate-protocol.mjs          # write src/protocol/schema.generated.ts
 *   node scripts/generate-protocol.mjs --check  # exit 1 when that file is stale
 *
 * The build runs it first; test/schemaGenerated.spec.ts fails when the
 * committed file differs from what the schema gives. Covers the keywords the
 * schema uses: type (one or a list), const, enum, properties, required,
 * additionalProperties, items, prefixItems, oneOf, anyOf, $ref.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
export const SCHEMA = path.join(
  HERE,
  '..',
  '..',
  'jupyter_gpumem',
  'protocol',
  'schema.json'
);
export const OUTPUT = path.join(
  HERE,
  '..',
  'src',
  'protocol',
  'schema.generated.ts'
);

/** The TypeScript name of each $def (interfaces start with I). */
const NAMES = {
  sample: 'ISample',
  device: 'IDevice',
  limit: 'ILimit',
  stream: 'IStreamState',
  cell_marker: 'ICellMarker',
  line_share: 'ILineShare',
  tracking: 'ITracking',
  who_row: 'IWhoRow',
  who_report: 'IWhoReport',
  fix: 'IFix',
  postmortem: 'IPostMortem',
  segment_map: 'ISegmentMap',
  history_cell: 'IHistoryCell',
  error: 'IErrorBody'
};
/** $defs that become other declarations (or none). */
const SPECIAL = new Set(['request', 'reply', 'results', 'comm_message']);

function typeName(def) {
  if (NAMES[def]) {
    return NAMES[def];
  }
  return (
    'I' +
    def
      .split('_')
      .map(p => p[0].toUpperCase() + p.slice(1))
      .join('')
  );
}

function literal(value) {
  return JSON.stringify(value).replace(/"/g, "'");
}

/** A TypeScript type for one schema node. */
function tsType(node) {
  if (node === true || node === undefined) {
    return 'unknown';
  }
  if (node.$ref) {
    const def = node.$ref.replace('#/$defs/', '');
    return typeName(def);
  }
  if (node.const !== undefined) {
    return literal(node.const);
  }
  if (node.enum) {
    return node.enum.map(literal).join(' | ');
  }
  const alternatives = node.oneOf ?? node.anyOf;
  if (alternatives) {
    return alternatives.map(a => parenthesized(tsType(a))).join(' | ');
  }
  const kinds = Array.isArray(node.type) ? node.type : [node.type];
  if (node.type === undefined) {
    return 'unknown';
  }
  return kinds.map(kind => parenthesized(typeOfKind(kind, node))).join(' | ');
}

function parenthesized(text) {
  return /\s\|\s/.test(text) && !text.startsWith('{') ? `(${text})` : text;
}

function typeOfKind(kind, node) {
  switch (kind) {
    case 'integer':
    case 'number':
      return 'number';
    case 'string':
      return 'string';
    case 'boolean':
      return 'boolean';
    case 'null':
      return 'null';
    case 'array':
      if (node.prefixItems) {
        return `[${node.prefixItems.map(tsType).join(', ')}]`;
      }
      return `${parenthesized(tsType(node.items))}[]`;
    case 'object':
      return objectType(node);
    default:
      throw new Error(`the schema uses an unknown type ${kind}`);
  }
}

function objectType(node) {
  const props = node.properties ?? {};
  const names = Object.keys(props);
  if (names.length === 0) {
    if (node.additionalProperties === false) {
      return 'Record<string, never>';
    }
    if (
      typeof node.additionalProperties === 'object' &&
      node.additionalProperties !== null
    ) {
      return `Record<string, ${tsType(node.additionalProperties)}>`;
    }
    return 'Record<string, unknown>';
  }
  const required = new Set(node.required ?? []);
  const fields = names.map(name => {
    const optional = required.has(name) ? '' : '?';
    return `${name}${optional}: ${tsType(props[name])};`;
  });
  return `{ ${fields.join(' ')} }`;
}

/** The generated module's text (before formatting). */
export function generateSource(schema) {
  const defs = schema.$defs;
  const out = [
    '/**',
    ' * Generated from jupyter_gpumem/protocol/schema.json by',
    ' * scripts/generate-protocol.mjs: do not edit. `npm run generate` writes it',
    ' * again; a test fails when it is stale.',
    ' */',
    '',
    `export const PROTOCOL_VERSION = ${schema.protocol_version};`,
    '',
    '/** Additions an older peer can ignore raise the revision. */',
    `export const PROTOCOL_REVISION = ${schema.protocol_revision};`,
    '',
    `export const REQUEST_MSG_TYPE = ${literal(schema.request_msg_type)};`,
    '',
    `export const REPLY_MSG_TYPE = ${literal(schema.reply_msg_type)};`,
    '',
    `export const COMM_TARGET = ${literal(schema.comm_target)};`,
    '',
    "/** Every action the kernel answers, in the schema's order. */",
    `export const ACTIONS = [${Object.keys(schema.actions)
      .map(literal)
      .join(', ')}] as const;`,
    '',
    'export type Action = (typeof ACTIONS)[number];',
    '',
    '/** The error codes of an error reply. */',
    `export const ERROR_CODES = [${defs.error.properties.code.enum
      .map(literal)
      .join(', ')}] as const;`,
    '',
    'export type ErrorCode = (typeof ERROR_CODES)[number];',
    ''
  ];
  for (const [def, node] of Object.entries(defs)) {
    if (SPECIAL.has(def)) {
      continue;
    }
    out.push(`export interface ${typeName(def)} ${objectType(node)}`, '');
  }
  out.push("/** Each action's arguments. */");
  out.push('export interface IActionArgs {');
  for (const [action, node] of Object.entries(schema.actions)) {
    out.push(`  ${action}: ${objectType(node)};`);
  }
  out.push('}', '');
  out.push("/** Each action's result (the `result` of an ok reply). */");
  out.push('export interface IActionResults {');
  for (const [action, node] of Object.entries(defs.results)) {
    out.push(`  ${action}: ${tsType(node)};`);
  }
  out.push('}', '');
  out.push('/** What the kernel pushes on the comm. */');
  out.push(`export type CommMessage = ${tsType(defs.comm_message)};`, '');
  return out.join('\n');
}

/** The generated module, formatted as the project's prettier formats it. */
export async function generate(schemaPath = SCHEMA) {
  const schema = JSON.parse(fs.readFileSync(schemaPath, 'utf-8'));
  const prettier = await import('prettier');
  const options = (await prettier.resolveConfig(OUTPUT)) ?? {};
  return prettier.format(generateSource(schema), {
    ...options,
    parser: 'typescript'
  });
}

async function main(argv) {
  const text = await generate();
  if (argv.includes('--check')) {
    const current = fs.existsSync(OUTPUT)
      ? fs.readFileSync(OUTPUT, 'utf-8')
      : '';
    if (current !== text) {
      console.error(
        `${path.relative(process.cwd(), OUTPUT)} is stale: run npm run generate`
      );
      process.exit(1);
    }
    return;
  }
  fs.mkdirSync(path.dirname(OUTPUT), { recursive: true });
  fs.writeFileSync(OUTPUT, text);
  console.log(`wrote ${path.relative(process.cwd(), OUTPUT)}`);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  await main(process.argv.slice(2));
}
