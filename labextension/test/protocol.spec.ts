/**
 * The TypeScript mirror of the protocol against jupyter_gpumem/protocol/schema.json:
 * fails when the kernel's schema and these types drift apart. The typed literals below
 * must compile against the interfaces (no missing, no extra keys); their keys are then
 * compared with the schema's properties at run time.
 */
import { readFileSync } from 'fs';
import { join } from 'path';
import { describe, expect, it } from 'vitest';

import {
  ACTIONS,
  BUSY_MESSAGE,
  COMM_TARGET,
  ERROR_CODES,
  ICellMarker,
  ICellMarkerDevice,
  IDevice,
  IFix,
  IHelloResult,
  ILimit,
  ILineShare,
  IOtherProcess,
  IPostMortem,
  IReleaseTracebackResult,
  ISample,
  IStreamState,
  ITrackResult,
  IWhoDevice,
  IWhoReport,
  IWhoResult,
  IWhoRow,
  PROTOCOL_REVISION,
  PROTOCOL_VERSION,
  REPLY_MSG_TYPE,
  REQUEST_MSG_TYPE
} from '../src/protocol';

const schema = JSON.parse(
  readFileSync(
    join(__dirname, '..', '..', 'jupyter_gpumem', 'protocol', 'schema.json'),
    'utf8'
  )
);

const sorted = (keys: Iterable<string>) => [...keys].sort();
const props = (name: string) =>
  sorted(Object.keys(schema.$defs[name].properties));

const device: Required<IDevice> = {
  index: 0,
  name: '',
  backend: 'cuda',
  initialized: true,
  allocated: 0,
  reserved: 0,
  active: 0,
  requested: 0,
  inactive_split: 0,
  peak_allocated: 0,
  peak_reserved: 0,
  device_allocs: 0,
  device_frees: 0,
  alloc_retries: 0,
  ooms: 0,
  total: 0,
  device_used: 0,
  process_used: 0,
  limit: null,
  error: null
};
const sample: Required<ISample> = {
  time: 0,
  state: 'ok',
  message: '',
  torch_version: null,
  host_rss: null,
  caching: null,
  devices: []
};
const stream: Required<IStreamState> = {
  active: true,
  interval_ms: 500,
  heartbeat_ms: 2000,
  comm_id: null,
  lease_s: 60,
  clients: 1
};
const limit: Required<ILimit> = { fraction: 0.5, bytes: 1 };
const lineShare: Required<ILineShare> = {
  line: 1,
  text: '',
  bytes: 0,
  blocks: 0
};
const cellDevice: Required<ICellMarkerDevice> = {
  index: 0,
  allocated_delta: 0,
  reserved_delta: 0,
  peak_allocated: null,
  kept_at: []
};
const cell: Required<ICellMarker> = {
  execution_count: null,
  time: 0,
  wall_time: 0,
  failed: false,
  first_line: '',
  devices: [],
  postmortems: []
};
const whoRow: Required<IWhoRow> = {
  key: 'a',
  detail: 'tensor',
  bytes: 0,
  blocks: 0,
  example: 'a',
  kind: 'owner'
};
const whoReport: Required<IWhoReport> = {
  device: 0,
  by: 'variable',
  allocated: 0,
  explained: 0,
  rows: [],
  tracking: false,
  notes: [],
  outside_allocator: 0,
  elapsed_ms: 0
};
const fix: Required<IFix> = {
  kind: 'fragmentation',
  text: '',
  frees: null,
  fits: null,
  command: ''
};
const otherProcess: Required<IOtherProcess> = { pid: 1, name: '', bytes: 0 };
const postmortem: Required<IPostMortem> = {
  device: 0,
  requested: 0,
  free: 0,
  total: null,
  cap: null,
  reserved: 0,
  allocated: 0,
  cached_free: 0,
  releasable: 0,
  free_pieces: 0,
  free_pieces_bytes: 0,
  largest_free_block: 0,
  outside_torch: null,
  other_processes: [],
  owners: [],
  lines: [],
  fixes: []
};
const hello: Required<IHelloResult> = {
  protocol: 1,
  revision: 2,
  version: '',
  actions: [],
  sample,
  stream
};
const whoDevice: Required<IWhoDevice> = {
  index: 0,
  by_variable: whoReport,
  by_line: null
};
const who: Required<IWhoResult> = {
  devices: [],
  tracking: false,
  postmortems: []
};
const track: Required<ITrackResult> = { tracking: true, message: '' };
const released: Required<IReleaseTracebackResult> = { frames: 0, freed: {} };

const result = (action: string) =>
  sorted(Object.keys(schema.$defs.results[action].properties));

describe('protocol mirror', () => {
  it('names the same version, message types and comm target', () => {
    expect(PROTOCOL_VERSION).toBe(schema.protocol_version);
    expect(REQUEST_MSG_TYPE).toBe(schema.request_msg_type);
    expect(REPLY_MSG_TYPE).toBe(schema.reply_msg_type);
    expect(COMM_TARGET).toBe(schema.comm_target);
  });

  it('names the same revision', () => {
    expect(PROTOCOL_REVISION).toBe(schema.protocol_revision);
  });

  it('knows exactly the actions the kernel accepts', () => {
    expect(sorted(ACTIONS)).toEqual(sorted(Object.keys(schema.actions)));
  });

  it('knows exactly the error codes, and the busy message', () => {
    expect(sorted(ERROR_CODES)).toEqual(
      sorted(schema.$defs.error.properties.code.enum)
    );
    // The kernel's own words for `busy`, as docs/protocol.md quotes them.
    const docs = readFileSync(
      join(__dirname, '..', '..', 'docs', 'protocol.md'),
      'utf8'
    ).replace(/\s+/g, ' ');
    expect(docs).toContain(`("${BUSY_MESSAGE}")`);
  });

  it('has the fields the schema has', () => {
    expect(sorted(Object.keys(device))).toEqual(props('device'));
    expect(sorted(Object.keys(sample))).toEqual(props('sample'));
    expect(sorted(Object.keys(stream))).toEqual(props('stream'));
    expect(sorted(Object.keys(limit))).toEqual(props('limit'));
    expect(sorted(Object.keys(cell))).toEqual(props('cell_marker'));
    expect(sorted(Object.keys(cellDevice))).toEqual(
      sorted(
        Object.keys(
          schema.$defs.cell_marker.properties.devices.items.properties
        )
      )
    );
    expect(sorted(Object.keys(lineShare))).toEqual(props('line_share'));
  });

  it('has the fields of the attribution records (revision 2)', () => {
    expect(sorted(Object.keys(whoRow))).toEqual(props('who_row'));
    expect(sorted(Object.keys(whoReport))).toEqual(props('who_report'));
    expect(sorted(Object.keys(fix))).toEqual(props('fix'));
    expect(sorted(Object.keys(postmortem))).toEqual(props('postmortem'));
    expect(sorted(Object.keys(otherProcess))).toEqual(
      sorted(
        Object.keys(
          schema.$defs.postmortem.properties.other_processes.items.properties
        )
      )
    );
  });

  it('has the fields of the results it reads', () => {
    expect(sorted(Object.keys(hello))).toEqual(result('hello'));
    expect(sorted(Object.keys(who))).toEqual(result('who'));
    expect(sorted(Object.keys(whoDevice))).toEqual(
      sorted(
        Object.keys(
          schema.$defs.results.who.properties.devices.items.properties
        )
      )
    );
    expect(sorted(Object.keys(track))).toEqual(result('track'));
    expect(sorted(Object.keys(released))).toEqual(result('release_traceback'));
  });

  it('uses only the kinds the schema allows', () => {
    const kinds = (name: string) => schema.$defs[name].properties.kind.enum;
    const rowKinds: IWhoRow['kind'][] = [
      'owner',
      'site',
      'cell',
      'unreachable',
      'untracked'
    ];
    expect(sorted(rowKinds)).toEqual(sorted(kinds('who_row')));
    const fixKinds: IFix['kind'][] = [
      'fragmentation',
      'cap',
      'traceback',
      'output_history',
      'graph',
      'other_process',
      'delete',
      'empty_cache',
      'smaller'
    ];
    expect(sorted(fixKinds)).toEqual(sorted(kinds('fix')));
    const bys: IWhoReport['by'][] = ['variable', 'line', 'cell'];
    expect(sorted(bys)).toEqual(
      sorted(schema.$defs.who_report.properties.by.enum)
    );
  });

  it('uses only the states and backends the schema allows', () => {
    expect(schema.$defs.sample.properties.state.enum).toContain(sample.state);
    expect(schema.$defs.device.properties.backend.enum).toContain(
      device.backend
    );
  });
});
