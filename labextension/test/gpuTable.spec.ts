/**
 * The server's GPU table: from a reply to the rows of the "On this GPU" tab,
 * the request and its errors, and shutting a kernel down through
 * JupyterLab's managers.
 */
import { ServerConnection } from '@jupyterlab/services';
import { describe, expect, it, vi } from 'vitest';

import {
  activityText,
  formatDuration,
  gpuTableView,
  IKernelRow,
  IProcessRow,
  IReportedRow,
  IUnseenRow,
  UNSEEN_MIN,
  kernelActivity
} from '../src/server/gpuRows';
import {
  checkGpuTable,
  fetchGpuTable,
  gpuTableErrorText
} from '../src/server/gpuTable';
import { serverApi, shutdownKernel } from '../src/server/serverApi';
import { plainTrans as trans } from '../src/present/trans';
import {
  EVAL,
  foreignTable,
  reportedTable,
  GiB,
  gpuDevice,
  gpuTable,
  noNvmlTable,
  process,
  serverKernel,
  TIME,
  TRAIN
} from './gpuTableFixtures';

const MIN = 60_000;

describe('gpuTableView', () => {
  it('lists the notebooks and other processes of each GPU, largest first', () => {
    // GIVEN two notebooks (train with a child) and bob's process on GPU 0
    // WHEN the panel follows eval.ipynb
    const view = gpuTableView(gpuTable(), EVAL);
    // THEN
    expect(view.kind).toBe('ok');
    expect(view.note).toBeNull();
    const [device] = view.devices;
    expect([device.index, device.name, device.used, device.total]).toEqual([
      0,
      'NVIDIA H200',
      12 * GiB,
      140 * GiB
    ]);
    expect(
      device.rows.map(r => [
        r.kind,
        r.kind === 'process' ? r.name : r.kind === 'unseen' ? null : r.label,
        r.bytes
      ])
    ).toEqual([
      ['kernel', 'eval.ipynb', 5 * GiB],
      // the kernel (2 GiB) and its child (1 GiB)
      ['kernel', 'train.ipynb', 3 * GiB],
      ['process', 'python3', 3 * GiB]
    ]);
  });

  it('puts children under their kernel and counts their memory for it', () => {
    const train = gpuTableView(gpuTable(), EVAL).devices[0]
      .rows[1] as IKernelRow;
    expect(train.kernelId).toBe(TRAIN);
    expect(train.pid).toBe(4242);
    expect(train.children).toEqual([
      { pid: 4243, name: 'python3', bytes: 1 * GiB }
    ]);
  });

  it('marks the followed kernel "this notebook" and never offers to shut it down', () => {
    const rows = gpuTableView(gpuTable(), TRAIN).devices[0]
      .rows as IKernelRow[];
    const train = rows.find(r => r.kernelId === TRAIN)!;
    expect(train.thisNotebook).toBe(true);
    expect(train.activity.kind).toBe('idle');
    expect(train.canShutDown).toBe(false);
    // Followed by another notebook, the same idle kernel can be shut down.
    const other = gpuTableView(gpuTable(), EVAL).devices[0]
      .rows[1] as IKernelRow;
    expect(other.thisNotebook).toBe(false);
    expect(other.canShutDown).toBe(true);
  });

  it('computes idle time on the server clock; busy kernels are not idle', () => {
    const rows = gpuTableView(gpuTable(), null).devices[0].rows as IKernelRow[];
    const [evalRow, trainRow] = rows;
    expect(trainRow.activity).toEqual({
      kind: 'idle',
      idleMs: (3 * 60 + 12) * MIN
    });
    expect(activityText(trainRow.activity, trans)).toBe('idle 3 h 12 min');
    expect(evalRow.activity).toEqual({ kind: 'busy' });
    expect(activityText(evalRow.activity, trans)).toBe('busy');
    expect(evalRow.canShutDown).toBe(false);
  });

  it('labels a kernel without a session by its kernel name', () => {
    const table = gpuTable();
    table.kernels[0] = serverKernel({ path: null, name: 'julia-1.11' });
    const train = gpuTableView(table, null).devices[0].rows.find(
      r => r.kind === 'kernel' && r.kernelId === TRAIN
    ) as IKernelRow;
    expect(train.label).toBe('julia-1.11');
    expect(train.path).toBeNull();
  });

  it('shows a kernel whose children alone use a GPU, with no PID of its own', () => {
    const table = gpuTable({
      devices: [
        gpuDevice({
          processes: [
            process({ pid: 4243, kernel_id: TRAIN, role: 'child' }),
            process({ pid: 4244, kernel_id: TRAIN, role: 'child', used: 2 })
          ]
        })
      ]
    });
    const [row] = gpuTableView(table, null).devices[0].rows as IKernelRow[];
    expect([row.label, row.pid, row.bytes]).toEqual([
      'train.ipynb',
      null,
      1 * GiB + 2
    ]);
    expect(row.children.map(c => c.pid)).toEqual([4243, 4244]);
  });

  it('shows ended processes as ended, never as a kernel', () => {
    const table = gpuTable({
      devices: [
        gpuDevice({
          processes: [
            process({ pid: 4242, role: 'ended', name: null, user: null })
          ]
        })
      ]
    });
    const [row] = gpuTableView(table, null).devices[0].rows as IProcessRow[];
    expect(row).toEqual({
      kind: 'process',
      pid: 4242,
      name: null,
      user: null,
      bytes: 1 * GiB,
      role: 'ended'
    });
  });

  it('maps nothing in a foreign PID namespace and passes the note on', () => {
    const view = gpuTableView(foreignTable(), TRAIN);
    expect(view.namespace).toBe('foreign');
    expect(view.note).toContain("can't match");
    const rows = view.devices[0].rows;
    expect(rows.every(r => r.kind === 'process' && r.role === 'other')).toBe(
      true
    );
    expect(rows.map(r => (r as IProcessRow).pid)).toEqual([91300, 91234]);
  });

  it('names notebooks from what their kernels report, and the unseen memory', () => {
    const view = gpuTableView(reportedTable(), TRAIN);
    const rows = view.devices[0].rows;
    expect(rows.map(r => [r.kind, r.bytes])).toEqual([
      ['reported', 5 * GiB],
      ['unseen', 4 * GiB],
      ['reported', 3 * GiB],
      ['process', 2 * GiB],
      ['process', 1 * GiB]
    ]);
    const train = rows[0] as IReportedRow;
    expect([train.label, train.allocated, train.thisNotebook]).toEqual([
      'train.ipynb',
      4 * GiB,
      true
    ]);
    expect((rows[1] as IUnseenRow).driverExcluded).toBe(true);
    // processes stay unmatched: nothing is guessed
    expect(rows.filter(r => r.kind === 'kernel')).toEqual([]);
  });

  it('shows no unseen row below a mebibyte, nor one NVML could not tell', () => {
    for (const unseen of [UNSEEN_MIN - 1, null, undefined]) {
      const table = reportedTable();
      table.devices[0].unseen = unseen;
      const kinds = gpuTableView(table, null).devices[0].rows.map(r => r.kind);
      expect(kinds).not.toContain('unseen');
    }
  });

  it('says NVML is unavailable, with its reason', () => {
    const view = gpuTableView(noNvmlTable(), null);
    expect(view.kind).toBe('nvml_unavailable');
    expect(view.nvmlError).toBe(
      'NVML unavailable: the nvidia-ml-py package is not installed'
    );
    expect(view.devices).toEqual([]);
  });

  it('says when NVML answers but lists no GPU', () => {
    const view = gpuTableView(gpuTable({ devices: [] }), null);
    expect(view.kind).toBe('no_gpu');
    expect(view.nvmlError).toBeNull();
  });

  it('keeps a partial NVML failure beside the devices', () => {
    const table = gpuTable({
      nvml: {
        available: true,
        driver: '580',
        error: 'NVML: nvmlDeviceGetComputeRunningProcesses failed'
      },
      devices: [gpuDevice({ processes: [] })]
    });
    const view = gpuTableView(table, null);
    expect(view.kind).toBe('ok');
    expect(view.nvmlError).toContain('failed');
    expect(view.devices[0].rows).toEqual([]);
  });
});

describe('kernel activity', () => {
  const at = (iso: string | null, state = 'idle') =>
    kernelActivity({ execution_state: state, last_activity: iso }, TIME);

  it('reads ISO times with microseconds or an offset', () => {
    expect(at('2026-11-22T13:11:15.500000Z')).toEqual({
      kind: 'idle',
      idleMs: 44_500
    });
    expect(at('2026-11-22T13:02:00+00:00')).toEqual({
      kind: 'idle',
      idleMs: 10 * MIN
    });
  });

  it('is idle without a duration when the time is missing or unreadable', () => {
    expect(at(null)).toEqual({ kind: 'idle', idleMs: null });
    expect(at('yesterday')).toEqual({ kind: 'idle', idleMs: null });
    expect(activityText(at(null), trans)).toBe('idle');
  });

  it('never counts a future activity (clock skew) as negative', () => {
    expect(at('2026-11-22T13:12:05Z')).toEqual({ kind: 'idle', idleMs: 0 });
  });

  it("passes the server's other states on", () => {
    expect(at(null, 'starting')).toEqual({ kind: 'other', state: 'starting' });
    expect(activityText(at(null, 'dead'), trans)).toBe('dead');
  });

  it('writes durations from seconds to days', () => {
    expect(formatDuration(44_999, trans)).toBe('44 s');
    expect(formatDuration(12 * MIN + 59_000, trans)).toBe('12 min');
    expect(formatDuration(3 * 60 * MIN, trans)).toBe('3 h');
    expect(formatDuration((3 * 60 + 12) * MIN, trans)).toBe('3 h 12 min');
    expect(formatDuration((2 * 24 + 4) * 60 * MIN, trans)).toBe('2 d 4 h');
    expect(formatDuration(2 * 24 * 60 * MIN, trans)).toBe('2 d');
  });
});

describe('fetchGpuTable', () => {
  function settings(answer: (url: string) => Promise<Response> | Response) {
    const fetch = vi.fn(async (request: any) =>
      answer(String(request.url ?? request))
    );
    return {
      fetch,
      settings: ServerConnection.makeSettings({
        baseUrl: 'http://127.0.0.1:8888/user/ada/',
        token: 'secret',
        fetch: fetch as any
      })
    };
  }

  const json = (body: unknown, status = 200) =>
    new Response(JSON.stringify(body), {
      status,
      headers: { 'Content-Type': 'application/json' }
    });

  it("reads the table below the server's base URL", async () => {
    const { fetch, settings: s } = settings(() => json(gpuTable()));
    const result = await fetchGpuTable(s);
    expect(result).toEqual({ ok: true, table: gpuTable() });
    const url = new URL(fetch.mock.calls[0][0].url ?? fetch.mock.calls[0][0]);
    expect(url.origin + url.pathname).toBe(
      'http://127.0.0.1:8888/user/ada/api/gpumem/devices'
    );
  });

  it('says 403 is a refusal', async () => {
    const { settings: s } = settings(() => json({ message: 'Forbidden' }, 403));
    const result = await fetchGpuTable(s);
    expect(result).toEqual({
      ok: false,
      error: { code: 'forbidden', status: 403, message: 'Forbidden' }
    });
    if (!result.ok) {
      expect(gpuTableErrorText(result.error, trans).title).toBe(
        'The server refused to list its GPUs (403)'
      );
    }
  });

  it('says how to enable the server extension on 404', async () => {
    const { settings: s } = settings(
      () => new Response('<html>404</html>', { status: 404 })
    );
    const result = await fetchGpuTable(s);
    expect(result.ok).toBe(false);
    if (!result.ok) {
      expect(result.error.code).toBe('not_enabled');
      const text = gpuTableErrorText(result.error, trans);
      expect(text.title).toBe(
        'The jupyter_gpumem server extension is not enabled'
      );
      expect(text.detail).toContain(
        '`jupyter server extension enable jupyter_gpumem` and restart the server'
      );
    }
  });

  it("passes other HTTP errors on with the server's message", async () => {
    const { settings: s } = settings(() =>
      json({ message: 'boom', reason: null }, 500)
    );
    const result = await fetchGpuTable(s);
    expect(result).toEqual({
      ok: false,
      error: { code: 'http', status: 500, message: 'boom' }
    });
    if (!result.ok) {
      expect(gpuTableErrorText(result.error, trans)).toEqual({
        title: 'Reading the GPU table failed (HTTP 500)',
        detail: 'boom'
      });
    }
  });

  it('turns a network failure into a reason', async () => {
    const { settings: s } = settings(() => {
      throw new TypeError('Failed to fetch');
    });
    const result = await fetchGpuTable(s);
    expect(result.ok).toBe(false);
    if (!result.ok) {
      expect(result.error.code).toBe('network');
      expect(result.error.message).toContain('Failed to fetch');
      expect(gpuTableErrorText(result.error, trans).title).toBe(
        'The server did not answer'
      );
    }
  });

  it('refuses a reply that is not JSON, or not the table', async () => {
    const notJson = await fetchGpuTable(
      settings(() => new Response('<html>login</html>', { status: 200 }))
        .settings
    );
    expect(notJson).toEqual({
      ok: false,
      error: {
        code: 'bad_reply',
        status: 200,
        message: 'not JSON: "<html>login</html>"'
      }
    });
    const other = await fetchGpuTable(
      settings(() => json({ version: 2, devices: [] })).settings
    );
    expect(other.ok).toBe(false);
    if (!other.ok) {
      expect(other.error.message).toBe('version 2, expected 1');
      expect(gpuTableErrorText(other.error, trans).detail).toContain(
        'Unexpected reply: version 2, expected 1'
      );
    }
  });
});

describe('checkGpuTable', () => {
  it('accepts every fixture and refuses shapes the view cannot draw', () => {
    for (const table of [gpuTable(), foreignTable(), noNvmlTable()]) {
      expect(checkGpuTable(table)).toBeNull();
    }
    expect(checkGpuTable([])).toBe('not an object');
    const broken = gpuTable();
    (broken.devices[0] as any).processes = null;
    expect(checkGpuTable(broken)).toBe(
      'a device without index, total, used or processes'
    );
    const noPid = gpuTable();
    (noPid.devices[0].processes[0] as any).pid = '4300';
    expect(checkGpuTable(noPid)).toBe('a process without pid or used');
    const noId = gpuTable();
    (noId.kernels[0] as any).id = 7;
    expect(checkGpuTable(noId)).toBe('a kernel without id');
  });
});

describe('shutting a kernel down', () => {
  function services(sessions: { id: string; kernel: { id: string } | null }[]) {
    return {
      serverSettings: ServerConnection.makeSettings({ baseUrl: 'http://x/' }),
      sessions: {
        refreshRunning: vi.fn(async () => undefined),
        running: () => sessions[Symbol.iterator](),
        shutdown: vi.fn(async (_id: string) => undefined)
      },
      kernels: { shutdown: vi.fn(async (_id: string) => undefined) }
    };
  }

  it('shuts down the session whose kernel it is', async () => {
    const s = services([
      { id: 's-eval', kernel: { id: EVAL } },
      { id: 's-train', kernel: { id: TRAIN } }
    ]);
    await shutdownKernel(s as any, TRAIN);
    expect(s.sessions.refreshRunning).toHaveBeenCalled();
    expect(s.sessions.shutdown).toHaveBeenCalledWith('s-train');
    expect(s.kernels.shutdown).not.toHaveBeenCalled();
  });

  it('shuts down the kernel alone when no session has it', async () => {
    const s = services([{ id: 's-none', kernel: null }]);
    const api = serverApi(s as any, async () => true);
    expect(api.settings.baseUrl).toBe('http://x/');
    await api.shutdownKernel(TRAIN);
    expect(s.sessions.shutdown).not.toHaveBeenCalled();
    expect(s.kernels.shutdown).toHaveBeenCalledWith(TRAIN);
  });
});
