/**
 * The "On this GPU" tab for each state of its reading, and the shutdown of
 * another notebook's idle kernel (asked first).
 */
import * as React from 'react';
import { describe, expect, it, vi } from 'vitest';

import { IKernelRow } from '../src/server/gpuRows';
import { IGpuTable } from '../src/server/gpuTable';
import { IConfirmation, IServerApi } from '../src/server/serverApi';
import { plainTrans } from '../src/present/trans';
import {
  GpuTableView,
  IGpuTableReading
} from '../src/views/onThisGpu/gpuTableView';
import {
  confirmAndShutDown,
  INITIAL_READING,
  OnThisGpu
} from '../src/views/onThisGpu/onThisGpu';
import { TABS } from '../src/views/tabs';
import {
  EVAL,
  foreignTable,
  reportedTable,
  GiB,
  gpuDevice,
  gpuTable,
  noNvmlTable,
  serverKernel,
  TRAIN
} from './gpuTableFixtures';
import { byClass, Child, findAll, INode, render, text } from './render';

const trans = plainTrans as any;

function reading(overrides: Partial<IGpuTableReading> = {}): IGpuTableReading {
  return {
    ...INITIAL_READING,
    table: gpuTable(),
    fetchedAt: Date.UTC(2026, 10, 22, 13, 12, 1),
    ...overrides
  };
}

function view(
  r: IGpuTableReading,
  options: {
    followed?: string | null;
    onShutDown?: (row: IKernelRow) => void;
    onRefresh?: () => void;
    connected?: boolean;
  } = {}
): Child[] {
  return render(
    React.createElement(GpuTableView, {
      reading: r,
      connected: options.connected ?? true,
      followedKernelId:
        options.followed === undefined ? EVAL : options.followed,
      trans,
      onRefresh: options.onRefresh ?? vi.fn(),
      onShutDown: options.onShutDown ?? vi.fn()
    })
  );
}

function kernelRow(nodes: Child[], kernelId: string): INode {
  const rows = findAll(
    nodes,
    n => n.type === 'tr' && n.props['data-kernel-id'] === kernelId
  );
  expect(rows).toHaveLength(1);
  return rows[0];
}

function cell(row: INode, name: string): string {
  return text(byClass(row, name));
}

function buttons(nodes: Child[] | Child, label: RegExp): INode[] {
  return findAll(
    nodes,
    n => n.type === 'button' && label.test(n.props['aria-label'] ?? '')
  );
}

function fakeServer(answer: boolean) {
  const questions: IConfirmation[] = [];
  const server: IServerApi = {
    settings: {} as any,
    confirm: vi.fn(async (q: IConfirmation) => {
      questions.push(q);
      return answer;
    }),
    shutdownKernel: vi.fn(async () => undefined)
  };
  return { server, questions };
}

describe('the On this GPU tab', () => {
  it('is the last tab', () => {
    const last = TABS[TABS.length - 1];
    expect([last.id, last.label(trans)]).toEqual(['gpu', 'On this GPU']);
    expect(last.view).toBe(OnThisGpu);
  });

  it("lists each GPU's notebooks and processes with memory and state", () => {
    const nodes = view(reading());
    const [device] = byClass(nodes, 'jp-GpuMem-gpuDevice');
    expect(text(byClass(device, 'jp-GpuMem-deviceTitle'))).toBe(
      'GPU 0 NVIDIA H200'
    );
    expect(text(byClass(device, 'jp-GpuMem-gpuUsage'))).toBe(
      '12.0 GiB of 140 GiB used'
    );
    const rows = findAll(
      device,
      n => n.type === 'tr' && 'data-kind' in n.props
    );
    expect(rows.map(r => r.props['data-kind'])).toEqual([
      'kernel',
      'kernel',
      'child',
      'other'
    ]);

    const evalRow = kernelRow(nodes, EVAL);
    expect(cell(evalRow, 'jp-GpuMem-gpuName')).toBe(
      'eval.ipynb this notebook busy · kernel, PID 4300'
    );
    expect(evalRow.props.className).toContain('jp-mod-this');
    expect(cell(evalRow, 'jp-GpuMem-gpuBytes')).toBe('5.00 GiB');
    expect(cell(evalRow, 'jp-GpuMem-gpuState')).toBe('busy');
    expect(buttons(evalRow, /^Shut down/)).toHaveLength(0);

    const train = kernelRow(nodes, TRAIN);
    expect(cell(train, 'jp-GpuMem-gpuLabel')).toBe('train.ipynb');
    expect(train.props['data-bytes']).toBe(3 * GiB);
    expect(cell(train, 'jp-GpuMem-gpuBytes')).toBe('3.00 GiB');
    expect(cell(train, 'jp-GpuMem-gpuActivity')).toBe('idle 3 h 12 min');
    expect(
      buttons(train, /^Shut down the kernel of train\.ipynb$/)
    ).toHaveLength(1);

    const [child] = findAll(device, n => n.props['data-kind'] === 'child');
    expect(text(child)).toBe(
      'python3 child of train.ipynb · PID 4243 1.00 GiB'
    );
    const [other] = findAll(device, n => n.props['data-kind'] === 'other');
    expect(text(other)).toBe('python3 other process · PID 777, bob 3.00 GiB');
    expect(text(nodes)).toContain('Read at');
  });

  it('reads again on Refresh', () => {
    const onRefresh = vi.fn();
    const nodes = view(reading(), { onRefresh });
    const [refresh] = buttons(nodes, /^Refresh/);
    refresh.props.onClick();
    expect(onRefresh).toHaveBeenCalledTimes(1);
  });

  it('asks before shutting an idle kernel down, then shuts it down', async () => {
    // GIVEN the tab, following eval.ipynb; train.ipynb's kernel is idle
    const clicked: IKernelRow[] = [];
    const nodes = view(reading(), { onShutDown: row => clicked.push(row) });
    // WHEN its Shut down button is pressed and the user cancels
    buttons(kernelRow(nodes, TRAIN), /^Shut down/)[0].props.onClick();
    expect(clicked.map(r => r.kernelId)).toEqual([TRAIN]);
    const no = fakeServer(false);
    expect(await confirmAndShutDown(no.server, clicked[0], trans)).toBe(
      'cancelled'
    );
    // THEN it asked, and nothing was shut down
    expect(no.questions).toEqual([
      {
        title: 'Shut down the kernel of train.ipynb?',
        body: 'train.ipynb holds 3.00 GiB on this GPU and is idle 3 h 12 min. Shutting its kernel down frees that memory; its variables are lost, the notebook file stays.',
        accept: 'Shut down'
      }
    ]);
    expect(no.server.shutdownKernel).not.toHaveBeenCalled();
    // WHEN the user accepts, THEN exactly that kernel is shut down, after
    // the question
    const yes = fakeServer(true);
    const accepted = vi.fn();
    expect(
      await confirmAndShutDown(yes.server, clicked[0], trans, accepted)
    ).toBe('done');
    expect(yes.server.confirm).toHaveBeenCalledTimes(1);
    expect(accepted).toHaveBeenCalledTimes(1);
    expect(yes.server.shutdownKernel).toHaveBeenCalledWith(TRAIN);
    expect(
      (yes.server.confirm as any).mock.invocationCallOrder[0]
    ).toBeLessThan(
      (yes.server.shutdownKernel as any).mock.invocationCallOrder[0]
    );
  });

  it('offers no shutdown for the followed notebook, busy kernels or other processes', () => {
    const nodes = view(reading(), { followed: TRAIN });
    expect(text(kernelRow(nodes, TRAIN))).toContain('this notebook');
    expect(buttons(nodes, /^Shut down/)).toHaveLength(0);
  });

  it('writes hostile notebook paths and process names as text', () => {
    const path = '<img src=x onerror="alert(1)">&amp;.ipynb';
    const table = gpuTable();
    table.kernels[0] = serverKernel({ path });
    table.devices[0].processes[3].name = '<script>alert(2)</script>';
    const nodes = view(reading({ table }));
    const train = kernelRow(nodes, TRAIN);
    expect(cell(train, 'jp-GpuMem-gpuLabel')).toBe(path);
    expect(byClass(train, 'jp-GpuMem-gpuLabel')[0].children).toEqual([path]);
    expect(buttons(train, /^Shut down/)[0].props['aria-label']).toBe(
      `Shut down the kernel of ${path}`
    );
    expect(text(nodes)).toContain('<script>alert(2)</script>');
    expect(findAll(nodes, n => 'dangerouslySetInnerHTML' in n.props)).toEqual(
      []
    );
  });

  it('says it is reading before the first answer', () => {
    const nodes = view({ ...INITIAL_READING, reading: true });
    expect(findAll(nodes, n => n.props['data-gpu'] === 'loading')).toHaveLength(
      1
    );
    expect(text(byClass(nodes, 'jp-GpuMem-messageTitle'))).toBe(
      'Reading the GPUs of the server…'
    );
  });

  it('shows why a read failed, and keeps the last table dimmed', () => {
    const error = {
      code: 'not_enabled' as const,
      status: 404,
      message: 'Not Found'
    };
    const first = view(reading({ table: null, error }));
    expect(text(byClass(first, 'jp-GpuMem-gpuError'))).toBe(
      'The jupyter_gpumem server extension is not enabled The server has no api/gpumem/devices (404). Enable it with `jupyter server extension enable jupyter_gpumem` and restart the server.'
    );
    expect(byClass(first, 'jp-GpuMem-gpuData')).toHaveLength(0);
    const later = view(
      reading({
        error: { code: 'network', status: null, message: 'Failed to fetch' }
      })
    );
    expect(text(byClass(later, 'jp-GpuMem-gpuError'))).toBe(
      'The server did not answer Failed to fetch'
    );
    expect(byClass(later, 'jp-GpuMem-gpuData')[0].props.className).toContain(
      'jp-mod-stale'
    );
    expect(kernelRow(later, TRAIN)).toBeDefined();
  });

  it('says when NVML is unavailable, with its reason', () => {
    const nodes = view(reading({ table: noNvmlTable() }));
    expect(text(byClass(nodes, 'jp-GpuMem-message'))).toBe(
      'NVML is not available on the server NVML unavailable: the nvidia-ml-py package is not installed'
    );
    expect(byClass(nodes, 'jp-GpuMem-gpuDevice')).toHaveLength(0);
  });

  it('says when the server has no GPU, and when a GPU has no process', () => {
    const none = view(reading({ table: gpuTable({ devices: [] }) }));
    expect(text(byClass(none, 'jp-GpuMem-messageTitle'))).toBe(
      'The server has no GPU'
    );
    const idle = view(
      reading({ table: gpuTable({ devices: [gpuDevice({ processes: [] })] }) })
    );
    expect(text(byClass(idle, 'jp-GpuMem-gpuEmpty'))).toBe(
      'No process uses this GPU'
    );
  });

  it("shows the foreign namespace's note and matches nothing", () => {
    const nodes = view(reading({ table: foreignTable() }), { followed: TRAIN });
    expect(text(byClass(nodes, 'jp-GpuMem-gpuNote'))).toContain(
      "Processes are not matched with notebooks NVML reports processes by PIDs this server can't match"
    );
    expect(findAll(nodes, n => n.props['data-kind'] === 'kernel')).toEqual([]);
    expect(text(nodes)).not.toContain('this notebook');
    expect(
      findAll(nodes, n => n.props['data-kind'] === 'other').map(n => text(n))
    ).toEqual([
      'python other process · PID 91300 2.00 GiB',
      '/usr/bin/python3 other process · PID 91234 1.00 GiB'
    ]);
  });

  it('names reported notebooks and the memory this server cannot see', () => {
    const nodes = view(reading({ table: reportedTable() }), {
      followed: TRAIN
    });
    expect(
      findAll(nodes, n => n.props['data-kind'] === 'reported').map(n => text(n))
    ).toEqual([
      expect.stringMatching(
        /^train\.ipynb this notebook .* · as its kernel reports: PyTorch reserves 5\.00 GiB, 4\.00 GiB allocated 5\.00 GiB$/
      ),
      expect.stringMatching(
        /^eval\.ipynb .* · as its kernel reports: PyTorch reserves 3\.00 GiB, 2\.00 GiB allocated 3\.00 GiB$/
      )
    ]);
    expect(
      text(findAll(nodes, n => n.props['data-kind'] === 'unseen')[0])
    ).toBe(
      'Not visible from this server unseen processes · the driver’s own reservation excluded 4.00 GiB'
    );
  });

  it('shows ended processes and a partial NVML failure', () => {
    const table: IGpuTable = gpuTable({
      nvml: { available: true, driver: '580', error: 'NVML: call failed' },
      devices: [
        gpuDevice({
          processes: [
            {
              pid: 4242,
              name: null,
              user: null,
              used: GiB,
              kernel_id: null,
              role: 'ended'
            }
          ]
        })
      ]
    });
    const nodes = view(reading({ table }));
    expect(text(byClass(nodes, 'jp-GpuMem-gpuWarning'))).toBe(
      'NVML failed in part: NVML: call failed'
    );
    const [ended] = findAll(nodes, n => n.props['data-kind'] === 'ended');
    expect(text(ended)).toBe('PID 4242 ended 1.00 GiB');
  });

  it('says how a shutdown went', () => {
    const shutdown = (status: 'running' | 'done' | 'error') =>
      view(
        reading({
          shutdown: {
            kernelId: TRAIN,
            label: 'train.ipynb',
            status,
            error: status === 'error' ? 'HTTP 500' : null
          }
        })
      );
    expect(text(byClass(shutdown('running'), 'jp-GpuMem-gpuMeta'))).toContain(
      'Shutting down the kernel of train.ipynb…'
    );
    expect(text(byClass(shutdown('done'), 'jp-GpuMem-gpuMeta'))).toContain(
      'Shut down the kernel of train.ipynb'
    );
    expect(text(byClass(shutdown('error'), 'jp-GpuMem-gpuError'))).toBe(
      'Shutting down the kernel of train.ipynb failed HTTP 500'
    );
  });

  it('says so when the panel has no server connection', () => {
    const nodes = view(INITIAL_READING, { connected: false });
    expect(text(byClass(nodes, 'jp-GpuMem-messageTitle'))).toBe(
      'No connection to the Jupyter server'
    );
  });
});
