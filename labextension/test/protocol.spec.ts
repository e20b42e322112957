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
  COMM_TARGET,
  ICellMarker,
  IDevice,
  ILimit,
  ISample,
  IStreamState,
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
const cell: Required<ICellMarker> = {
  execution_count: null,
  time: 0,
  wall_time: 0,
  failed: false,
  first_line: '',
  devices: []
};

describe('protocol mirror', () => {
  it('names the same version, message types and comm target', () => {
    expect(PROTOCOL_VERSION).toBe(schema.protocol_version);
    expect(REQUEST_MSG_TYPE).toBe(schema.request_msg_type);
    expect(REPLY_MSG_TYPE).toBe(schema.reply_msg_type);
    expect(COMM_TARGET).toBe(schema.comm_target);
  });

  it('knows exactly the actions the kernel accepts', () => {
    expect(sorted(ACTIONS)).toEqual(sorted(Object.keys(schema.actions)));
  });

  it('has the fields the schema has', () => {
    expect(sorted(Object.keys(device))).toEqual(props('device'));
    expect(sorted(Object.keys(sample))).toEqual(props('sample'));
    expect(sorted(Object.keys(stream))).toEqual(props('stream'));
    expect(sorted(Object.keys(limit))).toEqual(props('limit'));
    expect(sorted(Object.keys(cell))).toEqual(props('cell_marker'));
  });

  it('uses only the states and backends the schema allows', () => {
    expect(schema.$defs.sample.properties.state.enum).toContain(sample.state);
    expect(schema.$defs.device.properties.backend.enum).toContain(
      device.backend
    );
  });
});
