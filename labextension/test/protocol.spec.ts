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
  IChildProcess,
  IDevice,
  IFix,
  IForecast,
  IFreeDevice,
  IFreeHolder,
  IFreeLetGo,
  IFreeReport,
  IFreeResult,
  IHelloResult,
  IHistoryCell,
  IHistoryCellDevice,
  IHistoryResult,
  ILimit,
  ILineShare,
  IOtherProcess,
  IPostMortem,
  IReleaseTracebackResult,
  ISample,
  ISegment,
  ISegmentMap,
  ISegmentsResult,
  ISegmentsWorker,
  ISegmentSummary,
  IStreamState,
  ITrackResult,
  ITracking,
  IWhoDevice,
  IWhoReport,
  IWhoResult,
  IWhoRow,
  IWorker,
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
  error: null,
  children: []
};
const child: Required<IChildProcess> = { pid: 1, name: '', used: 0 };
const sample: Required<ISample> = {
  time: 0,
  state: 'ok',
  message: '',
  torch_version: null,
  host_rss: null,
  caching: null,
  devices: [],
  workers: [],
  replay: {
    gpu: 'NVIDIA H200',
    torch_version: null,
    recorded: null,
    description: ''
  }
};
const worker: Required<IWorker> = {
  pid: 1,
  rank: null,
  host: 'h',
  status: 'running',
  started_in_cell: true,
  age: 0,
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
  postmortems: [],
  forecasts: []
};
const forecast: Required<IForecast> = {
  device: 0,
  worker: null,
  bytes_per_cell: 1,
  cells_left: 1,
  seconds_left: null,
  limit: 2,
  limit_kind: 'cap',
  allocated: 1,
  cells: 3,
  first_cell: null,
  who: null
};
const whoRow: Required<IWhoRow> = {
  key: 'a',
  detail: 'tensor',
  bytes: 0,
  blocks: 0,
  example: 'a',
  kind: 'owner',
  site: ''
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
  command: '',
  first_step: false,
  shortfall: null,
  free_names: []
};
const otherProcess: Required<IOtherProcess> = { pid: 1, name: '', bytes: 0 };
const postmortem: Required<IPostMortem> = {
  execution_count: 1,
  time: 0,
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
  fixes: [],
  need: null,
  need_full: null,
  room: null,
  hint: ''
};
const tracking: Required<ITracking> = { active: false, wanted: false };
const hello: Required<IHelloResult> = {
  protocol: 1,
  revision: 6,
  tracking,
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
const track: Required<ITrackResult> = { tracking, message: '' };
const summary: Required<ISegmentSummary> = {
  segments: 0,
  reserved: 0,
  allocated: 0,
  cached_free: 0,
  releasable: 0,
  pieces: 0,
  pieces_bytes: 0,
  largest_free_block: 0,
  fragmentation: 0
};
const segment: Required<ISegment> = {
  address: 0,
  size: 0,
  pool: 'large',
  stream: 0,
  expandable: false,
  blocks: [[0, 512, 'allocated', -1]]
};
const segmentMap: Required<ISegmentMap> = {
  device: 0,
  summary,
  segments: [],
  labels: [],
  omitted: 0,
  omitted_bytes: 0,
  tracking: false
};
const segmentsWorker: Required<ISegmentsWorker> = {
  pid: 4242,
  rank: 1,
  host: 'gpu-node',
  label: 'rank 1 (pid 4242)',
  note: '',
  trimmed: false
};
const segments: Required<ISegmentsResult> = {
  devices: [],
  worker: segmentsWorker
};
const historyDevice: Required<IHistoryCellDevice> = {
  index: 0,
  allocated: 0,
  allocated_delta: 0,
  reserved: 0,
  reserved_delta: 0,
  peak_allocated: 0,
  peak_above_start: 0,
  kept_at: null,
  ooms: 0,
  worker: null,
  oom: ''
};
const historyCell: Required<IHistoryCell> = {
  execution_count: 1,
  time: 0,
  first_line: '',
  wall_time: 0,
  failed: false,
  devices: []
};
const history: Required<IHistoryResult> = { cells: [] };
const released: Required<IReleaseTracebackResult> = { frames: 0, freed: {} };
const letGo: Required<IFreeLetGo> = {
  holder: 'model',
  action: 'delete',
  why: '',
  bytes: 0,
  code: 'del model'
};
const freeHolder: Required<IFreeHolder> = {
  holder: '',
  bytes: 0,
  example: '',
  why: '',
  fix: ''
};
const freeDevice: Required<IFreeDevice> = {
  device: 0,
  held: 0,
  expected_freed: 0,
  expected_returned: 0,
  cached_free: 0,
  freed: null,
  returned: null,
  still_held: null
};
const freeReport: Required<IFreeReport> = {
  names: ['model'],
  let_go: [letGo],
  kept: [freeHolder],
  devices: [freeDevice],
  done: false,
  still: [],
  notes: [],
  elapsed_ms: 0
};
const freed: Required<IFreeResult> = { report: freeReport, sample };

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
    expect(sorted(Object.keys(worker))).toEqual(props('worker'));
    expect(sorted(Object.keys(sample.replay))).toEqual(props('replay'));
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
    expect(sorted(Object.keys(forecast))).toEqual(props('forecast'));
    expect(forecast.limit_kind).toBe(
      schema.$defs.forecast.properties.limit_kind.enum[0]
    );
    expect(sorted(Object.keys(child))).toEqual(
      sorted(
        Object.keys(schema.$defs.device.properties.children.items.properties)
      )
    );
  });

  it('has the fields of the segment map and the history (revision 5)', () => {
    expect(sorted(Object.keys(segmentMap))).toEqual(props('segment_map'));
    // revision 12: a worker process's own map
    expect(sorted(Object.keys(segmentsWorker))).toEqual(
      props('segments_worker')
    );
    expect(sorted(Object.keys(summary))).toEqual(
      sorted(
        Object.keys(schema.$defs.segment_map.properties.summary.properties)
      )
    );
    const segmentSchema = schema.$defs.segment_map.properties.segments.items;
    expect(sorted(Object.keys(segment))).toEqual(
      sorted(Object.keys(segmentSchema.properties))
    );
    const blockItems = segmentSchema.properties.blocks.items.prefixItems;
    expect(blockItems).toHaveLength(segment.blocks[0].length);
    const blockKinds: ISegment['blocks'][number][2][] = [
      'allocated',
      'pending',
      'piece',
      'cached'
    ];
    expect(sorted(blockKinds)).toEqual(sorted(blockItems[2].enum));
    expect(sorted(Object.keys(historyCell))).toEqual(props('history_cell'));
    expect(sorted(Object.keys(historyDevice))).toEqual(
      sorted(
        Object.keys(
          schema.$defs.history_cell.properties.devices.items.properties
        )
      )
    );
    expect(sorted(Object.keys(tracking))).toEqual(props('tracking'));
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
    expect(sorted(Object.keys(segments))).toEqual(result('segments'));
    expect(sorted(Object.keys(history))).toEqual(result('history'));
    expect(sorted(Object.keys(freed))).toEqual(result('free'));
  });

  it('has the fields of the free report (revision 13)', () => {
    expect(sorted(Object.keys(freeReport))).toEqual(props('free_report'));
    expect(sorted(Object.keys(letGo))).toEqual(props('free_let_go'));
    expect(sorted(Object.keys(freeHolder))).toEqual(props('free_holder'));
    expect(sorted(Object.keys(freeDevice))).toEqual(props('free_device'));
    const actions: IFreeLetGo['action'][] = [
      'delete',
      'forget',
      'release',
      'detach',
      'unhook',
      'teardown'
    ];
    expect(sorted(actions)).toEqual(
      sorted(schema.$defs.free_let_go.properties.action.enum)
    );
  });

  it('uses only the kinds the schema allows', () => {
    const kinds = (name: string) => schema.$defs[name].properties.kind.enum;
    const rowKinds: IWhoRow['kind'][] = [
      'owner',
      'site',
      'cell',
      'unreachable',
      'untracked',
      'rest'
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
